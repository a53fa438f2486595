// The CUDAExecutionProvider side of every op: same validation as the CPU ops (common/), then one
// LaunchNorm of the CUDA kernels (cuda/*.cu, interface cuda/launch.h) on ONNX Runtime's compute stream.
// Compiled by the host compiler: no CUDA headers here.

#include <string>

#include "common/group_norm.h"
#include "common/modulation.h"
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
  params.epsilon = p.epsilon;
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

namespace {

// One launch on ORT's per-session compute stream (every ORT CUDA kernel of this run is ordered on it).
OrtStatusPtr Launch(const OpSignature& op, const NormLaunchParams& params, Ort::KernelContext& ctx) {
  const char* launch_error = nullptr;
  const int rc = LaunchNorm(params, ctx.GetGPUComputeStream(), &launch_error);
  return LaunchStatus(op, rc, launch_error);
}

}  // namespace

OrtStatusPtr Compute(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  const std::string error = PrepareProblem(ctx, op, attrs, &p);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;
  return Launch(op, LaunchParamsFor(p, ctx), ctx);
}

// The modulated ops: the norm's parameters plus ModScale/ModShift (validated by PrepareModulated).
OrtStatusPtr ComputeModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  Modulation m;
  const std::string error = PrepareModulated(ctx, op, attrs, &p, &m);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;
  NormLaunchParams params = LaunchParamsFor(p, ctx);
  params.scale_type = m.type;  // Scale/Bias, when given, have the modulation's type (checked)
  params.mod_scale = m.scale;
  params.mod_shift = m.shift;
  params.mod_batch = m.batch;
  params.rows_per_sample = m.rows_per_sample;
  return Launch(op, params, ctx);
}

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
  params.num_groups = g.channels / g.group_channels;
  params.spatial = g.spatial;
  params.activation = g.activation;
  return Launch(op, params, ctx);
}

}  // namespace cuda
}  // namespace onnx_norm
