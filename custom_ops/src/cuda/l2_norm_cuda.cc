// The CUDAExecutionProvider side of L2Norm: the validation the CPU op has (common/l2_norm.h), then one launch of
// L2Norm's row kernel. Host compiler, no CUDA headers.
#include <string>

#include "common/l2_norm.h"
#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/l2_norm_launch.h"
#include "cuda/ort_launch.h"

namespace onnx_norm {
namespace cuda {

// L2Norm: rows over the normalised dims, Scale over them (validated by PrepareL2Norm, shared with the CPU op).
OrtStatusPtr ComputeL2Norm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  const std::string error = PrepareL2Norm(ctx, op, attrs, &p);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;
  NormLaunchParams params = LaunchParamsFor(p, ctx);
  params.rms = false;  // the launcher's RMS statistics are the kernel's own business (l2_norm.cu)
  params.row_op = kL2NormRowOp;
  return Launch(op, params, ctx);
}

}  // namespace cuda
}  // namespace onnx_norm
