// Kernels with X in float32 (kernel_config.cuh says why one file per type).
#include "norm_launch.cuh"

namespace onnx_norm {
namespace cuda {

cudaError_t LaunchNormFloat32(const NormArgs& args, const KernelConfig& config, cudaStream_t stream) {
  return LaunchNormKernel<float>(args, config, stream);
}

}  // namespace cuda
}  // namespace onnx_norm
