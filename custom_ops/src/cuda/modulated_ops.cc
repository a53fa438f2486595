// The CUDAExecutionProvider side of the modulated (adaLN) ops: the validation shared with the CPU ops (common/),
// then one LaunchModulated on ONNX Runtime's compute stream. Compiled by the host compiler: no CUDA headers here.
#include <string>

#include "common/modulation.h"
#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/modulated_launch.h"

namespace onnx_norm {
namespace cuda {

OrtStatusPtr ComputeModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  std::string error = PrepareProblem(ctx, op, attrs, &p);
  if (!error.empty()) return MakeError(op, error);
  Modulation m;
  error = PrepareModulation(ctx, op, attrs, p, &m);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;

  ModulatedLaunchParams params;
  NormLaunchParams& norm = params.norm;
  norm.x = p.x;
  norm.scale = p.scale;
  norm.bias = p.bias;
  norm.y = p.y;
  norm.rows = p.rows;
  norm.cols = p.cols;
  norm.scale_size = p.scale_size;
  norm.epsilon = p.epsilon;
  norm.rms = p.rms;
  norm.x_type = p.x_type;
  norm.scale_type = p.scale_type;
  norm.y_type = p.y_type;
  norm.normalized_type = p.normalized_type;
  norm.multiply_type = p.multiply_type;
  norm.device = ctx.GetInput(0).GetTensorMemoryInfo().GetDeviceId();
  params.mod_scale = m.scale;
  params.mod_shift = m.shift;
  params.mod_type = m.type;
  params.mod_batch = m.batch;
  params.rows_per_sample = m.rows_per_sample;

  const char* launch_error = nullptr;
  const int rc = LaunchModulated(params, ctx.GetGPUComputeStream(), &launch_error);
  if (rc != 0) {
    return MakeError(op,
                     std::string("CUDA launch failed (code ") + std::to_string(rc) +
                         "): " + (launch_error ? launch_error : "no message"),
                     ORT_RUNTIME_EXCEPTION);
  }
  return nullptr;
}

}  // namespace cuda
}  // namespace onnx_norm
