// Launch of one norm kernel for a chosen configuration; one translation unit per X type
// (norm_float32.cu, norm_float16.cu, norm_bfloat16.cu) so that builds compile them in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "norm_kernels.cuh"

namespace onnx_norm {
namespace cuda {

enum class KernelKind { kRegisterRow, kSharedRowCached, kSharedRowUncached };

struct KernelConfig {
  KernelKind kind = KernelKind::kRegisterRow;
  int vectors_per_thread = 1;  // kRegisterRow only: 1, 2, 4, or 8 for float32
  int block = 128;
  unsigned grid = 1;
  size_t shared_bytes = 0;  // dynamic shared memory, kSharedRowCached only
};

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
      // Above the 48 KiB default the kernel must opt in; the attribute is per device, and setting it
      // is not a stream operation, so it is allowed during graph capture.
      const cudaError_t status = cudaFuncSetAttribute(SharedRowKernel<TX, true>,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      static_cast<int>(config.shared_bytes));
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
