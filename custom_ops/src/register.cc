// Entry point of the library: RegisterCustomOps, called by ONNX Runtime when the library is loaded
// with SessionOptions.register_custom_ops_library. Registers the domain `onnx_norm` (opset 1) with the
// ops of docs/ops.md (the four norms and the two modulated norms) for the CPU provider, and for the CUDA
// provider when built with CUDA.
//
// Declared types. ORT types a custom op's outputs in two steps: first from the input types (a
// type-agnostic output takes the type of the last present type-agnostic input), then the op's shape
// inference may set a type (applied by recent ORT releases, when X's rank is known; see NormOp::InferShapes).
// So X is the one type-agnostic input, and Y and Sum follow it unless output_type says otherwise; Skip,
// Scale and Bias get concrete types, one op instance per combination (float, float16, bfloat16 each),
// and the kernel checks at run time that Skip matches X. The statistics are declared float32.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/float_convert.h"
#include "common/modulation.h"
#include "common/norm_op.h"
#include "cpu/modulated_cpu.h"
#include "cpu/norm_cpu.h"

#ifdef ONNX_NORM_WITH_CUDA
namespace onnx_norm {
namespace cuda {
// Defined in cuda/cuda_ops.cc.
OrtStatusPtr Compute(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);
// Defined in cuda/modulated_ops.cc.
OrtStatusPtr ComputeModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);
}  // namespace cuda
}  // namespace onnx_norm
#endif

namespace onnx_norm {
namespace {

// Op objects and the domain must outlive every session that uses them: they live until unload.
struct Registry {
  std::vector<std::unique_ptr<NormOp>> ops;
  Ort::CustomOpDomain domain{kDomain};
};

void AddProvider(Registry& registry, const char* provider, ComputeFn compute) {
  static constexpr int kTypes[] = {kFloat, kFloat16, kBFloat16};
  for (const OpSignature* op : {&kLayerNorm, &kRMSNorm, &kSkipLayerNorm, &kSkipRMSNorm}) {
    for (int skip_type : kTypes) {
      for (int scale_type : kTypes) {
        registry.ops.push_back(std::make_unique<NormOp>(*op, provider, compute, skip_type, scale_type));
        registry.domain.Add(registry.ops.back().get());
      }
      if (!op->skip) break;  // skip_type is unused: one instance per Scale type
    }
  }
}

// The modulated (adaLN) ops: one instance per type of Scale/Bias/ModScale/ModShift (declared alike), no Skip.
void AddModulatedProvider(Registry& registry, const char* provider, ComputeFn compute) {
  for (const OpSignature* op : {&kModulatedLayerNorm, &kModulatedRMSNorm}) {
    for (int type : {kFloat, kFloat16, kBFloat16}) {
      registry.ops.push_back(std::make_unique<NormOp>(*op, provider, compute, type, type));
      registry.domain.Add(registry.ops.back().get());
    }
  }
}

Registry& GetRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry();  // never freed: ORT may use the ops until the process ends
    AddProvider(*r, "CPUExecutionProvider", &cpu::Compute);
    AddModulatedProvider(*r, "CPUExecutionProvider", &cpu::ComputeModulated);
#ifdef ONNX_NORM_WITH_CUDA
    AddProvider(*r, "CUDAExecutionProvider", &cuda::Compute);
    AddModulatedProvider(*r, "CUDAExecutionProvider", &cuda::ComputeModulated);
#endif
    return r;
  }();
  return *registry;
}

}  // namespace
}  // namespace onnx_norm

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // Every API version starts with CreateStatus, so the oldest table can still report the problem.
    const OrtApi* base = api_base->GetApi(1);
    const std::string message = std::string("onnx_norm: this library needs ONNX Runtime API version ") +
                                std::to_string(ORT_API_VERSION) + " or newer; the running ONNX Runtime is " +
                                api_base->GetVersionString();
    return base ? base->CreateStatus(ORT_FAIL, message.c_str()) : nullptr;
  }
  Ort::InitApi(api);
  try {
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    Ort::UnownedSessionOptions(options).Add(onnx_norm::GetRegistry().domain);
    return nullptr;
  } catch (const Ort::Exception& e) {
    return api->CreateStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  } catch (...) {
    return api->CreateStatus(ORT_FAIL, "onnx_norm: unknown error while registering the custom ops");
  }
}
