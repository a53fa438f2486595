// Launches of the modulated (adaLN) kernel, one entry per X type (modulated_config.cuh).
#include <cuda_runtime.h>

#include "modulated_kernels.cuh"

namespace onnx_norm {
namespace cuda {
namespace {

template <typename TX>
cudaError_t Launch(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t stream) {
  const ModulatedKernel kernel = SelectModulatedKernel<TX>(config);
  kernel<<<dim3(config.grid), dim3(static_cast<unsigned>(config.block)), 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchModulatedFloat32(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t stream) {
  return Launch<float>(args, config, stream);
}
cudaError_t LaunchModulatedFloat16(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t stream) {
  return Launch<__half>(args, config, stream);
}
cudaError_t LaunchModulatedBFloat16(const ModulatedArgs& args, const ModulatedConfig& config, cudaStream_t stream) {
  return Launch<__nv_bfloat16>(args, config, stream);
}

}  // namespace cuda
}  // namespace onnx_norm
