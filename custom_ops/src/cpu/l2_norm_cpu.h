// L2Norm on the CPU (semantics: docs/ops.md): each row's sum of squares accumulated in float32 (from float16 and
// bfloat16 too: the statistic cannot overflow where the type's own reduction would), then
// y = round_m(round_n(x / max(sqrt(sum), epsilon)) * scale).
#pragma once

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {
namespace cpu {

OrtStatusPtr ComputeL2Norm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);

}  // namespace cpu
}  // namespace onnx_norm
