// Kernels with X in bfloat16 (see kernel_dispatch.cuh for why one file per type).
#include "kernel_dispatch.cuh"

namespace onnx_norm {
namespace cuda {

template cudaError_t LaunchNormKernel<__nv_bfloat16>(const NormArgs&, const KernelConfig&, cudaStream_t);

}  // namespace cuda
}  // namespace onnx_norm
