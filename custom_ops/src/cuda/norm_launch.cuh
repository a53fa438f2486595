// Launch of one kernel, of any op, for a configuration chosen by its launcher: LaunchKernel (kernel_config.cuh),
// instantiated by each op's translation unit after it includes its kernels. The CPU emulator of the kernels
// (tools/gpu_harness/emulator.cc) defines LaunchKernel itself and ONNX_NORM_EMULATED_LAUNCH, which leaves this
// definition out, so that the same translation units instantiate the emulated launch.
#pragma once

#ifndef ONNX_NORM_EMULATED_LAUNCH

#include <cuda_runtime.h>

#include <atomic>

#include "kernel_dispatch.cuh"

namespace onnx_norm {
namespace cuda {

// The shared-memory and cluster kernels opt in to the device's whole shared memory once per device, so
// that launches inside a CUDA graph capture (after a first, eager run) make no attribute calls.
constexpr int kMaxDevices = 64;

template <typename TX, KernelKind kKind, typename Kernel>
cudaError_t AllowMaxSharedMemory(Kernel kernel, int device, int bytes) {
  static std::atomic<int> allowed[kMaxDevices] = {};
  const bool known = device >= 0 && device < kMaxDevices;
  if (known && allowed[device].load(std::memory_order_acquire) >= bytes) return cudaSuccess;
  const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess && known) allowed[device].store(bytes, std::memory_order_release);
  return status;
}

template <int kXType, typename Args>
cudaError_t LaunchKernel(const Args& args, const KernelConfig& config, cudaStream_t stream) {
  using TX = typename ElementOf<kXType>::type;
  const auto kernel = SelectKernel<TX>(config, &args);
  if (kernel == nullptr) return cudaErrorInvalidConfiguration;
  const dim3 grid(config.grid);
  const dim3 block(static_cast<unsigned>(config.block));
  if (config.kind == KernelKind::kSharedRowCached) {
    const cudaError_t status =
        AllowMaxSharedMemory<TX, KernelKind::kSharedRowCached>(kernel, config.device, config.max_shared_bytes);
    if (status != cudaSuccess) return status;
  }
  if (config.kind == KernelKind::kClusterRow) {
    const cudaError_t status =
        AllowMaxSharedMemory<TX, KernelKind::kClusterRow>(kernel, config.device, config.max_shared_bytes);
    if (status != cudaSuccess) return status;
    // The cluster shape is a launch attribute (one kernel serves every cluster size); a stream operation
    // like <<<>>>, so a CUDA graph capture records it as a kernel node with its cluster dimension.
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = static_cast<unsigned>(config.cluster);
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t launch{};
    launch.gridDim = grid;
    launch.blockDim = block;
    launch.dynamicSmemBytes = config.shared_bytes;
    launch.stream = stream;
    launch.attrs = &attribute;
    launch.numAttrs = 1;
    return cudaLaunchKernelEx(&launch, kernel, args);
  }
  kernel<<<grid, block, config.shared_bytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace onnx_norm

#endif  // ONNX_NORM_EMULATED_LAUNCH
