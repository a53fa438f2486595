// A C entry point to LaunchNorm for tools/gpu_check.py and tools/gpu_harness/modulated_check.py, which call it
// through ctypes (on torch tensors on a GPU, on host memory in the CPU emulator): the product library exports only
// RegisterCustomOps and OnnxNormDescribeOps, and this checks the kernels on a machine without onnxruntime-gpu.
// Built together with custom_ops/src/cuda/*.cu by gpu_check.py. Every op goes through it: mod_scale/mod_shift
// null for the norms, given for the modulated ops; num_groups > 0 for GroupNorm. Those two row ops' parameters go
// into NormLaunchParams' generic fields as their launch headers say (the kernels' code knows no op by this entry).
#include <cstdint>

#include "group_norm_launch.h"
#include "launch.h"
#include "modulated_launch.h"

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
  namespace cuda = onnx_norm::cuda;
  if (num_groups > 0) {
    params.row_op = cuda::kGroupNormRowOp;
    params.op_ints[cuda::kGroupNormGroups] = num_groups;
    params.op_ints[cuda::kGroupNormSpatial] = spatial;
    params.op_ints[cuda::kGroupNormActivation] = activation;
  } else if (mod_scale != nullptr || mod_shift != nullptr) {
    params.row_op = cuda::kModulatedRowOp;
    params.op_inputs[cuda::kModScaleInput] = mod_scale;
    params.op_inputs[cuda::kModShiftInput] = mod_shift;
    params.op_ints[cuda::kModBatchInt] = mod_batch;
    params.op_ints[cuda::kRowsPerSampleInt] = rows_per_sample;
  }
  return onnx_norm::cuda::LaunchNorm(params, stream, error);
}
