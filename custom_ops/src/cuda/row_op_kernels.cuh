// What the row ops' kernels share: ops whose kernel normalises each row of X by the norm's statistics and then
// applies an epilogue of their own to each unit of the row (a row op: no Skip, no statistics outputs). One kernel
// loop (NormRows: the row's statistics, RowStatistics, then the op's epilogue over the units this thread holds,
// ForEachUnit), typed loads and stores, and the choice among a kernel's four variants (RowKernelFor). Built from
// the shared pieces of the norm kernels (vector_io.cuh loads/stores and conversions, element_types.cuh rounding,
// reduce.cuh group sums); statistics in float32, LayerNorm's variance a second pass over the row held in registers.
//
// An op built on it brings, in its own kernels header (cuda/<op>_kernels.cuh), its argument block with the fields
// RowStatistics reads (x, rows, cols, group, epsilon, rms), its name for the emulator (`static constexpr const
// char* kName`) and its kernel choice (`template <typename TX> static Kernel(const KernelConfig&, const Args&)`,
// usually RowKernelFor over its four instantiations); the launch and dispatch layers find it through that block
// (kernel_dispatch.cuh, row_op_launch.h), and its translation unit instantiates LaunchKernel for it.
//
// An op may also give the loop an input stage (NormRows' `Stage`, NoInputStage by default): what the statistic and
// the epilogue read instead of X, computed from X's values and the op's other inputs at the same elements (a gate
// that multiplies X before the norm). A row held in registers then holds the stage's float32 values (N words a
// unit) rather than X's packed 16 bytes, so that nothing is computed twice and no other input is read twice.
#pragma once

#include <cstdint>
#include <type_traits>

#include "element_types.cuh"
#include "kernel_config.cuh"
#include "norm_args.cuh"
#include "reduce.cuh"
#include "vector_io.cuh"

namespace onnx_norm {
namespace cuda {

// A unit of N elements of X held as 32-bit words: a 16-byte vector (4 words) or one element (its float bits).
template <typename TX, int N>
struct Unit {
  static constexpr int kWords = N == 1 ? 1 : 4;

  __device__ __forceinline__ static void Load(const TX* p, uint32_t (&w)[kWords]) {
    if constexpr (N == 1) {
      w[0] = __float_as_uint(LoadScalar(p));
    } else {
      LoadWords<kWords, true>(p, w);
    }
  }

  __device__ __forceinline__ static void Unpack(const uint32_t (&w)[kWords], float (&v)[N]) {
    if constexpr (N == 1) {
      v[0] = __uint_as_float(w[0]);
    } else {
#pragma unroll
      for (int j = 0; j < kWords; ++j) WordCodec<TX>::Unpack(w[j], v + j * WordCodec<TX>::kValues);
    }
  }
};

// N values of a tensor whose type is a runtime (grid-uniform) choice.
template <int N>
__device__ __forceinline__ void LoadTyped(const void* p, int type, int64_t offset, float (&v)[N]) {
  if (type == kFloat16) {
    LoadVector<__half, N>(static_cast<const __half*>(p) + offset, v);
  } else if (type == kBFloat16) {
    LoadVector<__nv_bfloat16, N>(static_cast<const __nv_bfloat16*>(p) + offset, v);
  } else {
    LoadVector<float, N>(static_cast<const float*>(p) + offset, v);
  }
}

template <int N>
__device__ __forceinline__ void StoreTyped(void* p, int type, int64_t offset, const float (&v)[N]) {
  if (type == kFloat16) {
    StoreVector<__half, N>(static_cast<__half*>(p) + offset, v);
  } else if (type == kBFloat16) {
    StoreVector<__nv_bfloat16, N>(static_cast<__nv_bfloat16*>(p) + offset, v);
  } else {
    StoreVector<float, N>(static_cast<float*>(p) + offset, v);
  }
}

// The input stage of a row op without one: the row is X.
struct NoInputStage {
  static constexpr bool kActive = false;
  template <int N, typename Args>
  __device__ __forceinline__ static void Apply(const Args& /*a*/, int64_t /*offset*/, float (&/*v*/)[N]) {}
};
// An input stage is a type like NoInputStage with kActive true, whose Apply(a, offset, v) turns v, X's N values at
// element `offset` of X, into the row's values there, reading the op's other inputs at that offset from `a`.

// One row of a row kernel (a norm over each row, then an epilogue per unit): the units of the row this thread holds
// (kCached: up to kUnits in registers, else none: they are read again), and the row's statistics. kStaged (an input
// stage): a slot holds the stage's N float32 values; else X's unit as loaded.
template <typename TX, int N, bool kCached, bool kStaged = false, int kUnits = kRowOpUnits>
struct RowState {
  using U = Unit<TX, N>;
  static constexpr int kSlots = kCached ? kUnits : 1;
  static constexpr int kWords = kStaged ? N : U::kWords;
  uint32_t w[kSlots][kWords];
  float mean = 0.0f;
  float inv = 0.0f;
  int live_units = 0;
  int64_t base = 0;

