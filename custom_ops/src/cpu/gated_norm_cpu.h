// CPU kernels of GatedRMSNorm (semantics: docs/ops.md; validation: common/gated_norm.h).
#pragma once

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {
namespace cpu {

OrtStatusPtr ComputeGatedNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);

}  // namespace cpu
}  // namespace onnx_norm
