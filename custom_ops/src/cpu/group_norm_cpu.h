// GroupNorm on the CPU (semantics: docs/ops.md): the norm's row math (cpu::Run) over the groups, then the
// per-channel affine and the activation as the epilogue.
#pragma once

#include "common/norm_attributes.h"
#include "common/ort_api.h"

namespace onnx_norm {
namespace cpu {

OrtStatusPtr ComputeGroupNorm(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs);

}  // namespace cpu
}  // namespace onnx_norm
