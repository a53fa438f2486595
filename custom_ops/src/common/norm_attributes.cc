#include "common/norm_attributes.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "common/float_convert.h"
#include "common/norm_op.h"

namespace onnx_norm {

bool IsFloatType(int type) { return type == kFloat || type == kFloat16 || type == kBFloat16; }

std::string UnsupportedType(const char* name, int type) {
  return std::string(name) + " has element type " + ElemTypeName(type) +
         "; supported types are FLOAT, FLOAT16 and BFLOAT16";
}

std::string ReadFloatX(Ort::KernelContext& ctx, int* type, std::vector<int64_t>* shape) {
  const Ort::ConstValue x = ctx.GetInput(0);
  if (static_cast<const OrtValue*>(x) == nullptr) return "required input X is missing";
  const auto info = x.GetTensorTypeAndShapeInfo();
  *type = static_cast<int>(info.GetElementType());
  *shape = info.GetShape();
  if (!IsFloatType(*type)) return UnsupportedType("X", *type);
  return {};
}

namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

bool GetFloatAttribute(const OrtKernelInfo* info, const char* name, float* value) {
  OrtStatus* status = Ort::GetApi().KernelInfoGetAttribute_float(info, name, value);
  if (status == nullptr) return true;
  Ort::GetApi().ReleaseStatus(status);
  return false;
}

// Checks that Scale or Bias covers the normalised dims: after dropping its leading 1s it must equal a
// suffix of shape(X)[axis:], so that it broadcasts over the leading normalised dims only; or be one row per row
// group: the normalised dims preceded by X's dims just before them (a per-head [H, D] over [B, S, H, D], axis 3),
// `*groups` then being their product (row r of X reads row r % groups).
std::string CheckParameterShape(const char* name, const std::vector<int64_t>& shape,
                                const std::vector<int64_t>& x_shape, size_t axis, int64_t* size, int64_t* groups) {
  size_t first = 0;
  while (first < shape.size() && shape[first] == 1) ++first;
  const size_t kept = shape.size() - first;
  const size_t normalized_rank = x_shape.size() - axis;
  bool ok = kept <= x_shape.size();
  for (size_t i = 0; ok && i < kept; ++i) {
    ok = shape[first + i] == x_shape[x_shape.size() - kept + i];
  }
  if (!ok) {
    std::vector<int64_t> normalized(x_shape.begin() + static_cast<std::ptrdiff_t>(axis), x_shape.end());
    return std::string(name) + " has shape " + ShapeString(shape) + " but must match the normalised dims " +
           ShapeString(normalized) + " of X (shape " + ShapeString(x_shape) + ", axis " + std::to_string(axis) +
           "), or a suffix of them, or be those dims preceded by X's dims just before them (one row per row group)";
  }
  int64_t n = 1;
  int64_t g = 1;
  for (size_t i = first; i < shape.size(); ++i) (i + normalized_rank < shape.size() ? g : n) *= shape[i];
  *size = n;
  *groups = g;
  return {};
}

// The inputs of one call; an index past the node's inputs reads as a missing optional input.
struct Inputs {
  Ort::KernelContext& ctx;
  size_t count;

