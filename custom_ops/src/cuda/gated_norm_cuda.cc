// The CUDAExecutionProvider side of GatedRMSNorm: the validation the CPU op has (common/gated_norm.h), then one
// launch of its row kernel over the groups. Host compiler, no CUDA headers.
#include <string>

#include "common/gated_norm.h"
#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/gated_norm_launch.h"
#include "cuda/ort_launch.h"

namespace onnx_norm {
namespace cuda {

// GatedRMSNorm: the groups as rows, Z as the row op's input, Scale the D elements of a row of X.
OrtStatusPtr ComputeGatedNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  GatedNormProblem g;
  const std::string error = PrepareGatedNorm(ctx, attrs, &g);
  if (!error.empty()) return MakeError(op, error);
  if (g.rows.rows == 0 || g.rows.cols == 0) return nullptr;
  if (g.scale != nullptr && g.scale_type != g.z_type) {  // the op's type constraint gives them one type
    return MakeError(op, "Scale and Z must have one type on the CUDA provider");
  }
  NormLaunchParams params = LaunchParamsFor(g.rows, ctx);
  params.row_op = kGatedNormRowOp;
  params.scale = g.scale;
  params.scale_size = g.scale != nullptr ? g.dim : 0;
  params.scale_type = g.z_type;
  params.op_inputs[kGateInput] = g.z;
  params.op_ints[kGateAfterInt] = g.gate_after ? 1 : 0;
  return Launch(op, params, ctx);
}

}  // namespace cuda
}  // namespace onnx_norm
