// What the CPU and CUDA wrappers share: op signatures, attribute parsing and the validation of a
// node's inputs, all in one place so that both providers accept and reject exactly the same things
// with the same messages. Semantics: docs/ops.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/ort_api.h"

namespace onnx_norm {

inline constexpr const char* kDomain = "onnx_norm";
inline constexpr int kOpsetVersion = 1;

struct OpSignature {
  const char* name;
  bool rms;
  bool skip;
  size_t num_inputs;   // X, [Skip], Scale, [Bias]
  size_t num_outputs;  // Y, then Mean/InvStdDev, InvRMS or Sum
};

inline constexpr OpSignature kLayerNorm{"LayerNorm", false, false, 3, 3};
inline constexpr OpSignature kRMSNorm{"RMSNorm", true, false, 2, 2};
inline constexpr OpSignature kSkipLayerNorm{"SkipLayerNorm", false, true, 4, 2};
inline constexpr OpSignature kSkipRMSNorm{"SkipRMSNorm", true, true, 3, 2};

struct NormAttributes {
  int64_t axis = -1;
  float epsilon = 1e-5f;
  int normalized_type = 0;
  int multiply_type = 0;
  int output_type = 0;
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
  float epsilon = 1e-5f;
  bool rms = false;
  int x_type = 0;
  int scale_type = 0;
  int y_type = 0;
  int normalized_type = 0;
  int multiply_type = 0;
};

const char* ElemTypeName(int type);

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
