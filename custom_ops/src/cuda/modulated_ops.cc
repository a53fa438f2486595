// The CUDAExecutionProvider side of the modulated (adaLN) ops: the validation shared with the CPU ops (common/),
// then one LaunchModulated on ONNX Runtime's compute stream. Compiled by the host compiler: no CUDA headers here.
#include <string>

#include "common/modulation.h"
#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/modulated_launch.h"
#include "cuda/ort_launch.h"

namespace onnx_norm {
namespace cuda {

OrtStatusPtr ComputeModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  Modulation m;
  const std::string error = PrepareModulated(ctx, op, attrs, &p, &m);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;

  ModulatedLaunchParams params;
  params.norm = LaunchParamsFor(p, ctx);
  params.mod_scale = m.scale;
  params.mod_shift = m.shift;
  params.mod_type = m.type;
  params.mod_batch = m.batch;
  params.rows_per_sample = m.rows_per_sample;

  const char* launch_error = nullptr;
  const int rc = LaunchModulated(params, ctx.GetGPUComputeStream(), &launch_error);
  return LaunchStatus(op, rc, launch_error);
}

}  // namespace cuda
}  // namespace onnx_norm
