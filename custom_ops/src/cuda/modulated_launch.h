// How the modulated ops' wrapper (modulated_cuda.cc) and any other caller of LaunchNorm (the tools' harness) pass
// the modulation: NormLaunchParams with row_op = kModulatedRowOp, ModScale and ModShift ([mod_batch, cols] each, of
// scale_type) as op_inputs, mod_batch (1: one modulation for every sample, or rows / rows_per_sample) and
// rows_per_sample (consecutive rows that share one modulation row) as op_ints. Scale/Bias cover the whole row.
#pragma once

namespace onnx_norm {
namespace cuda {

inline constexpr const char* kModulatedRowOp = "Modulated";
enum ModulatedLaunchInput : int { kModScaleInput = 0, kModShiftInput = 1 };
enum ModulatedLaunchInt : int { kModBatchInt = 0, kRowsPerSampleInt = 1 };

}  // namespace cuda
}  // namespace onnx_norm