  Ort::ConstValue operator[](size_t i) const { return i < count ? ctx.GetInput(i) : Ort::ConstValue{nullptr}; }
};

bool Missing(const Ort::ConstValue& value) { return static_cast<const OrtValue*>(value) == nullptr; }

// X: its type, the axis against its rank, and the rows and columns it splits into; starts `p` afresh with them
// (and the attributes' epsilon and rounding types).
std::string ReadX(const Inputs& in, const NormAttributes& attrs, NormProblem* p, std::vector<int64_t>* x_shape,
                  size_t* axis) {
  Ort::ConstValue x = in[0];
  if (Missing(x)) return "required input X is missing";
  const auto x_info = x.GetTensorTypeAndShapeInfo();
  const int x_type = static_cast<int>(x_info.GetElementType());
  *x_shape = x_info.GetShape();
  if (!IsFloatType(x_type)) return UnsupportedType("X", x_type);
  const int64_t rank = static_cast<int64_t>(x_shape->size());
  if (attrs.axis < -rank || attrs.axis >= rank) {
    return "axis " + std::to_string(attrs.axis) + " is out of range for X of rank " + std::to_string(rank) +
           " (shape " + ShapeString(*x_shape) + "); it must be in [" + std::to_string(-rank) + ", " +
           std::to_string(rank - 1) + "]";
  }
  *axis = static_cast<size_t>(attrs.axis < 0 ? attrs.axis + rank : attrs.axis);
  int64_t rows = 1;
  int64_t cols = 1;
  for (size_t i = 0; i < x_shape->size(); ++i) (i < *axis ? rows : cols) *= (*x_shape)[i];
  if (cols == 0 && rows != 0) {
    return "the normalised dims of X (shape " + ShapeString(*x_shape) + ", axis " + std::to_string(attrs.axis) +
           ") have no elements: a row with N = 0 has no mean or variance";
  }
  *p = NormProblem{};
  p->x = x.GetTensorRawData();
  p->rows = rows;
  p->cols = cols;
  p->epsilon = attrs.epsilon;
  p->x_type = x_type;
  p->normalized_type = attrs.normalized_type;
  p->multiply_type = attrs.multiply_type;
  return {};
}

// Skip (input 1): required, with X's type and shape.
std::string ReadSkip(const Inputs& in, const std::vector<int64_t>& x_shape, NormProblem* p) {
  Ort::ConstValue skip = in[1];
  if (Missing(skip)) return "required input Skip is missing";
  const auto info = skip.GetTensorTypeAndShapeInfo();
  const int type = static_cast<int>(info.GetElementType());
  const auto shape = info.GetShape();
  if (type != p->x_type || shape != x_shape) {
    return std::string("Skip must have the type and shape of X: Skip is ") + ElemTypeName(type) +
           ShapeString(shape) + ", X is " + ElemTypeName(p->x_type) + ShapeString(x_shape);
  }
  p->skip = skip.GetTensorRawData();
  return {};
}

// Scale (at scale_index) and, when the op has one, Bias (after it): optional, a float type each (Bias Scale's), and
// covering the same normalised dims.
std::string ReadParameters(const Inputs& in, size_t scale_index, bool has_bias, const std::vector<int64_t>& x_shape,
                           size_t axis, NormProblem* p) {
  int scale_type = 0;
  int64_t scale_size = 0;
  int64_t scale_groups = 1;
  Ort::ConstValue scale = in[scale_index];
  if (!Missing(scale)) {
    const auto info = scale.GetTensorTypeAndShapeInfo();
    scale_type = static_cast<int>(info.GetElementType());
    if (!IsFloatType(scale_type)) return UnsupportedType("Scale", scale_type);
    std::string error = CheckParameterShape("Scale", info.GetShape(), x_shape, axis, &scale_size, &scale_groups);
    if (!error.empty()) return error;
    p->scale = scale.GetTensorRawData();
  }
  Ort::ConstValue bias = has_bias ? in[scale_index + 1] : Ort::ConstValue{nullptr};
  if (!Missing(bias)) {
    const auto info = bias.GetTensorTypeAndShapeInfo();
    const int bias_type = static_cast<int>(info.GetElementType());
    if (!IsFloatType(bias_type)) return UnsupportedType("Bias", bias_type);
    if (scale_type != 0 && bias_type != scale_type) {
      return std::string("Bias must have the element type of Scale: Bias is ") + ElemTypeName(bias_type) +
             ", Scale is " + ElemTypeName(scale_type);
    }
    int64_t bias_size = 0;
    int64_t bias_groups = 1;
    std::string error = CheckParameterShape("Bias", info.GetShape(), x_shape, axis, &bias_size, &bias_groups);
    if (!error.empty()) return error;
    if (scale_size != 0 && (bias_size != scale_size || bias_groups != scale_groups)) {
      return "Bias has " + std::to_string(bias_groups * bias_size) + " elements but Scale has " +
             std::to_string(scale_groups * scale_size) + "; both must cover the same normalised dims (and row groups)";
    }
    scale_type = bias_type;
    scale_size = bias_size;
    scale_groups = bias_groups;
    p->bias = bias.GetTensorRawData();
  }
  p->scale_type = scale_type;
  p->scale_size = scale_size;
  p->scale_groups = scale_groups;
  return {};
}

// Y: ORT allocates it with the type it inferred, which must be a float type and output_type when that is set.
std::string AllocateY(Ort::KernelContext& ctx, const NormAttributes& attrs, const std::vector<int64_t>& x_shape,
                      NormProblem* p) {
  Ort::UnownedValue y = ctx.GetOutput(0, x_shape);
  if (static_cast<OrtValue*>(y) == nullptr) return "output Y could not be allocated";
  const int y_type = static_cast<int>(y.GetTensorTypeAndShapeInfo().GetElementType());
  if (!IsFloatType(y_type)) {
    return std::string("Y was typed ") + ElemTypeName(y_type) + "; supported types are FLOAT, FLOAT16 and BFLOAT16";
  }
  if (attrs.output_type != 0 && attrs.output_type != y_type) {
    // ORT types a custom op's outputs from its inputs, unless the op's shape inference types them,
    // which needs X's rank (and an ORT release that applies the inferred type).
    return std::string("output_type=") + ElemTypeName(attrs.output_type) + " but ONNX Runtime typed Y as " +
           ElemTypeName(y_type) + ": Y can only take a type other than X's when X's rank is known in the model " +
           "(so that the op's shape inference runs); otherwise use output_type=0 and a Cast after the node";
  }
  p->y_type = y_type;
  p->y = y.GetTensorMutableRawData();
  return {};
}

// The optional outputs the node asks for (the others stay null): Sum for the Skip ops, else the statistics
// (LayerNorm: Y, Mean, InvStdDev; RMSNorm: Y, InvRMS), shaped like X with the normalised dims 1.
void AllocateSideOutputs(Ort::KernelContext& ctx, const OpSignature& op, const std::vector<int64_t>& x_shape,
                         size_t axis, NormProblem* p) {
  const size_t output_count = ctx.GetOutputCount();
  if (op.skip) {
    if (output_count > 1) {
      Ort::UnownedValue sum = ctx.GetOutput(1, x_shape);
      if (static_cast<OrtValue*>(sum) != nullptr) p->sum = sum.GetTensorMutableRawData();
    }
    return;
  }
  std::vector<int64_t> stats_shape = x_shape;
  for (size_t i = axis; i < stats_shape.size(); ++i) stats_shape[i] = 1;
  const size_t mean_index = op.rms ? 0 : 1;
  const size_t inv_index = op.rms ? 1 : 2;
  if (mean_index != 0 && output_count > mean_index) {
    Ort::UnownedValue mean = ctx.GetOutput(mean_index, stats_shape);
    if (static_cast<OrtValue*>(mean) != nullptr) p->mean = mean.GetTensorMutableData<float>();
  }
  if (output_count > inv_index) {
    Ort::UnownedValue inv = ctx.GetOutput(inv_index, stats_shape);
    if (static_cast<OrtValue*>(inv) != nullptr) p->inv_std = inv.GetTensorMutableData<float>();
  }
}

// --- shape inference (NormOp::InferShapes) ---

// True when `status` is an error (released: shape inference gives up quietly, see InferShapes).
bool Ignore(const OrtApi& api, OrtStatus* status) {
  if (status == nullptr) return false;
  api.ReleaseStatus(status);
  return true;
}

// An int attribute of the node being inferred, `fallback` when it is not set or unreadable.
int64_t IntAttribute(const OrtApi& api, OrtShapeInferContext* ctx, const char* name, int64_t fallback) {
  const OrtOpAttr* attr = nullptr;
  int64_t value = fallback;
  size_t size = 0;
  if (!Ignore(api, api.ShapeInferContext_GetAttribute(ctx, name, &attr)) && attr != nullptr &&
      Ignore(api, api.ReadOpAttr(attr, ORT_OP_ATTR_INT, &value, sizeof(value), &size))) {
    value = fallback;
  }
  return value;
}

// X's dims as the outputs take them: values, names (null: none), the names made up for dims that have neither,
// and the first normalised dim.
struct InferredShape {
  std::vector<int64_t> dims;
  std::vector<const char*> symbols;
  std::vector<std::string> fresh_names;
  size_t first;
};

// ORT writes a dim that has neither a value nor a name as dim_value -1, and its memory planner then
// takes any two such dims for equal and shares buffers between tensors of different sizes. Name each
// unknown dim instead: a fresh name per dim of this node, shared by its outputs (whose leading dims are
// the same as X's), claims no equality that does not hold.
void NameUnknownDims(InferredShape& shape) {
  static std::atomic<uint64_t> unknown_dims{0};
  shape.fresh_names.resize(shape.dims.size());
  for (size_t i = 0; i < shape.dims.size(); ++i) {
    if (shape.dims[i] < 0 && (shape.symbols[i] == nullptr || shape.symbols[i][0] == '\0')) {
      shape.fresh_names[i] = "onnx_norm_unk__" + std::to_string(unknown_dims.fetch_add(1));
      shape.symbols[i] = shape.fresh_names[i].c_str();
    }
  }
}

// Declares output `index` with X's shape (`reduced`: the normalised dims 1, as the statistics have) and `type`.
void SetOutput(const OrtApi& api, OrtShapeInferContext* ctx, size_t index, ONNXTensorElementDataType type,
               const InferredShape& shape, bool reduced) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (Ignore(api, api.CreateTensorTypeAndShapeInfo(&info))) return;
  const size_t rank = shape.dims.size();
  std::vector<int64_t> out_dims = shape.dims;
  std::vector<const char*> out_symbols = shape.symbols;
  for (size_t i = 0; i < rank; ++i) {
    if (out_symbols[i] == nullptr) out_symbols[i] = "";
    if (reduced && i >= shape.first) {
      out_dims[i] = 1;
      out_symbols[i] = "";
    }
  }
  // Newer ORT releases take the element type from here as well; older ones keep the type they
  // inferred from the inputs (X's), and the kernel then rejects an output_type it cannot honour.
  if (!Ignore(api, api.SetTensorElementType(info, type)) &&
      !Ignore(api, api.SetDimensions(info, out_dims.data(), rank)) &&
      !Ignore(api, api.SetSymbolicDimensions(info, out_symbols.data(), rank))) {
    Ignore(api, api.ShapeInferContext_SetOutputTypeShape(ctx, index, info));
  }
  api.ReleaseTensorTypeAndShapeInfo(info);
}

}  // namespace

