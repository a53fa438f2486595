// CPU kernels of the modulated (adaLN) ops (semantics: docs/ops.md; signatures: common/modulation.h).
#pragma once

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {
namespace cpu {

OrtStatusPtr ComputeModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);

}  // namespace cpu
}  // namespace onnx_norm
