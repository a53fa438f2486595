// Kernels with X in bfloat16 (kernel_config.cuh says why one file per type).
#include "norm_launch.cuh"

namespace onnx_norm {
namespace cuda {

cudaError_t LaunchNormBFloat16(const NormArgs& args, const KernelConfig& config, cudaStream_t stream) {
  return LaunchNormKernel<__nv_bfloat16>(args, config, stream);
}

}  // namespace cuda
}  // namespace onnx_norm
