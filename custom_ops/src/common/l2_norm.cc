#include "common/l2_norm.h"

#include "common/op_registry.h"
#include "cpu/l2_norm_cpu.h"

namespace onnx_norm {
#ifdef ONNX_NORM_WITH_CUDA
namespace cuda {
// Defined in cuda/l2_norm_cuda.cc.
OrtStatusPtr ComputeL2Norm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);
}  // namespace cuda
#endif

namespace {

// L2Norm's row of the op table: X, Scale (optional, over the normalised dims); the shared attributes only (a
// constant factor such as sqrt(d) is folded into Scale by the rewrite). CPU kernels only: a CUDA session places
// the node on the CPU provider.
const OpRegistrar kL2NormRow{{{"L2Norm", true, false, 2, 1, {"X", "Scale"}, {"Y"}, kInput1}, &cpu::ComputeL2Norm,
                              nullptr}};

}  // namespace

std::string PrepareL2Norm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs,
                          NormProblem* problem) {
  // The shared checks read X, Scale (op.rms: no Bias) and allocate Y; L2Norm has no statistics outputs.
  return PrepareProblem(ctx, op, attrs, problem);
}

}  // namespace onnx_norm
