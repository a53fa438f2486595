// What the CPU and CUDA wrappers share: op signatures, attribute parsing and the validation of a
// node's inputs, all in one place so that both providers accept and reject exactly the same things
// with the same messages. Semantics: docs/ops.md.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/ort_api.h"

namespace onnx_norm {

inline constexpr const char* kDomain = "onnx_norm";
inline constexpr int kOpsetVersion = 1;

inline constexpr size_t kMaxInputs = 5;
inline constexpr size_t kMaxOutputs = 3;
inline constexpr size_t kMaxAttributes = 8;
inline constexpr size_t kMaxOpInts = 4;

// The attributes the norms take, in NormAttributes' order (ParseAttributes reads these, and an op's own ones).
inline constexpr const char* kAttributeNames[] = {"axis", "epsilon", "normalized_type", "multiply_type",
                                                  "output_type"};

// The norms' own attribute (common/norm_ops.cc): 1 adds epsilon to the standard deviation, 1 / (sqrt(var) + eps),
// instead of to the variance (the Annotated Transformer's LayerNorm; docs/ops.md).
inline constexpr const char* kEpsilonOutside = "epsilon_outside";

struct NormAttributes;

// One fused op as it is declared to ONNX Runtime (names as in docs/ops.md). Each op's own source file defines its
// row of the op table (common/op_registry.h); tests/test_op_table.py checks the table against onnx_norm/ops/schema.py.
struct OpSignature {
  const char* name;
  bool rms;   // RMSNorm statistic: no mean, no Bias
  bool skip;  // a residual input Skip at index 1 and a Sum output
  size_t num_inputs;
  size_t num_outputs;
  const char* inputs[kMaxInputs];    // X first
  const char* outputs[kMaxOutputs];  // Y first; the others are optional
  unsigned optional_inputs;          // bit i set: input i may be left out (Scale, Bias)
  // The attributes a node of the op may carry (null-terminated), as the Python record lists them. Those that are
  // not kAttributeNames are the op's own int attributes: ParseAttributes reads them into NormAttributes::op_ints,
  // in this order (the op's header names the indices).
  const char* attributes[kMaxAttributes] = {kAttributeNames[0], kAttributeNames[1], kAttributeNames[2],
                                            kAttributeNames[3], kAttributeNames[4]};
  // Checks the op's own attributes once they are read (empty string or an error message); null when it has none.
  // Lives with the op's validation (common/<op>.cc).
  std::string (*check_attributes)(const NormAttributes& attrs) = nullptr;

  constexpr bool OptionalInput(size_t i) const { return ((optional_inputs >> i) & 1u) != 0; }
};

struct NormAttributes {
  int64_t axis = -1;
  float epsilon = 1e-5f;
  int normalized_type = 0;
  int multiply_type = 0;
  int output_type = 0;
  // The op's own int attributes (OpSignature::attributes beyond kAttributeNames), in the order the signature
  // lists them; bit k of op_ints_set: the node sets attribute k (else op_ints[k] is 0).
  int64_t op_ints[kMaxOpInts] = {};
  unsigned op_ints_set = 0;
};

// Everything a kernel needs for one call, validated; pointers into ORT-owned buffers.
struct NormProblem {
  const void* x = nullptr;
  const void* skip = nullptr;
  const void* scale = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
  void* sum = nullptr;
  float* mean = nullptr;
  float* inv_std = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t scale_size = 0;  // elements of Scale (and Bias); element j of a row uses scale[j % scale_size]
  // Rows of Scale (and Bias) per row group (docs/ops.md): a per-head Scale [H, D] of X [B, S, H, D] normalised
  // over D has 4 here and scale_size == cols; row r of X uses Scale row r % scale_groups. 1 for one row.
  int64_t scale_groups = 1;
  float epsilon = 1e-5f;
  bool epsilon_outside = false;  // 1 / (sqrt(var) + epsilon) instead of 1 / sqrt(var + epsilon)
  bool rms = false;
  int x_type = 0;
  int scale_type = 0;
  int y_type = 0;
  int normalized_type = 0;
  int multiply_type = 0;
  // The input stage (CPU): when set, the row normalised is what `input` computes from the row at element `offset`
  // of this problem's X (cols float32 values into `dst`, returning `dst` or a row of its own), instead of X's row.
  // `input_state` is the op's own (its other inputs at this problem's rows). The Skip ops' residual add is the
  // stage Run sets where Skip is given and no other is (cpu/norm_cpu.cc SkipRow); an op with a stage of its own
  // sets it in its own files.
  const float* (*input)(const void* input_state, const NormProblem& p, size_t offset, float* dst) = nullptr;
  const void* input_state = nullptr;
};

// The inverse of the row's standard deviation (or RMS) from its variance (mean square), as `p` says.
inline float InverseRoot(float variance, const NormProblem& p) {
  return p.epsilon_outside ? 1.0f / (std::sqrt(variance) + p.epsilon) : 1.0f / std::sqrt(variance + p.epsilon);
}

// Whether the node sets the op's own attribute `name` to a nonzero value (false when the op has no such attribute).
bool OwnIntSet(const OpSignature& op, const NormAttributes& attrs, const char* name);

// The norms' check of their own attribute (epsilon_outside is 0 or 1).
std::string CheckNormAttributes(const NormAttributes& attrs);

const char* ElemTypeName(int type);

// Whether `type` is one the kernels read: FLOAT, FLOAT16 or BFLOAT16.
bool IsFloatType(int type);

// The error for input `name` of an element type the kernels don't read (one wording for every op).
std::string UnsupportedType(const char* name, int type);

// X of the ops that check their own shapes (those whose Prepare does not go through the row ops' shared one):
// present and of a float type; fills its element type and shape. Returns an empty string or an error message.
std::string ReadFloatX(Ort::KernelContext& ctx, int* type, std::vector<int64_t>* shape);

// An int attribute of the node; false when it is not set.
bool GetIntAttribute(const OrtKernelInfo* info, const char* name, int64_t* value);

// Reads and checks the attributes; returns an empty string or an error message.
std::string ParseAttributes(const OrtKernelInfo* info, const OpSignature& op, NormAttributes* attrs);

// Reads the inputs of one call, checks types and shapes against the attributes, allocates the
// outputs (only those the node asks for) and fills `problem`. Returns an empty string or an error
// message naming the op and the offending input. Throws only Ort::Exception (from the ORT API).
std::string PrepareProblem(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs,
                           NormProblem* problem);

// An OrtStatus for ORT, carrying `message` prefixed with the op name.
OrtStatusPtr MakeError(const OpSignature& op, const std::string& message, OrtErrorCode code = ORT_INVALID_ARGUMENT);

}  // namespace onnx_norm
