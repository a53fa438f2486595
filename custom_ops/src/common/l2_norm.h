// L2Norm's validation, shared by the CPU and CUDA providers (semantics: docs/ops.md): X, and Scale covering the
// normalised dims (or a suffix of them), as the RMSNorm's are checked (PrepareProblem with the signature's rms
// set: no Bias, no statistics); each row is y = x * scale / max(||x||_2, epsilon).
#pragma once

#include <string>

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {

// Reads and checks X, Scale and the attributes, allocates Y and fills `problem` (rows over the normalised dims,
// scale_size the elements of Scale); returns an empty string or an error message naming the offending input.
std::string PrepareL2Norm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs,
                          NormProblem* problem);

}  // namespace onnx_norm
