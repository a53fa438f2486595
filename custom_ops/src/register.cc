// Entry point of the library: RegisterCustomOps, called by ONNX Runtime when the library is loaded
// with SessionOptions.register_custom_ops_library. Registers the domain `onnx_norm` (opset 1) with the
// ops of the op table (docs/ops.md) for the CPU provider, and for the CUDA provider when built with CUDA.
// The table (common/op_registry.h) is filled by the ops' own files, one row each; this file names no op.
// OnnxNormDescribeOps gives it to tests/test_op_table.py, which checks it against the Python op records
// (onnx_norm/ops/schema.py).
//
// Declared types. ORT types a custom op's outputs in two steps: first from the first registered instance of the
// op (any provider) whose declared input types accept the node's inputs - a type-agnostic output takes the type of
// the last type-agnostic input -, then the op's shape inference may set a type (applied by recent ORT releases,
// when X's rank is known; see NormOp::InferShapes). The first instances of each op therefore declare X
// type-agnostic (UNDEFINED), and Y and Sum follow X unless output_type says otherwise; Skip and the parameters
// (Scale, Bias and any other input after X) get concrete types, one instance per combination (float, float16, bfloat16
// each), and the kernel checks at run time that Skip matches X. The statistics are declared float32.
//
// No float16 X on the CPU. ONNX Runtime's CPU provider has no float16 kernel for most ops: it wraps each in Casts
// to and from float32 and removes the Cast pairs between neighbours, so a float16 model computes almost entirely
// in float32 on the CPU. A float16 CPU kernel of ours would round its input and output to float16 in the middle
// of that float32 computation and leave the optimized model farther from the exact result than the original
// (docs/accuracy.md, 2.). So the CPU instances declare X float or bfloat16 (ORT inserts Casts for float16
// only), Y and Sum of any type (output_type), and ORT's cast insertion runs a float16 node in float32 between its
// own Casts. The type-agnostic instances that type the outputs are the CUDA ones; a build without CUDA registers
// them for a provider that no session has (kTypesOnly), never selected to run, since ORT type-checks a node
// against the union of the instances' types at load and must still accept a float16 X.

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/float_convert.h"
#include "common/norm_op.h"
#include "common/op_registry.h"

namespace onnx_norm {

namespace {

std::vector<OpEntry>& MutableOps() {
  static std::vector<OpEntry> ops;  // function-local: constructed by the first registrar, whatever the link order
  return ops;
}

}  // namespace

OpRegistrar::OpRegistrar(const OpEntry& entry) {
  std::vector<OpEntry>& ops = MutableOps();
  const auto later = std::find_if(ops.begin(), ops.end(),
                                  [&](const OpEntry& e) { return std::strcmp(e.op.name, entry.op.name) > 0; });
  ops.insert(later, entry);
}

const std::vector<OpEntry>& RegisteredOps() { return MutableOps(); }

namespace {

constexpr int kTypes[] = {kFloat, kFloat16, kBFloat16};
// X types of the CPU instances: no float16 (see the top of this file). The other numeric types are declared too,
// so that the kernel rejects them with a message naming the type rather than ORT with "Could not find an
// implementation" (before this, the CPU instances took any X type, as the type-agnostic ones still do).
constexpr int kCpuXTypes[] = {kFloat,
                              kBFloat16,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64,
                              ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL};
constexpr const char* kCpu = "CPUExecutionProvider";
constexpr const char* kCuda = "CUDAExecutionProvider";
// A provider name no ONNX Runtime session has: instances registered for it only type the op's outputs.
constexpr const char* kTypesOnly = "OnnxNormTypesOnlyExecutionProvider";

// Op objects and the domain must outlive every session that uses them: they live until unload.
struct Registry {
  std::vector<std::unique_ptr<NormOp>> ops;
  Ort::CustomOpDomain domain{kDomain};
};

// One instance per type of the parameters (every input but X and Skip, declared alike), times one per type
// of Skip for the Skip ops, for the given X type (0: type-agnostic).
void AddOp(Registry& registry, const OpSignature& op, const char* provider, ComputeFn compute, int x_type) {
  for (int skip_type : kTypes) {
    for (int scale_type : kTypes) {
      registry.ops.push_back(std::make_unique<NormOp>(op, provider, compute, x_type, skip_type, scale_type));
      registry.domain.Add(registry.ops.back().get());
    }
    if (!op.skip) break;  // skip_type is unused: one instance per Scale type
  }
}

Registry& GetRegistry() {
  static Registry* registry = [] {
    auto* r = new Registry();  // never freed: ORT may use the ops until the process ends
    for (const OpEntry& entry : RegisteredOps()) {
      // The type-agnostic instances first: ORT types the outputs from the first instance that accepts the inputs.
      if (entry.cuda != nullptr) {
        AddOp(*r, entry.op, kCuda, entry.cuda, 0);
      } else {
        AddOp(*r, entry.op, kTypesOnly, entry.cpu, 0);
      }
      for (int x_type : kCpuXTypes) AddOp(*r, entry.op, kCpu, entry.cpu, x_type);
    }
    return r;
  }();
  return *registry;
}

// A JSON list of quoted names.
std::string JsonNames(const char* const* names, size_t count) {
  std::string out = "[";
  for (size_t i = 0; i < count; ++i) out += std::string(i ? ", \"" : "\"") + names[i] + "\"";
  return out + "]";
}

std::string DescribeOp(const OpEntry& entry) {
  const OpSignature& op = entry.op;
  std::vector<const char*> optional;
  for (size_t i = 0; i < op.num_inputs; ++i) {
    if (op.OptionalInput(i)) optional.push_back(op.inputs[i]);
  }
  std::vector<const char*> attributes;
  for (const char* name : op.attributes) {
    if (name != nullptr) attributes.push_back(name);
  }
  std::vector<const char*> providers{kCpu};
  if (entry.cuda != nullptr) providers.push_back(kCuda);
  return std::string("{\"name\": \"") + op.name + "\", \"inputs\": " + JsonNames(op.inputs, op.num_inputs) +
         ", \"optional_inputs\": " + JsonNames(optional.data(), optional.size()) +
         ", \"outputs\": " + JsonNames(op.outputs, op.num_outputs) +
         ", \"attributes\": " + JsonNames(attributes.data(), attributes.size()) +
         ", \"providers\": " + JsonNames(providers.data(), providers.size()) + "}";
}

}  // namespace
}  // namespace onnx_norm

// The op list as registered, as JSON: {"domain", "opset", "attributes" (the norms' shared ones), "types", "ops":
// [{"name", "inputs", "optional_inputs", "outputs", "attributes", "providers"}]}. For tests (ctypes); the string
// lives until unload.
extern "C" __attribute__((visibility("default"))) const char* OnnxNormDescribeOps() {
  using namespace onnx_norm;  // NOLINT(build/namespaces): a C entry point
  static const std::string text = [] {
    std::string ops;
    for (const OpEntry& entry : RegisteredOps()) ops += (ops.empty() ? "" : ", ") + DescribeOp(entry);
    std::string types;
    for (int type : kTypes) types += (types.empty() ? "" : ", ") + std::to_string(type);
    return std::string("{\"domain\": \"") + kDomain + "\", \"opset\": " + std::to_string(kOpsetVersion) +
           ", \"attributes\": " + JsonNames(kAttributeNames, std::size(kAttributeNames)) + ", \"types\": [" +
           types + "], \"ops\": [" + ops + "]}";
  }();
  return text.c_str();
}

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
