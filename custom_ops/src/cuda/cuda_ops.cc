// The CUDAExecutionProvider side of the norms and their Skip forms, and what every op's wrapper shares
// (ort_launch.h): same validation as the CPU ops (common/), then one LaunchNorm of the CUDA kernels (cuda/*.cu,
// interface cuda/launch.h) on ONNX Runtime's compute stream. An op of its own has its wrapper in its own
// cuda/<op>_cuda.cc. Compiled by the host compiler: no CUDA headers here.

#include <string>

#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/ort_launch.h"

namespace onnx_norm {
namespace cuda {

NormLaunchParams LaunchParamsFor(const NormProblem& p, Ort::KernelContext& ctx) {
  NormLaunchParams params;
  params.x = p.x;
  params.skip = p.skip;
  params.scale = p.scale;
  params.bias = p.bias;
  params.y = p.y;
  params.sum = p.sum;
  params.mean = p.mean;
  params.inv_std = p.inv_std;
  params.rows = p.rows;
  params.cols = p.cols;
  params.scale_size = p.scale_size;
  params.scale_groups = p.scale_groups;
  params.epsilon = p.epsilon;
  params.op_ints[0] = p.epsilon_outside ? 1 : 0;  // a row op's wrapper sets its own ints over it
  params.rms = p.rms;
  params.x_type = p.x_type;
  params.scale_type = p.scale_type;
  params.y_type = p.y_type;
  params.normalized_type = p.normalized_type;
  params.multiply_type = p.multiply_type;
  params.device = ctx.GetInput(0).GetTensorMemoryInfo().GetDeviceId();
  return params;
}

OrtStatusPtr LaunchStatus(const OpSignature& op, int rc, const char* message) {
  if (rc == 0) return nullptr;
  return MakeError(op,
                   std::string("CUDA launch failed (code ") + std::to_string(rc) + "): " +
                       (message != nullptr ? message : "no message"),
                   ORT_RUNTIME_EXCEPTION);
}

OrtStatusPtr Launch(const OpSignature& op, const NormLaunchParams& params, Ort::KernelContext& ctx) {
  const char* launch_error = nullptr;
  const int rc = LaunchNorm(params, ctx.GetGPUComputeStream(), &launch_error);
  return LaunchStatus(op, rc, launch_error);
}

OrtStatusPtr Compute(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  const std::string error = PrepareProblem(ctx, op, attrs, &p);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;
  return Launch(op, LaunchParamsFor(p, ctx), ctx);
}

}  // namespace cuda
}  // namespace onnx_norm
