#include "common/group_norm.h"

#include <vector>

#include "common/float_convert.h"
#include "common/op_registry.h"
#include "cpu/group_norm_cpu.h"

namespace onnx_norm {
#ifdef ONNX_NORM_WITH_CUDA
namespace cuda {
// Defined in cuda/group_norm_cuda.cc.
OrtStatusPtr ComputeGroupNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);
}  // namespace cuda
#endif

namespace {

// Scale or Bias: C elements, of a float type; `type` is the type the other one has (0: none yet).
std::string CheckChannelParameter(const char* name, const Ort::ConstValue& value, int64_t channels, int* type) {
  const auto info = value.GetTensorTypeAndShapeInfo();
  const int t = static_cast<int>(info.GetElementType());
  if (!IsFloatType(t)) return UnsupportedType(name, t);
  if (*type != 0 && t != *type) return std::string(name) + " must have the element type of Scale";
  if (static_cast<int64_t>(info.GetElementCount()) != channels) {
    return std::string(name) + " has " + std::to_string(info.GetElementCount()) + " elements but X has " +
           std::to_string(channels) + " channels (dim 1): it must hold one value per channel";
  }
  *type = t;
  return {};
}

// num_groups (required, >= 1) and activation (0 or 1): GroupNorm's OpSignature::check_attributes.
std::string CheckGroupNormAttributes(const NormAttributes& attrs) {
  if ((attrs.op_ints_set & (1u << kNumGroups)) == 0 || attrs.op_ints[kNumGroups] < 1) {
    return "attribute num_groups must be set to the number of groups (>= 1)";
  }
  const int64_t activation = attrs.op_ints[kActivation];
  if (activation != 0 && activation != 1) {
    return "attribute activation=" + std::to_string(activation) + " is not supported: use 0 (none) or 1 (SiLU)";
  }
  return {};
}

// GroupNorm's row of the op table: X [N, C, ...], Scale and Bias [C], both optional; no axis (the groups fix it).
const OpRegistrar kGroupNormRow{{{"GroupNorm", false, false, 3, 1, {"X", "Scale", "Bias"}, {"Y"}, kInput1 | kInput2,
                                  {"epsilon", "normalized_type", "multiply_type", "output_type", "num_groups",
                                   "activation"},
                                  &CheckGroupNormAttributes},
                                 &cpu::ComputeGroupNorm,
                                 ONNX_NORM_CUDA_COMPUTE(ComputeGroupNorm)}};

}  // namespace

std::string PrepareGroupNorm(Ort::KernelContext& ctx, const NormAttributes& attrs, GroupNormProblem* g) {
  *g = GroupNormProblem{};
  int x_type = 0;
  std::vector<int64_t> shape;
  std::string error = ReadFloatX(ctx, &x_type, &shape);
  if (!error.empty()) return error;
  if (shape.size() < 3) return "X must be [N, C, ...] of rank >= 3, got rank " + std::to_string(shape.size());
  const int64_t channels = shape[1];
  const int64_t num_groups = attrs.op_ints[kNumGroups];
  if (channels % num_groups != 0) {
    return "num_groups " + std::to_string(num_groups) + " does not divide the " + std::to_string(channels) +
           " channels of X (dim 1)";
  }
  int64_t spatial = 1;
  for (size_t i = 2; i < shape.size(); ++i) spatial *= shape[i];
  g->channels = channels;
  g->spatial = spatial;
  g->group_channels = channels / num_groups;
  g->activation = static_cast<int>(attrs.op_ints[kActivation]);
  const char* names[2] = {"Scale", "Bias"};
  const void** params[2] = {&g->scale, &g->bias};
  for (size_t k = 0; k < 2; ++k) {
    if (ctx.GetInputCount() <= k + 1) break;
    const Ort::ConstValue value = ctx.GetInput(k + 1);
    if (static_cast<const OrtValue*>(value) == nullptr) continue;
    const std::string error = CheckChannelParameter(names[k], value, channels, &g->scale_type);
    if (!error.empty()) return error;
    *params[k] = value.GetTensorRawData();
  }
  Ort::UnownedValue y = ctx.GetOutput(0, shape);
  const int y_type = static_cast<int>(y.GetTensorTypeAndShapeInfo().GetElementType());
  if (attrs.output_type != 0 && attrs.output_type != y_type) {
    return std::string("output_type=") + ElemTypeName(attrs.output_type) + " but ONNX Runtime typed Y as " +
           ElemTypeName(y_type) + "; use output_type=0 and a Cast after the node";
  }
  NormProblem& p = g->rows;
  p.x = ctx.GetInput(0).GetTensorRawData();
  p.y = y.GetTensorMutableRawData();
  p.rows = shape[0] * num_groups;
  p.cols = g->group_channels * spatial;
  p.epsilon = attrs.epsilon;
  p.x_type = x_type;
  p.y_type = y_type;
  p.normalized_type = attrs.normalized_type;
  p.multiply_type = attrs.multiply_type;
  return {};
}

}  // namespace onnx_norm