bool GetIntAttribute(const OrtKernelInfo* info, const char* name, int64_t* value) {
  OrtStatus* status = Ort::GetApi().KernelInfoGetAttribute_int64(info, name, value);
  if (status == nullptr) return true;
  Ort::GetApi().ReleaseStatus(status);
  return false;
}

const char* ElemTypeName(int type) {
  switch (type) {
    case 0: return "UNDEFINED";
    case 1: return "FLOAT";
    case 2: return "UINT8";
    case 3: return "INT8";
    case 4: return "UINT16";
    case 5: return "INT16";
    case 6: return "INT32";
    case 7: return "INT64";
    case 8: return "STRING";
    case 9: return "BOOL";
    case 10: return "FLOAT16";
    case 11: return "DOUBLE";
    case 12: return "UINT32";
    case 13: return "UINT64";
    case 16: return "BFLOAT16";
    default: return "an unsupported element type";
  }
}

OrtStatusPtr MakeError(const OpSignature& op, const std::string& message, OrtErrorCode code) {
  const std::string text = std::string("onnx_norm ") + op.name + ": " + message;
  return Ort::GetApi().CreateStatus(code, text.c_str());
}

namespace {

// One of kAttributeNames (every op's), not an op's own int attribute.
bool IsSharedAttribute(const char* name) {
  return std::find_if(std::begin(kAttributeNames), std::end(kAttributeNames), [&](const char* shared) {
           return std::strcmp(shared, name) == 0;
         }) != std::end(kAttributeNames);
}

}  // namespace

