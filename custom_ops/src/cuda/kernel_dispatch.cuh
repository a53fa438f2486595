// Launch of one norm kernel for a chosen configuration; one translation unit per X type
// (norm_float32.cu, norm_float16.cu, norm_bfloat16.cu) so that builds compile them in parallel.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "norm_kernels.cuh"

namespace onnx_norm {
namespace cuda {

enum class KernelKind { kRegisterRow, kSharedRowCached, kSharedRowUncached };

struct KernelConfig {
  KernelKind kind = KernelKind::kRegisterRow;
  int vectors_per_thread = 1;  // kRegisterRow only: 1, 2, 4, or 8 for float32
  int group = 8;  // threads per row (NormArgs::group)
  int block = 128;
  unsigned grid = 1;
  size_t shared_bytes = 0;    // dynamic shared memory, kSharedRowCached only
  int max_shared_bytes = 0;   // the device's opt-in limit, kSharedRowCached only
  int device = 0;
};

// The shared-memory kernel opts in to the device's whole shared memory once per device, so that
// launches inside a CUDA graph capture (after a first, eager run) make no attribute calls.
constexpr int kMaxDevices = 64;

template <typename TX>
cudaError_t AllowMaxSharedMemory(int device, int bytes) {
  static std::atomic<int> allowed[kMaxDevices] = {};
  if (device >= 0 && device < kMaxDevices && allowed[device].load(std::memory_order_acquire) >= bytes) {
    return cudaSuccess;
  }
  const cudaError_t status =
      cudaFuncSetAttribute(SharedRowKernel<TX, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess && device >= 0 && device < kMaxDevices) {
    allowed[device].store(bytes, std::memory_order_release);
  }
  return status;
}

// Largest vectors_per_thread instantiated for an element size: 32 float32 values per thread.
constexpr int MaxVectorsPerThread(int element_size) { return element_size == 4 ? 8 : 4; }

template <typename TX>
cudaError_t LaunchNormKernel(const NormArgs& args, const KernelConfig& config, cudaStream_t stream) {
  const dim3 grid(config.grid);
  const dim3 block(static_cast<unsigned>(config.block));
  switch (config.kind) {
    case KernelKind::kRegisterRow:
      switch (config.vectors_per_thread) {
        case 1:
          RegisterRowKernel<TX, 1><<<grid, block, 0, stream>>>(args);
          break;
        case 2:
          RegisterRowKernel<TX, 2><<<grid, block, 0, stream>>>(args);
          break;
        case 4:
          RegisterRowKernel<TX, 4><<<grid, block, 0, stream>>>(args);
          break;
        case 8:
          if constexpr (MaxVectorsPerThread(sizeof(TX)) >= 8) {
            RegisterRowKernel<TX, 8><<<grid, block, 0, stream>>>(args);
            break;
          }
          return cudaErrorInvalidConfiguration;
        default:
          return cudaErrorInvalidConfiguration;
      }
      break;
    case KernelKind::kSharedRowCached: {
      const cudaError_t status = AllowMaxSharedMemory<TX>(config.device, config.max_shared_bytes);
      if (status != cudaSuccess) return status;
      SharedRowKernel<TX, true><<<grid, block, config.shared_bytes, stream>>>(args);
      break;
    }
    case KernelKind::kSharedRowUncached:
      SharedRowKernel<TX, false><<<grid, block, 0, stream>>>(args);
      break;
  }
  return cudaGetLastError();
}

extern template cudaError_t LaunchNormKernel<float>(const NormArgs&, const KernelConfig&, cudaStream_t);
extern template cudaError_t LaunchNormKernel<__half>(const NormArgs&, const KernelConfig&, cudaStream_t);
extern template cudaError_t LaunchNormKernel<__nv_bfloat16>(const NormArgs&, const KernelConfig&, cudaStream_t);

}  // namespace cuda
}  // namespace onnx_norm
