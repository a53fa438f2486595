// How L2Norm's wrapper (l2_norm_cuda.cc) and any other caller of LaunchNorm (the tools' harness) pass its
// parameters: NormLaunchParams with row_op = kL2NormRowOp, rows and cols the rows over the normalised dims,
// epsilon the norm's lower bound, rms false, Scale (may be null) of scale_type with scale_size elements (element j of a
// row reads scale[j % scale_size]); no op inputs or ints of its own.
#pragma once

namespace onnx_norm {
namespace cuda {

inline constexpr const char* kL2NormRowOp = "L2Norm";

}  // namespace cuda
}  // namespace onnx_norm
