// L2Norm's CUDA row math (docs/ops.md): y = round_m(round_n(x / max(||x||_2, epsilon)) * Scale). A row op
// (row_op_kernels.cuh): RowStatistics' RMS statistics with epsilon 0 give inv = 1 / sqrt(sum(x^2) / cols), float32
// sums whatever X's type (no float16 overflow of the squares); the epilogue turns that back into the norm,
// sqrt(cols) / inv, clamps it below by the op's epsilon and scales each element.
#pragma once

#include <cstdint>

#include "element_types.cuh"
#include "kernel_config.cuh"
#include "norm_args.cuh"
#include "row_op_kernels.cuh"

namespace onnx_norm {
namespace cuda {

// The arguments of L2Norm's kernel. The fields RowStatistics reads are named as in NormArgs (epsilon is 0 and rms
// true there: the mean square alone); the op's epsilon, the norm's lower bound, is l2_epsilon. Scale (scale_type,
// may be null) has scale_size elements, element j of a row reading scale[j % scale_size].
struct L2NormArgs {
  const void* x;
  const void* scale;
  void* y;
  int64_t rows;
  int cols;
  int group;  // threads per row, a power of two >= 8; when > 32 the block size (one row per block)
  float epsilon;
  bool rms;
  int scale_type;
  int scale_size;
  int y_type;
  int normalized_type;
  int multiply_type;
  float l2_epsilon;
  float sqrt_cols;

  static constexpr const char* kName = "l2_norm";
  // The kernel a configuration of kind kRowOp names, for X of type TX (kernel_dispatch.cuh).
  template <typename TX>
  static auto Kernel(const KernelConfig& config, const L2NormArgs& args) -> void (*)(L2NormArgs);
};

// Columns [col, col + N) of one row: x * r (r = 1 / max(norm, eps)), rounded, times Scale, rounded, stored.
template <int N>
__device__ __forceinline__ void L2ScaleAndStore(const L2NormArgs& a, float r, int64_t offset, int col, float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] *= r;
  RoundTo<N>(v, a.normalized_type);
  if (a.scale != nullptr) {
    if (a.scale_size == a.cols) {
      float p[N];
      LoadTyped<N>(a.scale, a.scale_type, col, p);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] *= p[i];
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float one[1];
        LoadTyped<1>(a.scale, a.scale_type, static_cast<uint32_t>(col + i) % static_cast<uint32_t>(a.scale_size),
                     one);
        v[i] *= one[0];
      }
    }
    RoundTo<N>(v, a.multiply_type);
  }
  StoreTyped<N>(a.y, a.y_type, offset, v);
}

template <typename TX, int N, bool kCached>
__global__ void __launch_bounds__(kRowOpMaxBlock, 1) L2NormKernel(L2NormArgs a) {
  __shared__ ReduceScratch scratch;
  NormRows<TX, N, kCached>(a, scratch, [&](int64_t row, const RowGroups& rows, const RowState<TX, N, kCached>& s) {
    // s.inv = 1 / sqrt(sum / cols): the norm is sqrt(cols) / s.inv (0 for a zero row, whose s.inv is inf). A zero
    // row with epsilon 0 gives r = inf and 0 * inf = NaN, as x / ||x|| does.
    const float norm = a.sqrt_cols / s.inv;
    const float r = 1.0f / fmaxf(norm, a.l2_epsilon);
    ForEachUnit<TX, N, kCached>(a, rows, s, [&](int64_t offset, int col, float(&v)[N]) {
      L2ScaleAndStore<N>(a, r, offset, col, v);
    });
  });
}

template <typename TX>
auto L2NormArgs::Kernel(const KernelConfig& config, const L2NormArgs& /*args*/) -> void (*)(L2NormArgs) {
  return RowKernelFor<TX>(config, [](auto n, auto cached) {
    return &L2NormKernel<TX, decltype(n)::value, decltype(cached)::value>;
  });
}

}  // namespace cuda
}  // namespace onnx_norm
