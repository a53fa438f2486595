// The CUDAExecutionProvider side of GroupNorm: the validation the CPU op has (common/group_norm.h), then one launch
// of GroupNorm's row kernel. Host compiler, no CUDA headers.
#include <string>

#include "common/group_norm.h"
#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/group_norm_launch.h"
#include "cuda/ort_launch.h"

namespace onnx_norm {
namespace cuda {

// GroupNorm: the groups as rows (validated by PrepareGroupNorm, shared with the CPU op), Scale/Bias per channel.
OrtStatusPtr ComputeGroupNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  GroupNormProblem g;
  const std::string error = PrepareGroupNorm(ctx, attrs, &g);
  if (!error.empty()) return MakeError(op, error);
  if (g.rows.rows == 0 || g.rows.cols == 0) return nullptr;
  NormLaunchParams params = LaunchParamsFor(g.rows, ctx);
  params.scale = g.scale;
  params.bias = g.bias;
  params.scale_type = g.scale_type;
  params.row_op = kGroupNormRowOp;
  params.op_ints[kGroupNormGroups] = g.channels / g.group_channels;
  params.op_ints[kGroupNormSpatial] = g.spatial;
  params.op_ints[kGroupNormActivation] = g.activation;
  return Launch(op, params, ctx);
}

}  // namespace cuda
}  // namespace onnx_norm
