// Kernels with X in float32 (see kernel_dispatch.cuh for why one file per type).
#include "kernel_dispatch.cuh"

namespace onnx_norm {
namespace cuda {

template cudaError_t LaunchNormKernel<float>(const NormArgs&, const KernelConfig&, cudaStream_t);

}  // namespace cuda
}  // namespace onnx_norm
