// Interface between the ONNX Runtime op wrappers (compiled by the host compiler, no CUDA headers)
// and the CUDA kernels (compiled by nvcc): one parameter block and one launcher for every op. Semantics of
// every field: docs/ops.md.
#pragma once

#include <cstdint>

namespace onnx_norm {
namespace cuda {

inline constexpr int kMaxLaunchInputs = 2;
inline constexpr int kMaxLaunchInts = 4;

// Element types use ONNXTensorElementDataType values: 1 float, 10 float16, 16 bfloat16; 0 = "not set".
struct NormLaunchParams {
  const void* x = nullptr;      // [rows, cols], x_type
  const void* skip = nullptr;   // [rows, cols], x_type; null unless a Skip op
  const void* scale = nullptr;  // [cols] after broadcasting to the row, scale_type; may be null
  const void* bias = nullptr;   // [cols], scale_type; may be null
  void* y = nullptr;            // [rows, cols], y_type
  void* sum = nullptr;          // [rows, cols], x_type; optional Skip output (X + Skip), may be null
  float* mean = nullptr;        // [rows]; optional, LayerNorm only
  float* inv_std = nullptr;     // [rows]; optional (InvStdDev or InvRMS)
  int64_t rows = 0;
  int64_t cols = 0;
  // Scale/Bias may cover only a suffix of the row (broadcast over the leading normalised dims):
  // element j of a row uses scale[j % scale_size]. scale_size == cols in the common case.
  int64_t scale_size = 0;
  // One Scale/Bias row per row group (docs/ops.md: a per-head [H, D]): row r uses row r % scale_groups of them,
  // scale_size == cols then. 1: one row for every row.
  int64_t scale_groups = 1;
  float epsilon = 1e-5f;
  bool rms = false;
  int x_type = 0;
  int scale_type = 0;           // also Bias's type, and that of a row op's own inputs
  int y_type = 0;
  int normalized_type = 0;
  int multiply_type = 0;
  // The CUDA device that holds the tensors (ONNX Runtime: X's OrtMemoryInfo device id; torch: the
  // tensor's device index). -1: taken from X's pointer attributes. Never asked of the stream, so
  // nothing in a launch is a call that a CUDA graph capture can refuse.
  int device = -1;
  // A row op (row_op_launch.h): the name its launcher registered under, and its own inputs and int parameters in
  // the order its launch header (cuda/<op>_launch.h) gives; null for the norms. Its kernel reads no Skip, Sum or
  // statistics. For the norms, op_ints[0] is epsilon_outside (1: 1 / (sqrt(var) + epsilon)).
  const char* row_op = nullptr;
  const void* op_inputs[kMaxLaunchInputs] = {};
  int64_t op_ints[kMaxLaunchInts] = {};
  // false: never split a row over a thread-block cluster (one block per row, as on a GPU without
  // clusters), for comparing the two on a GPU (tools/gpu_check.py).
  bool clusters = true;
};

// Launches on `stream` (a cudaStream_t), after making `device` current: the norms' kernels, or row_op's launcher. No allocation, no
// synchronisation, nothing on the default stream, no stream query: safe inside CUDA graph capture.
// Sum may be X or Skip itself (in-place); no other output may overlap an input. Returns 0 on success, otherwise a cudaError_t
// value (or -1 for an unsupported type combination); `error` then points at a static message.
int LaunchNorm(const NormLaunchParams& params, void* stream, const char** error);

}  // namespace cuda
}  // namespace onnx_norm
