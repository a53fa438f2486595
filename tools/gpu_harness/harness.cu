// A C entry point to LaunchNorm for tools/gpu_check.py and tools/gpu_harness/row_op_checks.py, which call it
// through ctypes (on torch tensors on a GPU, on host memory in the CPU emulator): the product library exports only
// RegisterCustomOps and OnnxNormDescribeOps, and this checks the kernels on a machine without onnxruntime-gpu.
// Built together with custom_ops/src/cuda/*.cu by gpu_check.py. Every op goes through it, and it names none: row_op
// null for the norms; for a row op its registered name, with its own inputs and ints in the order of its launch
// header (custom_ops/src/cuda/<op>_launch.h), which the op's check module passes (gpu_build.LaunchArgs).
#include <cstdint>

#include "launch.h"

extern "C" __attribute__((visibility("default"))) int onnx_norm_harness_launch(
    const void* x, const void* skip, const void* scale, const void* bias, void* y, void* sum, float* mean,
    float* inv_std, int64_t rows, int64_t cols, int64_t scale_size, int64_t scale_groups, float epsilon, int rms, int x_type, int scale_type,
    int y_type, int normalized_type, int multiply_type, int device, int clusters, const char* row_op,
    const void* op_input0, const void* op_input1, int64_t op_int0, int64_t op_int1, int64_t op_int2, int64_t op_int3,
    void* stream, const char** error) {
  static_assert(onnx_norm::cuda::kMaxLaunchInputs == 2 && onnx_norm::cuda::kMaxLaunchInts == 4,
                "the entry passes every one of NormLaunchParams' op_inputs and op_ints");
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
  params.scale_groups = scale_groups;
  params.epsilon = epsilon;
  params.rms = rms != 0;
  params.x_type = x_type;
  params.scale_type = scale_type;
  params.y_type = y_type;
  params.normalized_type = normalized_type;
  params.multiply_type = multiply_type;
  params.device = device;
  params.clusters = clusters != 0;
  params.row_op = row_op;
  params.op_inputs[0] = op_input0;
  params.op_inputs[1] = op_input1;
  const int64_t ints[] = {op_int0, op_int1, op_int2, op_int3};
  for (int i = 0; i < 4; ++i) params.op_ints[i] = ints[i];
  return onnx_norm::cuda::LaunchNorm(params, stream, error);
}
