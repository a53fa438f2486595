// The CUDAExecutionProvider side of the ops: same validation as the CPU ops (common/), then one
// launch of the CUDA kernels (cuda/*.cu, interface cuda/launch.h) on ONNX Runtime's compute stream.
// Compiled by the host compiler: no CUDA headers here.

#include <string>

#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/launch.h"

namespace onnx_norm {
namespace cuda {

OrtStatusPtr Compute(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  const std::string error = PrepareProblem(ctx, op, attrs, &p);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;

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

  // The device that holds the tensors, from X's memory info (a CUDA EP session places every input and
  // output of this node on its device): the launch never asks the stream, which a CUDA graph capture
  // could refuse.
  params.device = ctx.GetInput(0).GetTensorMemoryInfo().GetDeviceId();

  // ORT's per-session compute stream; every ORT CUDA kernel of this run is ordered on it.
  void* stream = ctx.GetGPUComputeStream();
  const char* launch_error = nullptr;
  const int rc = LaunchNorm(params, stream, &launch_error);
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
