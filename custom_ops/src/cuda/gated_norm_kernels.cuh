// GatedRMSNorm's CUDA row math (docs/ops.md): g = silu(float(Z)) in float32; v = x * g before the statistic
// (norm_before_gate 0: the row op's input stage, GateBeforeNorm) or x; each group of cols elements one row:
// y = round_m(round_n(v * inv) * Scale), then * g after the norm (norm_before_gate 1, float32, not rounded); Y in its
// type. A row op (row_op_kernels.cuh): the shared statistics and unit loop, this file's input stage and epilogue.
#pragma once

#include <cstdint>

#include "element_types.cuh"
#include "kernel_config.cuh"
#include "norm_args.cuh"
#include "row_op_kernels.cuh"

namespace onnx_norm {
namespace cuda {

// The arguments of GatedRMSNorm's kernel. The fields RowStatistics reads are named as in NormArgs (rms is true).
// Z has X's layout (its element at X's offset) and scale_type, as Scale does; Scale holds a row of X's D =
// cols * groups elements, group-row r reading its part from (r % groups) * cols.
struct GatedNormArgs {
  const void* x;
  const void* z;
  const void* scale;
  void* y;
  int64_t rows;
  int cols;
  int group;  // threads per row, a power of two >= 8; when > 32 the block size (one row per block)
  float epsilon;
  bool rms;
  bool gate_after;
  int groups;  // groups per row of X: D / cols
  int scale_type;
  int y_type;
  int normalized_type;
  int multiply_type;

  static constexpr const char* kName = "gated_norm";
  // The kernel variant the gate's order picks (Kernel below), as the emulator's reports name it.
  const char* Variant() const { return gate_after ? "after" : "before"; }
  // The gate's product is held as float32: 8 words a 16-byte unit of a 16-bit X, so half the units per thread (the
  // registers of four; with four, ptxas spilled on sm_90).
  static constexpr int CachedUnits(int element_size) { return element_size == 4 ? kRowOpUnits : kRowOpUnits / 2; }
  // The kernel a configuration of kind kRowOp names, for X of type TX (kernel_dispatch.cuh).
  template <typename TX>
  static auto Kernel(const KernelConfig& config, const GatedNormArgs& args) -> void (*)(GatedNormArgs);
};

// v *= silu(z) for Z's N values at element `offset`, in float32 (the formula of the CPU kernel's MulGate; expf, not
// the __expf approximation).
template <int N>
__device__ __forceinline__ void MulGateAt(const GatedNormArgs& a, int64_t offset, float (&v)[N]) {
  float z[N];
  LoadTyped<N>(a.z, a.scale_type, offset, z);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] *= z[i] * (1.0f / (1.0f + expf(-z[i])));
}

// The gate before the norm, as the row op's input stage: the row normalised is x * silu(z).
struct GateBeforeNorm {
  static constexpr bool kActive = true;
  template <int N>
  __device__ __forceinline__ static void Apply(const GatedNormArgs& a, int64_t offset, float (&v)[N]) {
    MulGateAt<N>(a, offset, v);
  }
};

// Columns [col, col + N) of group-row `row`: v (the row's values) * inv, rounded, times the group's Scale, rounded,
// the gate after the norm, stored.
template <int N>
__device__ __forceinline__ void GatedScaleAndStore(const GatedNormArgs& a, float inv, int64_t scale_row,
                                                   int64_t offset, int col, float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] *= inv;
  RoundTo<N>(v, a.normalized_type);
  if (a.scale != nullptr) {
    float p[N];
    LoadTyped<N>(a.scale, a.scale_type, scale_row + col, p);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] *= p[i];
    RoundTo<N>(v, a.multiply_type);
  }
  if (a.gate_after) MulGateAt<N>(a, offset, v);
  StoreTyped<N>(a.y, a.y_type, offset, v);
}

// kGateBefore: the gate is the input stage (its product held in registers as float32); else X is the row and the
// gate is read in the epilogue.
template <typename TX, int N, bool kCached, bool kGateBefore>
__global__ void __launch_bounds__(kRowOpMaxBlock, 1) GatedNormKernel(GatedNormArgs a) {
  __shared__ ReduceScratch scratch;
  using Stage = std::conditional_t<kGateBefore, GateBeforeNorm, NoInputStage>;
  NormRows<TX, N, kCached, Stage>(a, scratch, [&](int64_t row, const RowGroups& rows, const auto& s) {
    // 32-bit modulo (the launcher keeps rows below 2^31): a 64-bit one is a subroutine call.
    const int64_t scale_row = static_cast<int64_t>(static_cast<uint32_t>(row) % static_cast<uint32_t>(a.groups)) * a.cols;
    ForEachUnit<TX, N, kCached, Stage>(a, rows, s, [&](int64_t offset, int col, float(&v)[N]) {
      GatedScaleAndStore<N>(a, s.inv, scale_row, offset, col, v);
    });
  });
}

// The gate's order is a runtime attribute (args.gate_after): RowKernelFor's four variants of the kernel for it.
template <typename TX>
auto GatedNormArgs::Kernel(const KernelConfig& config, const GatedNormArgs& args) -> void (*)(GatedNormArgs) {
  const auto before = RowKernelFor<TX>(config, [](auto n, auto cached) {
    return &GatedNormKernel<TX, decltype(n)::value, decltype(cached)::value, true>;
  });
  const auto after = RowKernelFor<TX>(config, [](auto n, auto cached) {
    return &GatedNormKernel<TX, decltype(n)::value, decltype(cached)::value, false>;
  });
  return args.gate_after ? after : before;
}

}  // namespace cuda
}  // namespace onnx_norm
