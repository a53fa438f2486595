// Launch of one norm kernel for a configuration chosen by launch.cu; instantiated once per X type.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "kernel_dispatch.cuh"

namespace onnx_norm {
namespace cuda {

// The shared-memory kernel opts in to the device's whole shared memory once per device, so that
// launches inside a CUDA graph capture (after a first, eager run) make no attribute calls.
constexpr int kMaxDevices = 64;

template <typename TX>
cudaError_t AllowMaxSharedMemory(int device, int bytes) {
  static std::atomic<int> allowed[kMaxDevices] = {};
  const bool known = device >= 0 && device < kMaxDevices;
  if (known && allowed[device].load(std::memory_order_acquire) >= bytes) return cudaSuccess;
  const cudaError_t status =
      cudaFuncSetAttribute(SharedRowKernel<TX, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess && known) allowed[device].store(bytes, std::memory_order_release);
  return status;
}

template <typename TX>
cudaError_t LaunchNormKernel(const NormArgs& args, const KernelConfig& config, cudaStream_t stream) {
  const NormKernel kernel = SelectNormKernel<TX>(config);
  if (kernel == nullptr) return cudaErrorInvalidConfiguration;
  if (config.kind == KernelKind::kSharedRowCached) {
    const cudaError_t status = AllowMaxSharedMemory<TX>(config.device, config.max_shared_bytes);
    if (status != cudaSuccess) return status;
  }
  kernel<<<dim3(config.grid), dim3(static_cast<unsigned>(config.block)), config.shared_bytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace onnx_norm
