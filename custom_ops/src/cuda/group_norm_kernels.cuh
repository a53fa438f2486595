// GroupNorm's CUDA row math (docs/ops.md): a group of one sample is a contiguous row of X (its C / G channels
// times the spatial dims), normalised by the row ops' statistics (RowStatistics, row_op_kernels.cuh); the
// epilogue applies Scale and Bias of each element's channel and SiLU, every step rounded as the op says.
#pragma once

#include <cstdint>

#include "element_types.cuh"
#include "kernel_config.cuh"
#include "norm_args.cuh"
#include "row_op_kernels.cuh"

namespace onnx_norm {
namespace cuda {

// The arguments of GroupNorm's kernel: a row is one group of one sample (rows = N * G,
// cols = C / G * spatial); Scale and Bias, [C] of scale_type, are read at channel
// (row % groups) * group_channels + col / spatial. The fields RowStatistics reads are named as in NormArgs.
struct GroupNormArgs {
  const void* x;
  const void* scale;
  const void* bias;
  void* y;
  int64_t rows;
  int cols;
  int group;  // threads per row, a power of two >= 8; when > 32 the block size (one row per block)
  float epsilon;
  bool rms;  // false: RowStatistics' LayerNorm statistics
  int scale_type;
  int y_type;
  int normalized_type;
  int multiply_type;
  int spatial;
  int groups;
  int group_channels;
  int activation;  // 0 none, 1 SiLU

  static constexpr const char* kName = "group_norm";
  // The kernel a configuration of kind kRowOp names, for X of type TX (kernel_dispatch.cuh).
  template <typename TX>
  static auto Kernel(const KernelConfig& config, const GroupNormArgs& args) -> void (*)(GroupNormArgs);
};

// Columns [col, col + N) of a group's row whose first channel is `first_channel`: normalise, the per-channel
// affine, SiLU, store. Scale/Bias are read one element at a time (a unit may straddle two channels).
template <int N>
__device__ __forceinline__ void GroupAffineAndStore(const GroupNormArgs& a, float mean, float inv, int first_channel,
                                                    int64_t offset, int col, float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = (v[i] - mean) * inv;
  RoundTo<N>(v, a.normalized_type);
  const auto affine = [&](const void* param, bool multiply) {
    if (param == nullptr) return;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float one[1];
      LoadTyped<1>(param, a.scale_type, first_channel + (col + i) / a.spatial, one);
      v[i] = multiply ? v[i] * one[0] : v[i] + one[0];
    }
    RoundTo<N>(v, a.multiply_type);
  };
  affine(a.scale, true);
  affine(a.bias, false);
  if (a.activation == 1) {
    float p[N];
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = 1.0f / (1.0f + expf(-v[i]));
    RoundTo<N>(p, a.multiply_type);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] *= p[i];
    RoundTo<N>(v, a.multiply_type);
  }
  StoreTyped<N>(a.y, a.y_type, offset, v);
}

// The row kernel of GroupNorm (the row ops' launch bounds and configurations, row_op_kernels.cuh), rows = N * G.
template <typename TX, int N, bool kCached>
__global__ void __launch_bounds__(kRowOpMaxBlock, 1) GroupNormKernel(GroupNormArgs a) {
  __shared__ ReduceScratch scratch;
  NormRows<TX, N, kCached>(a, scratch, [&](int64_t row, const RowGroups& rows, const RowState<TX, N, kCached>& s) {
    // 32-bit arithmetic (the launcher keeps rows below 2^31): a 64-bit remainder is a subroutine call.
    const int first_channel =
        static_cast<int>(static_cast<uint32_t>(row) % static_cast<uint32_t>(a.groups)) * a.group_channels;
    ForEachUnit<TX, N, kCached>(a, rows, s, [&](int64_t offset, int col, float(&v)[N]) {
      GroupAffineAndStore<N>(a, s.mean, s.inv, first_channel, offset, col, v);
    });
  });
}

template <typename TX>
auto GroupNormArgs::Kernel(const KernelConfig& config, const GroupNormArgs& /*args*/) -> void (*)(GroupNormArgs) {
  return RowKernelFor<TX>(config, [](auto n, auto cached) {
    return &GroupNormKernel<TX, decltype(n)::value, decltype(cached)::value>;
  });
}

}  // namespace cuda
}  // namespace onnx_norm