  // Slot i's N values of the row.
  __device__ __forceinline__ void Values(int i, float (&v)[N]) const {
    if constexpr (kStaged) {
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] = __uint_as_float(w[i][j]);
    } else {
      U::Unpack(w[i], v);
    }
  }
};

// The row's N values at element `offset` read from memory: X's, through the input stage.
template <typename TX, int N, typename Stage, typename Args>
__device__ __forceinline__ void ReadUnit(const Args& a, int64_t offset, float (&v)[N]) {
  LoadVector<TX, N>(static_cast<const TX*>(a.x) + offset, v);
  Stage::Apply(a, offset, v);
}

// Slot i of s loaded from element `offset`: X's unit as it is, or the input stage's values.
template <typename TX, int N, typename Stage, typename Args, typename State>
__device__ __forceinline__ void LoadSlot(const Args& a, int64_t offset, State& s, int i) {
  if constexpr (Stage::kActive) {
    float v[N];
    ReadUnit<TX, N, Stage>(a, offset, v);
#pragma unroll
    for (int j = 0; j < N; ++j) s.w[i][j] = __float_as_uint(v[j]);
  } else {
    Unit<TX, N>::Load(static_cast<const TX*>(a.x) + offset, s.w[i]);
  }
}

// RowStatistics' first pass: this thread's sum (LayerNorm) or sum of squares (RMSNorm) of its units of the row,
// loaded into s.w when kCached (zeros in a slot past the row's units): every load of the thread's units is issued
// before any is summed.
template <typename TX, int N, bool kCached, typename Stage, typename Args, typename State>
__device__ __forceinline__ float RowSum(const Args& a, int group, int rank, State& s) {
  float sum = 0.0f;
  if constexpr (kCached) {
#pragma unroll
    for (int i = 0; i < State::kSlots; ++i) {
      const int k = rank + i * group;
      if (k < s.live_units) {
        LoadSlot<TX, N, Stage>(a, s.base + k * N, s, i);
      } else {
#pragma unroll
        for (int j = 0; j < State::kWords; ++j) s.w[i][j] = 0u;
      }
    }
#pragma unroll
    for (int i = 0; i < State::kSlots; ++i) {
      float v[N];
      s.Values(i, v);
#pragma unroll
      for (int j = 0; j < N; ++j) sum = a.rms ? fmaf(v[j], v[j], sum) : sum + v[j];
    }
  } else {
    for (int k = rank; k < s.live_units; k += group) {
      float v[N];
      ReadUnit<TX, N, Stage>(a, s.base + k * N, v);
#pragma unroll
      for (int j = 0; j < N; ++j) sum = a.rms ? fmaf(v[j], v[j], sum) : sum + v[j];
    }
  }
  return sum;
}

// LayerNorm's second pass: this thread's sum of squared deviations from s.mean, over the units in s.w (kCached)
// or read again.
template <typename TX, int N, bool kCached, typename Stage, typename Args, typename State>
__device__ __forceinline__ float RowSquares(const Args& a, int group, int rank, const State& s) {
  float squares = 0.0f;
  if constexpr (kCached) {
#pragma unroll
    for (int i = 0; i < State::kSlots; ++i) {
      if (rank + i * group < s.live_units) {
        float v[N];
        s.Values(i, v);
#pragma unroll
        for (int j = 0; j < N; ++j) squares = fmaf(v[j] - s.mean, v[j] - s.mean, squares);
      }
    }
  } else {
    for (int k = rank; k < s.live_units; k += group) {
      float v[N];
      ReadUnit<TX, N, Stage>(a, s.base + k * N, v);
#pragma unroll
      for (int j = 0; j < N; ++j) squares = fmaf(v[j] - s.mean, v[j] - s.mean, squares);
    }
  }
  return squares;
}

// Reads row `row` (an empty row past the last one) and reduces it over its group of threads: mean (LayerNorm)
// and 1 / sqrt(variance or mean square + epsilon), float32, LayerNorm's variance a second pass over the row held
// in registers (or read again). Every thread of the block calls it the same number of times (block-wide sums).
// Args: any argument block with x, rows, cols, epsilon and rms (a row op's, named as in NormArgs); Stage: the
// row's input stage (NoInputStage: X).
template <typename TX, int N, bool kCached, typename Stage, typename Args, typename State>
__device__ __forceinline__ void RowStatistics(const Args& a, const RowGroups& rows, int64_t row, ReduceScratch& scratch,
                                              int& parity, State& s) {
  const int group = rows.group;
  const int rank = rows.rank;
  s.live_units = row < a.rows ? a.cols / N : 0;
  s.base = row * a.cols;
  const float sum = RowSum<TX, N, kCached, Stage>(a, group, rank, s);
  s.mean = 0.0f;
  if (a.rms) {
    s.inv = 1.0f / sqrtf(GroupSum(sum, group, scratch, parity) / a.cols + a.epsilon);
    return;
  }
  s.mean = GroupSum(sum, group, scratch, parity) / a.cols;
  const float squares = RowSquares<TX, N, kCached, Stage>(a, group, rank, s);
  // IEEE sqrt and division, not rsqrtf's approximation: once per row.
  s.inv = 1.0f / sqrtf(GroupSum(squares, group, scratch, parity) / a.cols + a.epsilon);
}

// Calls epilogue(offset, col, v) for each unit of the row this thread owns, v its N values of the row (X's, or the
// input stage's: the same Stage as RowStatistics').
template <typename TX, int N, bool kCached, typename Stage = NoInputStage, typename Args, typename State,
          typename Epilogue>
__device__ __forceinline__ void ForEachUnit(const Args& a, const RowGroups& rows, const State& s, Epilogue&& epilogue) {
  if constexpr (kCached) {
#pragma unroll
    for (int i = 0; i < State::kSlots; ++i) {
      const int k = rows.rank + i * rows.group;
      if (k < s.live_units) {
        float v[N];
        s.Values(i, v);
        epilogue(s.base + k * N, k * N, v);
      }
    }
  } else {
    for (int k = rows.rank; k < s.live_units; k += rows.group) {
      float v[N];
      ReadUnit<TX, N, Stage>(a, s.base + k * N, v);
      epilogue(s.base + k * N, k * N, v);
    }
  }
}

// The loop of a row kernel: `group` threads per row, blockDim.x / group rows per block, blocks looping over rows;
// each row's statistics (of X, or of its input stage's values), then epilogue(row, rows, state) for a row that
// exists. Every thread runs the same iterations (a row slot past the last row is an empty row), so block-wide sums
// (group > 32) miss no thread.
template <typename TX, int N, bool kCached, typename Stage = NoInputStage, typename Args, typename RowEpilogue>
__device__ __forceinline__ void NormRows(const Args& a, ReduceScratch& scratch, RowEpilogue&& epilogue) {
  int parity = 0;
  const RowGroups rows(a.group);
  for (int64_t first = rows.first(); first < a.rows; first += rows.step) {
    const int64_t row = first + rows.slot;
    RowState<TX, N, kCached, Stage::kActive, RowOpUnits<Args>::For(sizeof(TX))> s;
    RowStatistics<TX, N, kCached, Stage>(a, rows, row, scratch, parity, s);
    if (s.live_units != 0) epilogue(row, rows, s);
  }
}

// Of a row kernel's four instantiations (16-byte vector units or scalar ones, the row kept in registers or read
// again), the one `config`'s flags name (RowOpFlags), for an op's `Args::Kernel` (see the top of this file).
template <typename Kernel>
Kernel RowKernelVariant(const KernelConfig& config, Kernel vector_cached, Kernel vector_reread, Kernel scalar_cached,
                        Kernel scalar_reread) {
  const bool cached = (config.flags & kCachedRowFlag) != 0;
  if ((config.flags & kVectorUnitsFlag) != 0) return cached ? vector_cached : vector_reread;
  return cached ? scalar_cached : scalar_reread;
}

// The four instantiations of an op's row kernel for X of type TX, and the one `config` names: `pick(n, cached)`
// returns the kernel for units of decltype(n)::value elements (a 16-byte vector, or 1), kept in registers or not
// (decltype(cached)::value), as each row op's Args::Kernel does.
template <typename TX, typename Pick>
auto RowKernelFor(const KernelConfig& config, Pick pick) {
  using Vector = std::integral_constant<int, 16 / static_cast<int>(sizeof(TX))>;
  using Scalar = std::integral_constant<int, 1>;
  return RowKernelVariant(config, pick(Vector{}, std::true_type{}), pick(Vector{}, std::false_type{}),
                          pick(Scalar{}, std::true_type{}), pick(Scalar{}, std::false_type{}));
}

}  // namespace cuda
}  // namespace onnx_norm
