// The CPU emulator of the kernels (emulator.cc: one coroutine per CUDA thread, strict shuffles, barriers and
// alignment), extended with the modulated (adaLN) kernel: this file includes emulator.cc whole, so the one
// emulated machine runs both families, and adds the launch entries of modulated_config.cuh. Built by
// tools/gpu_harness/modulated_check.py with the real launcher (custom_ops/src/cuda/modulated_launch.cu).
#include "emulator.cc"  // NOLINT(build/include): the emulator's machinery and CUDA stand-ins, in this unit

#include "modulated_kernels.cuh"

namespace onnx_norm {
namespace cuda {
namespace {

template <typename TX>
cudaError_t EmulateModulated(const ModulatedArgs& args, const ModulatedConfig& config) {
  emu::Machine& m = emu::machine;
  m.failed = false;
  m.error.clear();
  if (config.block < 32 || config.block > kModulatedMaxBlock || config.block % 32 != 0 || config.grid == 0 ||
      args.group < 8 || config.block % args.group != 0) {
    m.failed = true;
    m.error = "block size outside the kernel's launch bounds";
    return cudaErrorInvalidConfiguration;
  }
  const ModulatedKernel kernel = SelectModulatedKernel<TX>(config);
  m.shared_bytes = 0;  // the modulated kernels use static shared memory only
  m.cluster_size = 1;
  m.kernel = [&] { kernel(args); };
  m.last_kernel = std::string("modulated ") + (config.vector ? "vector" : "scalar") +
                  (config.cached ? " registers" : " reread") + " group=" + std::to_string(args.group);
  m.last_launch =
      "grid=" + std::to_string(config.grid) + " block=" + std::to_string(config.block) + " shared=0 cluster=1";
  if (m.plan_only_sms > 0) return cudaSuccess;
  m.grid_dim = emu::Index3{config.grid, 1, 1};
  m.block_dim = emu::Index3{static_cast<unsigned>(config.block), 1, 1};
  for (unsigned b = 0; b < config.grid; ++b) {
    if (!emu::RunCluster(b)) return cudaErrorLaunchFailure;  // a cluster of one block
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchModulatedFloat32(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t) {
  return EmulateModulated<float>(args, config);
}
cudaError_t LaunchModulatedFloat16(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t) {
  return EmulateModulated<__half>(args, config);
}
cudaError_t LaunchModulatedBFloat16(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t) {
  return EmulateModulated<__nv_bfloat16>(args, config);
}

}  // namespace cuda
}  // namespace onnx_norm
