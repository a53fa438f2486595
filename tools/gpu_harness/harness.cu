// A C entry point to LaunchNorm for tools/gpu_check.py, which calls it through ctypes on torch
// tensors: the product library exports only RegisterCustomOps, and this checks the kernels on a
// machine without onnxruntime-gpu. Built together with custom_ops/src/cuda/*.cu by gpu_check.py.
#include <cstdint>

#include "launch.h"

extern "C" __attribute__((visibility("default"))) int onnx_norm_harness_launch(
    const void* x, const void* skip, const void* scale, const void* bias, void* y, void* sum, float* mean,
    float* inv_std, int64_t rows, int64_t cols, int64_t scale_size, float epsilon, int rms, int x_type, int scale_type,
    int y_type, int normalized_type, int multiply_type, int device, int clusters, void* stream,
    const char** error) {
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
  return onnx_norm::cuda::LaunchNorm(params, stream, error);
}
