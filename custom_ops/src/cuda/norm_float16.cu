// Kernels with X in float16 (kernel_config.cuh says why one file per type).
#include "norm_launch.cuh"

namespace onnx_norm {
namespace cuda {

ONNX_NORM_INSTANTIATE_LAUNCH(kFloat16, NormArgs)

}  // namespace cuda
}  // namespace onnx_norm
