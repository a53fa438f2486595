// Interface between the ONNX Runtime wrapper of the modulated (adaLN) ops (modulated_ops.cc, host compiler, no
// CUDA headers) and their CUDA kernels (modulated_kernels.cuh). Semantics: docs/ops.md.
#pragma once

#include <cstdint>

#include "launch.h"

namespace onnx_norm {
namespace cuda {

struct ModulatedLaunchParams {
  // The norm part, as for LaunchNorm: x, scale, bias, y, rows, cols, scale_size, epsilon, rms, the types and the
  // device. skip, sum, mean and inv_std must be null (the modulated ops have none).
  NormLaunchParams norm;
  const void* mod_scale = nullptr;  // [mod_batch, cols], mod_type
  const void* mod_shift = nullptr;  // [mod_batch, cols], mod_type
  int mod_type = 0;                 // also the type of Scale/Bias when given
  int64_t mod_batch = 0;            // 1, or the number of samples (rows / rows_per_sample)
  int64_t rows_per_sample = 0;      // consecutive rows that share one modulation row
};

// Launches on `stream` (a cudaStream_t); same contract as LaunchNorm (launch.h): no allocation, no
// synchronisation, safe inside CUDA graph capture. Y may not overlap any input. Returns 0, a cudaError_t value,
// or -1 for unsupported types; `error` then points at a static message.
int LaunchModulated(const ModulatedLaunchParams& params, void* stream, const char** error);

}  // namespace cuda
}  // namespace onnx_norm
