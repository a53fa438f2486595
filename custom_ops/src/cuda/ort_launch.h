// What every CUDAExecutionProvider op wrapper does around its launch (defined in cuda_ops.cc): the launch
// parameters of a prepared problem, the launch, and the launcher's return code as an ORT status. Host compiler, no
// CUDA headers.
#pragma once

#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/launch.h"

namespace onnx_norm {
namespace cuda {

// The problem's tensors, shape, attributes and types, on the device that holds X (from X's memory info: a CUDA EP
// session places every input and output of the node on its device, and the launch never has to ask the stream,
// which a CUDA graph capture could refuse).
NormLaunchParams LaunchParamsFor(const NormProblem& p, Ort::KernelContext& ctx);

// nullptr for rc == 0; otherwise a runtime error naming the op, the code and the launcher's message.
OrtStatusPtr LaunchStatus(const OpSignature& op, int rc, const char* message);

// One LaunchNorm on ORT's per-session compute stream (every ORT CUDA kernel of this run is ordered on it), its
// return code as LaunchStatus says.
OrtStatusPtr Launch(const OpSignature& op, const NormLaunchParams& params, Ort::KernelContext& ctx);

}  // namespace cuda
}  // namespace onnx_norm
