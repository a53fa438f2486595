// How one norm kernel is launched (chosen by launch.cu), and the per-X-type entry points that launch it.
// Host code only: launch.cu includes no device code, so the CPU emulator of the kernels
// (tools/gpu_harness/emulator.cc) can run the launcher's real configuration logic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "norm_args.cuh"

namespace onnx_norm {
namespace cuda {

enum class KernelKind { kRegisterRow, kSharedRowCached, kSharedRowUncached };

struct KernelConfig {
  KernelKind kind = KernelKind::kRegisterRow;
  int vectors_per_thread = 1;  // kRegisterRow only: 1, 2, 4, or 8 for float32
  int group = 8;               // threads per row (NormArgs::group)
  int block = 128;
  unsigned grid = 1;
  size_t shared_bytes = 0;   // dynamic shared memory, kSharedRowCached only
  int max_shared_bytes = 0;  // the device's opt-in limit, kSharedRowCached only
  int device = 0;
};

// Largest vectors_per_thread instantiated for an element size: 32 float32 values per thread.
constexpr int MaxVectorsPerThread(int element_size) { return element_size == 4 ? 8 : 4; }

// One translation unit per X type (norm_float32.cu, norm_float16.cu, norm_bfloat16.cu), so that
// builds compile them in parallel. Each returns the launch status (cudaGetLastError).
cudaError_t LaunchNormFloat32(const NormArgs& args, const KernelConfig& config, cudaStream_t stream);
cudaError_t LaunchNormFloat16(const NormArgs& args, const KernelConfig& config, cudaStream_t stream);
cudaError_t LaunchNormBFloat16(const NormArgs& args, const KernelConfig& config, cudaStream_t stream);

}  // namespace cuda
}  // namespace onnx_norm
