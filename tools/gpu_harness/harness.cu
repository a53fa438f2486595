// A C entry point to LaunchNorm for tools/gpu_check.py and tools/gpu_harness/modulated_check.py, which call it
// through ctypes (on torch tensors on a GPU, on host memory in the CPU emulator): the product library exports only
// RegisterCustomOps and OnnxNormDescribeOps, and this checks the kernels on a machine without onnxruntime-gpu.
// Built together with custom_ops/src/cuda/*.cu by gpu_check.py. Every op goes through it: mod_scale/mod_shift
// null for the norms, given for the modulated ops; num_groups > 0 for GroupNorm.
#include <cstdint>

#include "launch.h"

extern "C" __attribute__((visibility("default"))) int onnx_norm_harness_launch(
    const void* x, const void* skip, const void* scale, const void* bias, void* y, void* sum, float* mean,
    float* inv_std, int64_t rows, int64_t cols, int64_t scale_size, float epsilon, int rms, int x_type, int scale_type,
    int y_type, int normalized_type, int multiply_type, int device, int clusters, const void* mod_scale,
    const void* mod_shift, int64_t mod_batch, int64_t rows_per_sample, int64_t num_groups, int64_t spatial,
    int activation, void* stream, const char** error) {
  onnx_norm::cuda::NormLaunchParams params;
  params.x = x;
  params.skip = skip;
  params.scale = scale;
  params.bias = bias;
  params.y = y;
  params.sum = sum;
  params.mean = mean;
  params.inv_std = inv_std;
  params.rows = rows;
  params.cols = cols;
  params.scale_size = scale_size;
  params.epsilon = epsilon;
  params.rms = rms != 0;
  params.x_type = x_type;
  params.scale_type = scale_type;
  params.y_type = y_type;
  params.normalized_type = normalized_type;
  params.multiply_type = multiply_type;
  params.device = device;
  params.clusters = clusters != 0;
  params.mod_scale = mod_scale;
  params.mod_shift = mod_shift;
  params.mod_batch = mod_batch;
  params.rows_per_sample = rows_per_sample;
  params.num_groups = num_groups;
  params.spatial = spatial;
  params.activation = activation;
  return onnx_norm::cuda::LaunchNorm(params, stream, error);
}
