#include "common/modulation.h"

#include <sstream>
#include <vector>

#include "common/float_convert.h"
#include "common/op_registry.h"
#include "cpu/modulated_cpu.h"

namespace onnx_norm {
#ifdef ONNX_NORM_WITH_CUDA
namespace cuda {
// Defined in cuda/modulated_cuda.cc.
OrtStatusPtr ComputeModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);
}  // namespace cuda
#endif

namespace {

std::string Dims(const std::vector<int64_t>& shape, size_t begin = 0) {
  std::ostringstream out;
  for (size_t i = begin; i < shape.size(); ++i) out << (i > begin ? ", " : "") << shape[i];
  return out.str();
}

float ToFloat(const void* data, int type, int64_t i) {
  if (type == kFloat16) return Half2Float(static_cast<const uint16_t*>(data)[i]);
  if (type == kBFloat16) return BFloat2Float(static_cast<const uint16_t*>(data)[i]);
  return static_cast<const float*>(data)[i];
}

// ModScale or ModShift: [B or 1, *normalised dims] or the same with 1s for X's dims 1 .. axis-1 (docs/ops.md).
std::string CheckModulation(const char* name, const Ort::ConstValue& value, const std::vector<int64_t>& x_shape,
                            size_t axis, int64_t* batch) {
  const std::vector<int64_t> shape = value.GetTensorTypeAndShapeInfo().GetShape();
  const size_t normalized = x_shape.size() - axis;
  bool ok = (shape.size() == normalized + 1 || shape.size() == x_shape.size()) &&
            (shape[0] == 1 || shape[0] == x_shape[0]);
  for (size_t i = 1; ok && i + normalized < shape.size(); ++i) ok = shape[i] == 1;
  for (size_t i = 0; ok && i < normalized; ++i) {
    ok = shape[shape.size() - normalized + i] == x_shape[axis + i];
  }
  if (!ok) {
    return std::string(name) + " has shape [" + Dims(shape) + "] but must be [" + std::to_string(x_shape[0]) +
           " or 1, " + Dims(x_shape, axis) + "], optionally with 1s for the dims between the batch and the " +
           "normalised dims (X has shape [" + Dims(x_shape) + "], normalised from dim " + std::to_string(axis) + ")";
  }
  *batch = shape[0];
  return {};
}

// ModScale/ModShift of a call whose norm part PrepareProblem has validated into `p`.
std::string PrepareModulation(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs,
                              const NormProblem& p, Modulation* m) {
  const size_t scale_index = op.num_inputs - 2;  // ModScale, ModShift come last
  const size_t input_count = ctx.GetInputCount();
  const char* names[2] = {"ModScale", "ModShift"};
  Ort::ConstValue values[2] = {Ort::ConstValue{nullptr}, Ort::ConstValue{nullptr}};
  for (size_t k = 0; k < 2; ++k) {
    if (scale_index + k < input_count) values[k] = ctx.GetInput(scale_index + k);
    if (static_cast<const OrtValue*>(values[k]) == nullptr) return std::string("required input ") + names[k] + " is missing";
  }
  const std::vector<int64_t> x_shape = ctx.GetInput(0).GetTensorTypeAndShapeInfo().GetShape();
  const int64_t rank = static_cast<int64_t>(x_shape.size());
  const size_t axis = static_cast<size_t>(attrs.axis < 0 ? attrs.axis + rank : attrs.axis);  // checked in range
  if (axis == 0) {
    return "axis " + std::to_string(attrs.axis) + " normalises every dim of X (shape [" + Dims(x_shape) +
           "]): a modulated norm needs a batch dim before the normalised dims";
  }
  const int type = static_cast<int>(values[0].GetTensorTypeAndShapeInfo().GetElementType());
  if (!IsFloatType(type)) return UnsupportedType("ModScale", type);
  const int shift_type = static_cast<int>(values[1].GetTensorTypeAndShapeInfo().GetElementType());
  if (shift_type != type) {
    return std::string("ModShift must have the element type of ModScale: ModShift is ") + ElemTypeName(shift_type) +
           ", ModScale is " + ElemTypeName(type);
  }
  if (p.scale_type != 0 && p.scale_type != type) {
    return std::string("ModScale and ModShift must have the element type of Scale/Bias: they are ") +
           ElemTypeName(type) + ", Scale/Bias " + ElemTypeName(p.scale_type);
  }
  if (p.scale_size != 0 && p.scale_size != p.cols) {
    return "Scale/Bias of a modulated norm must have the shape of the normalised dims (" +
           std::to_string(p.cols) + " elements), not a suffix of them (" + std::to_string(p.scale_size) + ")";
  }
  if (p.scale_groups != 1) {
    return "Scale/Bias of a modulated norm must be one row (the normalised dims), not one per row group (" +
           std::to_string(p.scale_groups) + " rows)";
  }
  int64_t batches[2] = {0, 0};
  for (size_t k = 0; k < 2; ++k) {
    std::string error = CheckModulation(names[k], values[k], x_shape, axis, &batches[k]);
    if (!error.empty()) return error;
  }
  if (batches[0] != batches[1]) {
    return "ModScale has " + std::to_string(batches[0]) + " samples but ModShift " + std::to_string(batches[1]) +
           "; both must have X's batch or 1";
  }
  *m = Modulation{};
  m->scale = values[0].GetTensorRawData();
  m->shift = values[1].GetTensorRawData();
  m->type = type;
  m->batch = batches[0];
  m->rows_per_sample = x_shape[0] == 0 ? 0 : p.rows / x_shape[0];
  return {};
}

// The modulated ops' rows of the op table: the norm's inputs, then ModScale and ModShift; Y only.
const OpRegistrar kModulatedLayerNormRow{
    {{"ModulatedLayerNorm", false, false, 5, 1, {"X", "Scale", "Bias", "ModScale", "ModShift"}, {"Y"},
      kInput1 | kInput2},
     &cpu::ComputeModulated,
     ONNX_NORM_CUDA_COMPUTE(ComputeModulated)}};
const OpRegistrar kModulatedRMSNormRow{
    {{"ModulatedRMSNorm", true, false, 4, 1, {"X", "Scale", "ModScale", "ModShift"}, {"Y"}, kInput1},
     &cpu::ComputeModulated,
     ONNX_NORM_CUDA_COMPUTE(ComputeModulated)}};

}  // namespace

void ModulationFactors(const Modulation& m, int64_t cols, int multiply_type, float* factors, float* shifts) {
  const int64_t n = m.batch * cols;
  for (int64_t i = 0; i < n; ++i) {
    factors[i] = RoundTo(1.0f + ToFloat(m.scale, m.type, i), multiply_type);
    shifts[i] = ToFloat(m.shift, m.type, i);
  }
}

std::string PrepareModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs,
                             NormProblem* p, Modulation* m) {
  const std::string error = PrepareProblem(ctx, op, attrs, p);
  return error.empty() ? PrepareModulation(ctx, op, attrs, *p, m) : error;
}

}  // namespace onnx_norm