std::string ParseAttributes(const OrtKernelInfo* info, const OpSignature& op, NormAttributes* attrs) {
  int64_t value = 0;
  if (GetIntAttribute(info, kAttributeNames[0], &value)) attrs->axis = value;
  float eps = 0.0f;
  if (GetFloatAttribute(info, kAttributeNames[1], &eps)) attrs->epsilon = eps;
  if (!(attrs->epsilon >= 0.0f) || !std::isfinite(attrs->epsilon)) {
    return "attribute epsilon must be a finite number >= 0, got " + std::to_string(attrs->epsilon);
  }
  struct TypeAttr {
    const char* name;
    int* field;
  } type_attrs[] = {{kAttributeNames[2], &attrs->normalized_type},
                    {kAttributeNames[3], &attrs->multiply_type},
                    {kAttributeNames[4], &attrs->output_type}};
  for (const auto& attr : type_attrs) {
    if (!GetIntAttribute(info, attr.name, &value)) continue;
    if (value != 0 && !IsFloatType(static_cast<int>(value))) {
      return std::string("attribute ") + attr.name + "=" + std::to_string(value) +
             " is not supported: use 0 (not set), 1 (FLOAT), 10 (FLOAT16) or 16 (BFLOAT16)";
    }
    *attr.field = static_cast<int>(value);
  }
  size_t own = 0;
  for (const char* name : op.attributes) {
    if (name == nullptr) break;
    if (IsSharedAttribute(name)) continue;
    if (own == kMaxOpInts) return std::string("too many attributes of its own: ") + name;  // a table error
    if (GetIntAttribute(info, name, &attrs->op_ints[own])) attrs->op_ints_set |= 1u << own;
    ++own;
  }
  return op.check_attributes == nullptr ? std::string() : op.check_attributes(*attrs);
}

