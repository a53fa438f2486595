// A C entry point to LaunchModulated (custom_ops/src/cuda/modulated_launch.h) for
// tools/gpu_harness/modulated_check.py, which calls it through ctypes: on device memory in a harness built with
// nvcc, on host memory in the CPU emulator (modulated_emulator.cc).
#include <cstdint>

#include "modulated_launch.h"

extern "C" __attribute__((visibility("default"))) int onnx_norm_harness_modulated_launch(
    const void* x, const void* scale, const void* bias, const void* mod_scale, const void* mod_shift, void* y,
    int64_t rows, int64_t cols, int64_t rows_per_sample, int64_t mod_batch, float epsilon, int rms, int x_type,
    int param_type, int y_type, int normalized_type, int multiply_type, int device, void* stream,
    const char** error) {
  onnx_norm::cuda::ModulatedLaunchParams params;
  onnx_norm::cuda::NormLaunchParams& norm = params.norm;
  norm.x = x;
  norm.scale = scale;
  norm.bias = bias;
  norm.y = y;
  norm.rows = rows;
  norm.cols = cols;
  norm.scale_size = scale != nullptr || bias != nullptr ? cols : 0;
  norm.epsilon = epsilon;
  norm.rms = rms != 0;
  norm.x_type = x_type;
  norm.scale_type = param_type;
  norm.y_type = y_type;
  norm.normalized_type = normalized_type;
  norm.multiply_type = multiply_type;
  norm.device = device;
  params.mod_scale = mod_scale;
  params.mod_shift = mod_shift;
  params.mod_type = param_type;
  params.mod_batch = mod_batch;
  params.rows_per_sample = rows_per_sample;
  return onnx_norm::cuda::LaunchModulated(params, stream, error);
}
