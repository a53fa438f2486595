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

const OpRegistrar kNormRows[] = {
    OpRegistrar{{{"LayerNorm", false, false, 3, 3, {"X", "Scale", "Bias"}, {"Y", "Mean", "InvStdDev"},
                  kInput1 | kInput2},
                 &cpu::Compute,
                 ONNX_NORM_CUDA_COMPUTE(Compute)}},
    OpRegistrar{{{"RMSNorm", true, false, 2, 2, {"X", "Scale"}, {"Y", "InvRMS"}, kInput1},
                 &cpu::Compute,
                 ONNX_NORM_CUDA_COMPUTE(Compute)}},
    OpRegistrar{{{"SkipLayerNorm", false, true, 4, 2, {"X", "Skip", "Scale", "Bias"}, {"Y", "Sum"}, kInput2 | kInput3},
                 &cpu::Compute,
                 ONNX_NORM_CUDA_COMPUTE(Compute)}},
    OpRegistrar{{{"SkipRMSNorm", true, true, 3, 2, {"X", "Skip", "Scale"}, {"Y", "Sum"}, kInput2},
                 &cpu::Compute,
                 ONNX_NORM_CUDA_COMPUTE(Compute)}},
};

}  // namespace
}  // namespace onnx_norm
