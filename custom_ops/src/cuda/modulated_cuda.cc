// The CUDAExecutionProvider side of the modulated ops (ModulatedLayerNorm, ModulatedRMSNorm): the validation the
// CPU op has (common/modulation.h), then one launch of the modulated row kernel. Host compiler, no CUDA headers.
#include <string>

#include "common/modulation.h"
#include "common/norm_attributes.h"
#include "common/ort_api.h"
#include "cuda/modulated_launch.h"
#include "cuda/ort_launch.h"

namespace onnx_norm {
namespace cuda {

// The modulated ops: the norm's parameters plus ModScale/ModShift (validated by PrepareModulated).
OrtStatusPtr ComputeModulated(Ort::KernelContext& ctx, const OpSignature& op, const NormAttributes& attrs) {
  NormProblem p;
  Modulation m;
  const std::string error = PrepareModulated(ctx, op, attrs, &p, &m);
  if (!error.empty()) return MakeError(op, error);
  if (p.rows == 0 || p.cols == 0) return nullptr;
  NormLaunchParams params = LaunchParamsFor(p, ctx);
  params.scale_type = m.type;  // Scale/Bias, when given, have the modulation's type (checked)
  params.row_op = kModulatedRowOp;
  params.op_inputs[kModScaleInput] = m.scale;
  params.op_inputs[kModShiftInput] = m.shift;
  params.op_ints[kModBatchInt] = m.batch;
  params.op_ints[kRowsPerSampleInt] = m.rows_per_sample;
  return Launch(op, params, ctx);
}

}  // namespace cuda
}  // namespace onnx_norm
