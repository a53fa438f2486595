// The rows of the op table (common/op_registry.h) for the norms and their Skip forms: one signature each, one
// compute function per provider (cpu/norm_cpu.cc, cuda/cuda_ops.cc), validated by PrepareProblem.
#include "common/op_registry.h"
#include "cpu/norm_cpu.h"

namespace onnx_norm {
#ifdef ONNX_NORM_WITH_CUDA
namespace cuda {
OrtStatusPtr Compute(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);  // cuda_ops.cc
}  // namespace cuda
#endif

namespace {

// The norms take the shared attributes and epsilon_outside, their own int (NormAttributes::op_ints[0]).
constexpr OpSignature WithEpsilonOutside(OpSignature op) {
  op.attributes[5] = kEpsilonOutside;
  op.check_attributes = &CheckNormAttributes;
  return op;
}

const OpRegistrar kNormRows[] = {
    OpRegistrar{{WithEpsilonOutside(OpSignature{"LayerNorm", false, false, 3, 3, {"X", "Scale", "Bias"}, {"Y", "Mean", "InvStdDev"},
                  kInput1 | kInput2}),
                 &cpu::Compute,
                 ONNX_NORM_CUDA_COMPUTE(Compute)}},
    OpRegistrar{{WithEpsilonOutside(OpSignature{"RMSNorm", true, false, 2, 2, {"X", "Scale"}, {"Y", "InvRMS"}, kInput1}),
                 &cpu::Compute,
                 ONNX_NORM_CUDA_COMPUTE(Compute)}},
    OpRegistrar{{WithEpsilonOutside(OpSignature{"SkipLayerNorm", false, true, 4, 2, {"X", "Skip", "Scale", "Bias"}, {"Y", "Sum"}, kInput2 | kInput3}),
                 &cpu::Compute,
                 ONNX_NORM_CUDA_COMPUTE(Compute)}},
    OpRegistrar{{WithEpsilonOutside(OpSignature{"SkipRMSNorm", true, true, 3, 2, {"X", "Skip", "Scale"}, {"Y", "Sum"}, kInput2}),
                 &cpu::Compute,
                 ONNX_NORM_CUDA_COMPUTE(Compute)}},
};

}  // namespace
}  // namespace onnx_norm
