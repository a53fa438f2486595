// The modulated (adaLN) ops' row math and kernel: y = norm(x) [* Scale + Bias], then * round_m(1 + ModScale[sample])
// + ModShift[sample], every step rounded as docs/ops.md says. A row op (row_op_kernels.cuh): the shared statistics
// and unit loop, this file's epilogue.
#pragma once

#include <cstdint>

#include "element_types.cuh"
#include "kernel_config.cuh"
#include "norm_args.cuh"
#include "row_op_kernels.cuh"

namespace onnx_norm {
namespace cuda {

// The arguments of the modulated kernel: the norm's (named as in NormArgs, which the launcher fills alike) and the
// modulation, ModScale and ModShift, [1 or samples, cols] each, of scale_type; rows_per_sample consecutive rows
// share one modulation row (every row the first when mod_broadcast). A block of its own, in this order, rather
// than NormArgs extended: with NormArgs' fields first, ptxas spilled in two of the kernels on sm_100 (and a larger
// NormArgs made register-row kernels spill on sm_90).
struct ModulatedArgs {
  const void* x;
  const void* scale;  // the norm's own Scale/Bias, scale_type; may be null
  const void* bias;
  const void* mod_scale;
  const void* mod_shift;
  void* y;
  int64_t rows;
  int64_t rows_per_sample;
  bool mod_broadcast;
  int cols;
  int group;  // threads per row, a power of two >= 8; when > 32 the block size (one row per block)
  float epsilon;
  bool rms;
  int scale_type;  // Scale, Bias, ModScale, ModShift
  int y_type;
  int normalized_type;
  int multiply_type;

  static constexpr const char* kName = "modulated";
  // The kernel a configuration of kind kRowOp names, for X of type TX (kernel_dispatch.cuh).
  template <typename TX>
  static auto Kernel(const KernelConfig& config, const ModulatedArgs& args) -> void (*)(ModulatedArgs);
};

// Columns [col, col + N) of one row: normalise, the norm's affine, the modulation, store.
template <int N>
__device__ __forceinline__ void ModulateAndStore(const ModulatedArgs& a, float mean, float inv, int64_t mod_row,
                                                 int64_t offset, int col, float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = (v[i] - mean) * inv;
  RoundTo<N>(v, a.normalized_type);
  float p[N];
  if (a.scale != nullptr) {
    LoadTyped<N>(a.scale, a.scale_type, col, p);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] *= p[i];
    RoundTo<N>(v, a.multiply_type);
  }
  if (a.bias != nullptr) {
    LoadTyped<N>(a.bias, a.scale_type, col, p);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += p[i];
    RoundTo<N>(v, a.multiply_type);
  }
  LoadTyped<N>(a.mod_scale, a.scale_type, mod_row + col, p);
#pragma unroll
  for (int i = 0; i < N; ++i) p[i] += 1.0f;
  RoundTo<N>(p, a.multiply_type);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] *= p[i];
  RoundTo<N>(v, a.multiply_type);
  LoadTyped<N>(a.mod_shift, a.scale_type, mod_row + col, p);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] += p[i];
  RoundTo<N>(v, a.multiply_type);
  StoreTyped<N>(a.y, a.y_type, offset, v);
}

// Launch bounds: up to 1024 threads and at least one block per SM, i.e. 64 registers; without the minimum, ptxas
// aimed at two 1024-thread blocks (32 registers) and spilled in the scalar-unit and re-reading variants.
template <typename TX, int N, bool kCached>
__global__ void __launch_bounds__(kRowOpMaxBlock, 1) ModulatedNormKernel(ModulatedArgs a) {
  __shared__ ReduceScratch scratch;
  NormRows<TX, N, kCached>(a, scratch, [&](int64_t row, const RowGroups& rows, const RowState<TX, N, kCached>& s) {
    // 32-bit division (the launcher keeps rows below 2^31): a 64-bit one is a subroutine call, whose calling
    // convention made ptxas spill.
    const int64_t sample = a.mod_broadcast ? 0 : static_cast<uint32_t>(row) / static_cast<uint32_t>(a.rows_per_sample);
    const int64_t mod_row = sample * a.cols;
    ForEachUnit<TX, N, kCached>(a, rows, s, [&](int64_t offset, int col, float(&v)[N]) {
      ModulateAndStore<N>(a, s.mean, s.inv, mod_row, offset, col, v);
    });
  });
}

template <typename TX>
auto ModulatedArgs::Kernel(const KernelConfig& config, const ModulatedArgs& /*args*/) -> void (*)(ModulatedArgs) {
  return RowKernelFor<TX>(config, [](auto n, auto cached) {
    return &ModulatedNormKernel<TX, decltype(n)::value, decltype(cached)::value>;
  });
}

}  // namespace cuda
}  // namespace onnx_norm
