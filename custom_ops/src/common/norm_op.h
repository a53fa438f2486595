// The ORT op class shared by the CPU and CUDA providers: one OrtCustomOp per (op, provider, X type, Skip type,
// Scale type). See register.cc for why the types are declared the way they are.
#pragma once

#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {

// Runs one node: validates (PrepareProblem) and computes. May throw Ort::Exception or std::exception;
// NormKernel turns those into an OrtStatus so that nothing is thrown across the C ABI.
using ComputeFn = OrtStatusPtr (*)(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);

struct NormKernel {
  OpSignature op;
  NormAttributes attrs;
  ComputeFn compute;

  OrtStatusPtr ComputeV2(OrtKernelContext* context) noexcept {
    try {
      Ort::KernelContext ctx(context);
      return compute(ctx, op, attrs);
    } catch (const Ort::Exception& e) {
      return MakeError(op, e.what(), e.GetOrtErrorCode());
    } catch (const std::bad_alloc&) {
      return MakeError(op, "out of memory", ORT_RUNTIME_EXCEPTION);
    } catch (const std::exception& e) {
      return MakeError(op, e.what(), ORT_RUNTIME_EXCEPTION);
    } catch (...) {
      return MakeError(op, "unknown error", ORT_RUNTIME_EXCEPTION);
    }
  }
};

class NormOp : public Ort::CustomOpBase<NormOp, NormKernel, /*WithStatus=*/true> {
 public:
  // x_type/skip_type/scale_type: the element type this instance declares for X, for Skip and for Scale/Bias;
  // x_type 0 (UNDEFINED) declares X type-agnostic, and Y and Sum then follow it.
  NormOp(const OpSignature& op, const char* provider, ComputeFn compute, int x_type, int skip_type, int scale_type)
      : op_(op),
        provider_(provider),
        compute_(compute),
        x_type_(x_type),
        skip_type_(skip_type),
        scale_type_(scale_type) {
    OrtCustomOp::InferOutputShapeFn = &InferShapes;
    // Sum may take X's buffer (the residual stream then stays in one buffer, as with ORT's own in-place Add:
    // writing over lines just read costs no read-for-ownership), and Y Skip's. CPU Skip ops only: their
    // kernel reads a row of X and Skip before writing that row of Sum or Y (norm_cpu.cc). The CUDA kernels
    // are safe with Sum on X or Skip too (launch.h), but the CUDA ops declare no reuse, like ONNX Runtime's
    // own CUDA SkipLayerNorm (docs/cuda_kernels.md says why).
    if (op.skip && std::strcmp(provider, "CPUExecutionProvider") == 0) {
      OrtCustomOp::GetMayInplace = &SkipMayInplace;
      OrtCustomOp::ReleaseMayInplace = &ReleaseMayInplace;
    }
  }

  OrtStatusPtr CreateKernelV2(const OrtApi& /*api*/, const OrtKernelInfo* info, void** kernel) const noexcept {
    try {
      NormAttributes attrs;
      const std::string error = ParseAttributes(info, op_, &attrs);
      if (!error.empty()) return MakeError(op_, error);
      *kernel = new NormKernel{op_, attrs, compute_};
      return nullptr;
    } catch (const std::exception& e) {
      return MakeError(op_, e.what(), ORT_RUNTIME_EXCEPTION);
    } catch (...) {
      return MakeError(op_, "unknown error while creating the kernel", ORT_RUNTIME_EXCEPTION);
    }
  }

  const char* GetName() const { return op_.name; }
  const char* GetExecutionProviderType() const { return provider_; }

  size_t GetInputTypeCount() const { return op_.num_inputs; }
  ONNXTensorElementDataType GetInputType(size_t index) const {
    if (index == 0) return static_cast<ONNXTensorElementDataType>(x_type_);
    if (op_.skip && index == 1) return static_cast<ONNXTensorElementDataType>(skip_type_);
    return static_cast<ONNXTensorElementDataType>(scale_type_);
  }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t index) const {
    return op_.OptionalInput(index) ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }

  size_t GetOutputTypeCount() const { return op_.num_outputs; }
  ONNXTensorElementDataType GetOutputType(size_t index) const {
    // Y and Sum: any type here (ORT types them from the first registered instance that accepts the node's
    // inputs, a type-agnostic one, and the op's shape inference; register.cc); statistics are float32.
    if (index == 0 || op_.skip) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t index) const {
    return index == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
  }

 private:
  // Output shapes for ORT's graph: Y and Sum have X's shape, the statistics X's with the normalised
  // dims set to 1. (Element types are ORT's to infer, from the inputs; see register.cc.)
  static OrtStatusPtr ORT_API_CALL InferShapes(const OrtCustomOp* self, OrtShapeInferContext* ctx) noexcept;

  // (input, output) pairs ORT may alias when the input is not read afterwards and the sizes match.
  static size_t ORT_API_CALL SkipMayInplace(int** input_index, int** output_index) noexcept {
    *input_index = new (std::nothrow) int[2]{0, 1};   // X, Skip
    *output_index = new (std::nothrow) int[2]{1, 0};  // Sum, Y
    if (*input_index == nullptr || *output_index == nullptr) {
      ReleaseMayInplace(*input_index, *output_index);
      *input_index = *output_index = nullptr;
      return 0;
    }
    return 2;
  }
  static void ORT_API_CALL ReleaseMayInplace(int* input_index, int* output_index) noexcept {
    delete[] input_index;
    delete[] output_index;
  }

  OpSignature op_;
  const char* provider_;
  ComputeFn compute_;
  int x_type_;
  int skip_type_;
  int scale_type_;
};

}  // namespace onnx_norm