bool OwnIntSet(const OpSignature& op, const NormAttributes& attrs, const char* name) {
  size_t own = 0;
  for (const char* attribute : op.attributes) {
    if (attribute == nullptr) break;
    if (IsSharedAttribute(attribute)) continue;
    if (std::strcmp(attribute, name) == 0) return attrs.op_ints[own] != 0;
    ++own;
  }
  return false;
}

std::string CheckNormAttributes(const NormAttributes& attrs) {
  const int64_t outside = attrs.op_ints[0];
  if (outside == 0 || outside == 1) return {};
  return std::string("attribute ") + kEpsilonOutside + " must be 0 or 1, got " + std::to_string(outside);
}

std::string PrepareProblem(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs,
                           NormProblem* p) {
  const Inputs in{ctx, ctx.GetInputCount()};
  std::vector<int64_t> x_shape;
  size_t axis = 0;
  std::string error = ReadX(in, attrs, p, &x_shape, &axis);
  if (!error.empty()) return error;
  p->rms = op.rms;
  p->epsilon_outside = OwnIntSet(op, attrs, kEpsilonOutside);
  if (op.skip) error = ReadSkip(in, x_shape, p);
  // Scale follows X (and Skip); Bias follows Scale.
  const size_t scale_index = op.skip ? 2 : 1;
  if (error.empty()) error = ReadParameters(in, scale_index, !op.rms, x_shape, axis, p);
  if (error.empty()) error = AllocateY(ctx, attrs, x_shape, p);
  if (error.empty()) AllocateSideOutputs(ctx, op, x_shape, axis, p);
  return error;
}

OrtStatusPtr ORT_API_CALL NormOp::InferShapes(const OrtCustomOp* self, OrtShapeInferContext* ctx) noexcept {
  const OrtApi& api = Ort::GetApi();
  const OpSignature& op = static_cast<const NormOp*>(self)->op_;
  // Failing to infer is not an error here: the kernel reports bad input with the shapes at hand, and
  // ORT learns the shapes at run time.
  OrtTensorTypeAndShapeInfo* x_info = nullptr;  // owned by ctx
  if (Ignore(api, api.ShapeInferContext_GetInputTypeShape(ctx, 0, &x_info)) || x_info == nullptr) return nullptr;
  ONNXTensorElementDataType x_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  size_t rank = 0;
  if (Ignore(api, api.GetTensorElementType(x_info, &x_type)) || Ignore(api, api.GetDimensionsCount(x_info, &rank))) {
    return nullptr;
  }
  // Unknown rank reads as rank 0 here; declaring outputs as scalars would be wrong, so leave them to
  // ORT's own type inference (Y and Sum typed like X).
  if (rank == 0) return nullptr;
  InferredShape shape{std::vector<int64_t>(rank), std::vector<const char*>(rank, nullptr), {}, 0};
  if (Ignore(api, api.GetDimensions(x_info, shape.dims.data(), rank)) ||
      Ignore(api, api.GetSymbolicDimensions(x_info, shape.symbols.data(), rank))) {
    return nullptr;
  }
  const int64_t r = static_cast<int64_t>(rank);
  const int64_t axis = IntAttribute(api, ctx, "axis", -1);
  if (axis < -r || axis >= r) return nullptr;
  shape.first = static_cast<size_t>(axis < 0 ? axis + r : axis);
  const int64_t output_type = IntAttribute(api, ctx, "output_type", 0);
  const bool output_type_ok = output_type == kFloat || output_type == kFloat16 || output_type == kBFloat16;
  const auto y_type = output_type_ok ? static_cast<ONNXTensorElementDataType>(output_type) : x_type;
  NameUnknownDims(shape);

  SetOutput(api, ctx, 0, y_type, shape, false);
  // An optional output the node leaves out makes SetOutputTypeShape fail, which is ignored: the node's
  // output count is not visible here.
  for (size_t i = 1; i < op.num_outputs; ++i) {
    if (op.skip) {
      SetOutput(api, ctx, i, x_type, shape, false);  // Sum
    } else {
      SetOutput(api, ctx, i, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, shape, true);  // statistics
    }
  }
  return nullptr;
}

}  // namespace onnx_norm
