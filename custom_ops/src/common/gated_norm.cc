#include "common/gated_norm.h"

#include <vector>

#include "common/float_convert.h"
#include "common/op_registry.h"
#include "cpu/gated_norm_cpu.h"

namespace onnx_norm {
#ifdef ONNX_NORM_WITH_CUDA
namespace cuda {
// Defined in cuda/gated_norm_cuda.cc.
OrtStatusPtr ComputeGatedNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);
}  // namespace cuda
#endif

namespace {

std::string Dims(const std::vector<int64_t>& shape) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out;
}

// group_size (>= 0) and norm_before_gate (0 or 1): GatedRMSNorm's OpSignature::check_attributes.
std::string CheckGatedNormAttributes(const NormAttributes& attrs) {
  if (attrs.op_ints[kGroupSize] < 0) {
    return "attribute group_size=" + std::to_string(attrs.op_ints[kGroupSize]) +
           " must be >= 0 (0: the whole last dim is one group)";
  }
  const int64_t order = attrs.op_ints[kNormBeforeGate];
  if (order != 0 && order != 1) {
    return "attribute norm_before_gate=" + std::to_string(order) + " is not supported: use 0 or 1";
  }
  return {};
}

// GatedRMSNorm's row of the op table: X and Z [..., D], Scale [D] optional; no axis (the last dim, in groups).
const OpRegistrar kGatedRMSNormRow{{{"GatedRMSNorm", true, false, 3, 1, {"X", "Z", "Scale"}, {"Y"}, kInput2,
                                     {"epsilon", "normalized_type", "multiply_type", "output_type", "group_size",
                                      "norm_before_gate"},
                                     &CheckGatedNormAttributes},
                                    &cpu::ComputeGatedNorm,
                                    ONNX_NORM_CUDA_COMPUTE(ComputeGatedNorm)}};

std::string CheckZ(const Ort::ConstValue& z, const std::vector<int64_t>& x_shape, int* type) {
  if (static_cast<const OrtValue*>(z) == nullptr) return "required input Z is missing";
  const auto info = z.GetTensorTypeAndShapeInfo();
  *type = static_cast<int>(info.GetElementType());
  if (!IsFloatType(*type)) return UnsupportedType("Z", *type);
  if (info.GetShape() != x_shape) {
    return "Z has shape [" + Dims(info.GetShape()) + "] but must have X's shape [" + Dims(x_shape) + "]";
  }
  return {};
}

}  // namespace

std::string PrepareGatedNorm(Ort::KernelContext& ctx, const NormAttributes& attrs, GatedNormProblem* g) {
  *g = GatedNormProblem{};
  int x_type = 0;
  std::vector<int64_t> shape;
  std::string error = ReadFloatX(ctx, &x_type, &shape);
  if (!error.empty()) return error;
  if (shape.empty()) return "X must have rank >= 1 (the last dim is normalised)";
  const int64_t dim = shape.back();
  const int64_t size = attrs.op_ints[kGroupSize] == 0 ? dim : attrs.op_ints[kGroupSize];
  if (dim != 0 && dim % size != 0) {
    return "group_size " + std::to_string(size) + " does not divide the last dim of X (" + std::to_string(dim) + ")";
  }
  if (ctx.GetInputCount() < 2) return "required input Z is missing";
  error = CheckZ(ctx.GetInput(1), shape, &g->z_type);
  if (!error.empty()) return error;
  g->z = ctx.GetInput(1).GetTensorRawData();
  if (ctx.GetInputCount() > 2) {
    const Ort::ConstValue scale = ctx.GetInput(2);
    if (static_cast<const OrtValue*>(scale) != nullptr) {
      const auto info = scale.GetTensorTypeAndShapeInfo();
      g->scale_type = static_cast<int>(info.GetElementType());
      if (!IsFloatType(g->scale_type)) return UnsupportedType("Scale", g->scale_type);
      if (static_cast<int64_t>(info.GetElementCount()) != dim) {
        return "Scale has " + std::to_string(info.GetElementCount()) + " elements but the last dim of X is " +
               std::to_string(dim) + ": it must hold one value per element of a row";
      }
      g->scale = scale.GetTensorRawData();
    }
  }
  Ort::UnownedValue y = ctx.GetOutput(0, shape);
  const int y_type = static_cast<int>(y.GetTensorTypeAndShapeInfo().GetElementType());
  if (attrs.output_type != 0 && attrs.output_type != y_type) {
    return std::string("output_type=") + ElemTypeName(attrs.output_type) + " but ONNX Runtime typed Y as " +
           ElemTypeName(y_type) + "; use output_type=0 and a Cast after the node";
  }
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  g->dim = dim;
  g->group_size = size;
  g->gate_after = attrs.op_ints[kNormBeforeGate] == 1;
  NormProblem& p = g->rows;
  p.x = ctx.GetInput(0).GetTensorRawData();
  p.y = y.GetTensorMutableRawData();
  p.rows = size == 0 ? 0 : elements / size;
  p.cols = size;
  p.epsilon = attrs.epsilon;
  p.rms = true;
  p.x_type = x_type;
  p.y_type = y_type;
  p.normalized_type = attrs.normalized_type;
  p.multiply_type = attrs.multiply_type;
  return {};
}

}  // namespace onnx_norm
