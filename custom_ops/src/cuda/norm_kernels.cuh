// LayerNorm / RMSNorm (+ Skip) forward kernels. Semantics: docs/ops.md.
//
// A row is split into an aligned body of V-element vectors (V * sizeof(X) = 16 bytes) and up to
// V - 1 scalar elements on each side (head and tail), so rows of any length and any start address
// get 16-byte accesses for all but at most 2 * (V - 1) elements. Every element of X (and Skip) is
// read from global memory once: the row stays in registers (RegisterRowKernel) or, when it is too
// long for them, in shared memory (SharedRowKernel). Rows that do not fit in shared memory either
// are re-read (SharedRowKernel<..., false>), the only path that reads the row more than once.
//
// Statistics are accumulated in float32; LayerNorm's variance is a second pass over the cached
// row (sum of squared deviations from the mean), not E[x^2] - E[x]^2.
#pragma once

#include <cstdint>

#include "element_types.cuh"
#include "kernel_config.cuh"
#include "norm_args.cuh"
#include "reduce.cuh"
#include "vector_io.cuh"

// The CPU emulator of the kernels (tools/gpu_harness/emulator.cc) provides its own dynamic shared memory.
#ifndef ONNX_NORM_DYNAMIC_SHARED
#define ONNX_NORM_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace onnx_norm {
namespace cuda {

struct RowLayout {
  int head;  // scalar elements before the first vector
  int body;  // number of V-element vectors
  int tail;  // scalar elements after the last vector

  __device__ __forceinline__ int scalars() const { return head + tail; }
};

template <int V>
__device__ __forceinline__ RowLayout MakeRowLayout(const NormArgs& a, int64_t row) {
  RowLayout layout;
  if (!a.vector_ok) {
    layout.head = a.cols;
    layout.body = 0;
    layout.tail = 0;
    return layout;
  }
  const int misalignment = static_cast<int>((a.x_phase + row * a.cols) & (V - 1));
  layout.head = min((V - misalignment) & (V - 1), a.cols);
  layout.body = (a.cols - layout.head) / V;
  layout.tail = a.cols - layout.head - layout.body * V;
  return layout;
}

// Column of the e-th scalar element of a row (head first, then tail).
template <int V>
__device__ __forceinline__ int ScalarColumn(const RowLayout& layout, int e) {
  return e < layout.head ? e : e + layout.body * V;
}

// Calls f(T{}) with T the element type of `type` (uniform across the grid): the type-dependent
// steps are instantiated three times each instead of once per (Scale, Y) combination.
template <typename F>
__device__ __forceinline__ void WithElementType(int type, F&& f) {
  if (type == kFloat16) {
    f(__half{});
  } else if (type == kBFloat16) {
    f(__nv_bfloat16{});
  } else {
    f(float{});
  }
}

// Loads N input elements at a flat offset: X, or round_X(X + Skip) for the Skip ops, writing Sum
// on the first (only) read.
template <typename TX, int N>
__device__ __forceinline__ void LoadInput(const NormArgs& a, int64_t offset, bool write_sum, float (&v)[N]) {
  LoadVector<TX, N>(static_cast<const TX*>(a.x) + offset, v);
  if (a.skip != nullptr) {
    float s[N];
    LoadVector<TX, N>(static_cast<const TX*>(a.skip) + offset, s);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += s[i];
    RoundToType<TX, N>(v);
    if (write_sum && a.sum != nullptr) StoreVector<TX, N>(static_cast<TX*>(a.sum) + offset, v);
  }
}

// Where row `row`'s Scale/Bias row starts: a per-row-group Scale (docs/ops.md) holds scale_groups rows of cols
// values, and row r reads row r % scale_groups; 0 for one row. Computed once per row, after its statistics (the
// kernels keep every load of the row in flight before them).
__device__ __forceinline__ int ParameterRow(const NormArgs& a, int64_t row) {
  return a.scale_groups == 1 ? 0 : static_cast<int>(row % a.scale_groups) * a.cols;
}

// N Scale (or Bias) values for Scale columns [col, col + N) (col counted from ParameterRow).
template <typename TS, int N>
__device__ __forceinline__ void LoadParameter(const NormArgs& a, const void* p, int col, float (&v)[N]) {
  const TS* base = static_cast<const TS*>(p);
  if (a.scale_size == a.cols) {
    if (N == 1 || a.scale_vector) {
      LoadVector<TS, N>(base + col, v);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = LoadScalar(base + col + i);
    }
  } else if (a.scale_vector) {
    LoadVector<TS, N>(base + col % a.scale_size, v);
  } else {
    // Scale covers a suffix of the normalised dims and repeats along the row.
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = LoadScalar(base + (col + i) % a.scale_size);
  }
}

// v = round_mul(v * Scale) if Scale is given, then v = round_mul(v + Bias) if Bias is given.
template <int N>
__device__ __forceinline__ void ApplyParameters(const NormArgs& a, int col, float (&v)[N]) {
  if (a.scale != nullptr) {
    float s[N];
    WithElementType(a.scale_type, [&](auto tag) { LoadParameter<decltype(tag), N>(a, a.scale, col, s); });
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] *= s[i];
    RoundTo<N>(v, a.multiply_type);
  }
  if (a.bias != nullptr) {
    float b[N];
    WithElementType(a.scale_type, [&](auto tag) { LoadParameter<decltype(tag), N>(a, a.bias, col, b); });
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += b[i];
    RoundTo<N>(v, a.multiply_type);
  }
}

template <int N>
__device__ __forceinline__ void StoreOutput(const NormArgs& a, int64_t offset, const float (&v)[N]) {
  WithElementType(a.y_type, [&](auto tag) {
    using TY = decltype(tag);
    StoreVector<TY, N>(static_cast<TY*>(a.y) + offset, v);
  });
}

// The whole epilogue for N elements: y = round_mul(round_mul(round_norm((v - mean) * inv) * Scale)
// + Bias), stored as Y, for one vector (or one scalar) of a row; `col` is the Scale column (ParameterRow +
// the column in the row), `offset` Y's element.
template <int N>
__device__ __forceinline__ void NormalizeAndStore(const NormArgs& a, float mean, float inv, float (&v)[N], int col,
                                                  int64_t offset) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = (v[i] - mean) * inv;
  RoundTo<N>(v, a.normalized_type);
  ApplyParameters<N>(a, col, v);
  StoreOutput<N>(a, offset, v);
}

__device__ __forceinline__ float InverseRoot(float mean_square, const NormArgs& a) {
  // IEEE sqrt and division (not rsqrtf's approximation): once per row, so exactness is free.
  return a.epsilon_outside ? 1.0f / (sqrtf(mean_square) + a.epsilon) : 1.0f / sqrtf(mean_square + a.epsilon);
}

__device__ __forceinline__ void WriteStatistics(const NormArgs& a, int64_t row, float mean, float inv) {
  if (a.mean != nullptr) a.mean[row] = mean;
  if (a.inv_std != nullptr) a.inv_std[row] = inv;
}

// ---------------------------------------------------------------------------------------------
// Rows of up to group * VPT vectors (plus head and tail) held in registers, `blockDim.x / group` rows
// per block. kFlags (RegisterRowFlags, kernel_config.cuh) makes Skip, RMS and the native types
// compile-time, so that a thread issues every load of its row (X, then Skip, then the scalar ends,
// then Scale and Bias) before it uses any: up to 2 * VPT + 2 * VPT 16-byte loads in flight.

// The 4 words of one 16-byte Scale or Bias vector (in X's type) for columns [col, col + V); one row of them (the
// launcher takes no native kernel for a per-row-group Scale).
template <typename TX>
__device__ __forceinline__ void LoadParameterWords(const NormArgs& a, const void* p, int col, uint32_t (&w)[4]) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  const TX* base = static_cast<const TX*>(p);
  if (a.scale_vector) {
    LoadWords<4, true>(base + (a.scale_size == a.cols ? col : col % a.scale_size), w);
  } else {
    // Scale is not aligned like X (or repeats inside a vector): element by element, repacked.
    float v[V];
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = LoadScalar(base + (col + i) % a.scale_size);
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = WordCodec<TX>::Pack(v + j * WordCodec<TX>::kValues);
  }
}

template <typename TX>
__device__ __forceinline__ void UnpackWords(const uint32_t (&w)[4], float (&v)[16 / sizeof(TX)]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) WordCodec<TX>::Unpack(w[j], v + j * WordCodec<TX>::kValues);
}

template <typename TX>
__device__ __forceinline__ void PackWords(const float (&v)[16 / sizeof(TX)], uint32_t (&w)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] = WordCodec<TX>::Pack(v + j * WordCodec<TX>::kValues);
}

// X + Skip of one 16-byte vector in words, the Skip ops' rule that the register and cluster kernels share: `v`
// (X's floats) becomes round_X(X + Skip) and `xw` its words, which the caller stores as Sum and keeps as X.
template <typename TX>
__device__ __forceinline__ void AddSkipWords(const uint32_t (&sw)[4], float (&v)[16 / sizeof(TX)],
                                             uint32_t (&xw)[4]) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  float s[V];
  UnpackWords<TX>(sw, s);
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] += s[j];
  RoundToType<TX, V>(v);
  PackWords<TX>(v, xw);
}

// The steps of RegisterRowKernel, each over one thread's share of the row at flat offset `base`: its vector i is
// the row's body vector rank + i * group (rows.rank, rows.group), its scalar slot j the row's scalar element
// rank + j * group (head first, then tail). group >= 8 threads and head + tail <= 2 * (V - 1) <= 14: two scalar
// slots per thread suffice. The row's pieces travel as separate arguments, not bundled in a struct: with a struct
// nvcc numbered the inlined code's registers differently and ptxas allocated them differently (the SASS was no
// longer the one-function kernel's; docs/cuda_kernels.md).
constexpr int kRowWords = 4;  // the 32-bit words of a 16-byte vector
constexpr int kRowSlots = 2;

// Step 1, the body vectors of X (or Skip) this thread holds: every load issued, none used.
template <typename TX, int VPT>
__device__ __forceinline__ void LoadShareVectors(const TX* p, const RowGroups& rows, const RowLayout& layout,
                                                 int64_t base, uint32_t (&w)[VPT][kRowWords]) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int k = rows.rank + i * rows.group;
    LoadWordsIf(k < layout.body, p + base + layout.head + k * V, w[i]);
  }
}

// Step 1, this thread's scalar elements of X (and Skip); 0 in an empty slot.
template <typename TX, bool kSkip>
__device__ __forceinline__ void LoadShareScalars(const NormArgs& a, const RowGroups& rows, const RowLayout& layout,
                                                 int64_t base, float (&xs)[kRowSlots], float (&ss)[kRowSlots]) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  const TX* x = static_cast<const TX*>(a.x);
  const TX* skip = static_cast<const TX*>(a.skip);
#pragma unroll
  for (int j = 0; j < kRowSlots; ++j) {
    const int e = rows.rank + j * rows.group;
    xs[j] = ss[j] = 0.0f;
    if (e < layout.scalars()) {
      const int64_t offset = base + ScalarColumn<V>(layout, e);
      xs[j] = LoadScalar(x + offset);
      if constexpr (kSkip) ss[j] = LoadScalar(skip + offset);
    }
  }
}

// Step 1 for the native types: Scale and Bias of this thread's vectors, in flight with the row (otherwise their
// type is a runtime choice and they are loaded after the reduction). bw has one vector when there is no Bias.
template <typename TX, bool kBias, int VPT, int kBiasVectors>
__device__ __forceinline__ void LoadShareParameters(const NormArgs& a, const RowGroups& rows, const RowLayout& layout,
                                                    uint32_t (&pw)[VPT][kRowWords],
                                                    uint32_t (&bw)[kBiasVectors][kRowWords]) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int k = rows.rank + i * rows.group;
    if (k < layout.body) {
      const int col = layout.head + k * V;
      if (a.scale != nullptr) LoadParameterWords<TX>(a, a.scale, col, pw[i]);
      if (kBias && a.bias != nullptr) LoadParameterWords<TX>(a, a.bias, col, bw[kBias ? i : 0]);
    }
  }
}

// Step 2 over the body vectors: X + Skip rounded to X's type (exact in the words, which keep it) and stored as
// Sum; returns this thread's sum (LayerNorm) or sum of squares (RMSNorm) of its vectors.
template <typename TX, bool kSkip, bool kRms, int VPT, int kSkipVectors>
__device__ __forceinline__ float SumShareVectors(const NormArgs& a, const RowGroups& rows, const RowLayout& layout,
                                                 int64_t base, uint32_t (&xw)[VPT][kRowWords],
                                                 const uint32_t (&sw)[kSkipVectors][kRowWords]) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    float v[V];
    UnpackWords<TX>(xw[i], v);
    if constexpr (kSkip) {
      AddSkipWords<TX>(sw[i], v, xw[i]);
      const int k = rows.rank + i * rows.group;
      if (a.sum != nullptr && k < layout.body) {
        StoreWords<kRowWords, true>(static_cast<TX*>(a.sum) + base + layout.head + k * V, xw[i]);
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if constexpr (kRms) {
        total = fmaf(v[j], v[j], total);
      } else {
        total += v[j];
      }
    }
  }
  return total;
}

// Step 2 over the scalar slots, continuing `total` (SumShareVectors') in the same order.
template <typename TX, bool kSkip, bool kRms>
__device__ __forceinline__ float SumShareScalars(const NormArgs& a, const RowGroups& rows, const RowLayout& layout,
                                                 int64_t base, float (&xs)[kRowSlots], const float (&ss)[kRowSlots],
                                                 float total) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
#pragma unroll
  for (int j = 0; j < kRowSlots; ++j) {
    if constexpr (kSkip) {
      float one[1] = {xs[j] + ss[j]};
      RoundToType<TX, 1>(one);
      xs[j] = one[0];
      const int e = rows.rank + j * rows.group;
      if (a.sum != nullptr && e < layout.scalars()) {
        StoreVector<TX, 1>(static_cast<TX*>(a.sum) + base + ScalarColumn<V>(layout, e), one);
      }
    }
    if constexpr (kRms) {
      total = fmaf(xs[j], xs[j], total);
    } else {
      total += xs[j];
    }
  }
  return total;
}

// LayerNorm's second pass: this thread's sum of squared deviations from the row's mean.
template <typename TX, int VPT>
__device__ __forceinline__ float ShareSquares(const RowGroups& rows, const RowLayout& layout,
                                              const uint32_t (&xw)[VPT][kRowWords], const float (&xs)[kRowSlots],
                                              float mean) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    if (rows.rank + i * rows.group < layout.body) {
      float v[V];
      UnpackWords<TX>(xw[i], v);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float d = v[j] - mean;
        squares = fmaf(d, d, squares);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRowSlots; ++j) {
    if (rows.rank + j * rows.group < layout.scalars()) {
      const float d = xs[j] - mean;
      squares = fmaf(d, d, squares);
    }
  }
  return squares;
}

// Step 3 of one body vector for the native types: NormalizeAndStore's epilogue with Scale and Bias from the words
// step 1 loaded, and Y stored as one 16-byte vector.
template <typename TX, bool kBias>
__device__ __forceinline__ void NormalizeAndStoreWords(const NormArgs& a, float mean, float inv,
                                                       const uint32_t (&xw)[kRowWords], const uint32_t (&pw)[kRowWords],
                                                       const uint32_t (&bw)[kRowWords], TX* y) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  float v[V];
  UnpackWords<TX>(xw, v);
#pragma unroll
  for (int j = 0; j < V; ++j) v[j] = (v[j] - mean) * inv;
  RoundTo<V>(v, a.normalized_type);
  if (a.scale != nullptr) {
    float s[V];
    UnpackWords<TX>(pw, s);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] *= s[j];
    RoundTo<V>(v, a.multiply_type);
  }
  if (kBias && a.bias != nullptr) {
    float b[V];
    UnpackWords<TX>(bw, b);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] += b[j];
    RoundTo<V>(v, a.multiply_type);
  }
  uint32_t out[kRowWords];
  PackWords<TX>(v, out);
  StoreWords<kRowWords, true>(y, out);
}

// Step 3: normalise and store this thread's vectors, one at a time (only one vector's floats live), then its
// scalars.
template <typename TX, bool kNative, bool kBias, int VPT, int kScaleVectors, int kBiasVectors>
__device__ __forceinline__ void NormalizeShare(const NormArgs& a, const RowGroups& rows, const RowLayout& layout,
                                               int64_t base, int prow, float mean, float inv,
                                               const uint32_t (&xw)[VPT][kRowWords], const float (&xs)[kRowSlots],
                                               const uint32_t (&pw)[kScaleVectors][kRowWords],
                                               const uint32_t (&bw)[kBiasVectors][kRowWords]) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int k = rows.rank + i * rows.group;
    if (k < layout.body) {
      const int col = layout.head + k * V;
      if constexpr (kNative) {
        NormalizeAndStoreWords<TX, kBias>(a, mean, inv, xw[i], pw[i], bw[kBias ? i : 0],
                                          static_cast<TX*>(a.y) + base + col);
      } else {
        float v[V];
        UnpackWords<TX>(xw[i], v);
        NormalizeAndStore<V>(a, mean, inv, v, prow + col, base + col);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRowSlots; ++j) {
    const int e = rows.rank + j * rows.group;
    if (e < layout.scalars()) {
      const int col = ScalarColumn<V>(layout, e);
      float one[1] = {xs[j]};
      NormalizeAndStore<1>(a, mean, inv, one, prow + col, base + col);
    }
  }
}

// Every thread of a block runs the same iterations: a row slot past the last row is an empty row, so
// block-wide reductions (group > 32) never miss a thread. Only the loads and stores of real rows
// are issued, and each element is read (X, Skip) before the same thread writes it (Sum, Y): Sum may
// be X or Skip itself (in-place).
template <typename TX, int VPT, int kFlags>
__global__ void __launch_bounds__(RegisterRowMaxBlock(VPT), RegisterRowMinBlocks(VPT)) RegisterRowKernel(NormArgs a) {
  constexpr bool kSkip = (kFlags & kSkipFlag) != 0;
  constexpr bool kRms = (kFlags & kRmsFlag) != 0;
  constexpr bool kNative = (kFlags & kNativeFlag) != 0;
  constexpr bool kBias = !kRms;  // the RMS ops have no Bias input (the launcher rejects one)
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  __shared__ ReduceScratch scratch;
  int parity = 0;
  const RowGroups rows(a.group);
  for (int64_t first = rows.first(); first < a.rows; first += rows.step) {
    const int64_t row = first + rows.slot;
    const RowLayout layout = row < a.rows ? MakeRowLayout<V>(a, row) : RowLayout{0, 0, 0};
    const int64_t base = row * a.cols;

    // 1. Every load of the row, none used yet: X, Skip, the scalar ends, then Scale and Bias.
    uint32_t xw[VPT][kRowWords];
    uint32_t sw[kSkip ? VPT : 1][kRowWords];
    LoadShareVectors<TX>(static_cast<const TX*>(a.x), rows, layout, base, xw);
    if constexpr (kSkip) LoadShareVectors<TX>(static_cast<const TX*>(a.skip), rows, layout, base, sw);
    float xs[kRowSlots];
    float ss[kRowSlots];
    LoadShareScalars<TX, kSkip>(a, rows, layout, base, xs, ss);
    uint32_t pw[kNative ? VPT : 1][kRowWords];
    uint32_t bw[kNative && kBias ? VPT : 1][kRowWords];
    if constexpr (kNative) LoadShareParameters<TX, kBias>(a, rows, layout, pw, bw);

    // 2. The row's sums (Skip's sum rounded to X's type and stored as Sum), then its statistics.
    float total = SumShareVectors<TX, kSkip, kRms>(a, rows, layout, base, xw, sw);
    total = SumShareScalars<TX, kSkip, kRms>(a, rows, layout, base, xs, ss, total);
    float mean = 0.0f;
    float inv;
    if constexpr (kRms) {
      inv = InverseRoot(GroupSum(total, rows.group, scratch, parity) / a.cols, a);
    } else {
      mean = GroupSum(total, rows.group, scratch, parity) / a.cols;
      const float squares = ShareSquares<TX>(rows, layout, xw, xs, mean);
      inv = InverseRoot(GroupSum(squares, rows.group, scratch, parity) / a.cols, a);
    }
    if (rows.rank == 0 && row < a.rows) WriteStatistics(a, row, mean, inv);

    // 3. Normalise and store.
    NormalizeShare<TX, kNative, kBias>(a, rows, layout, base, ParameterRow(a, row), mean, inv, xw, xs, pw, bw);
  }
}

// ---------------------------------------------------------------------------------------------
// One row per block, any length. kCached: the row is kept in shared memory (dynamic, as X's type,
// exact because Skip sums are already rounded to it); otherwise it is re-read from global memory: from
// Sum when there is one (it is the rounded X + Skip, and it may be X or Skip itself, in-place), else
// X (+ Skip). Within a row each thread reads back only the elements it wrote; between rows a barrier
// (the next row's layout can put its scalars where another thread's vectors of this row were).

template <typename TX, bool kCached>
struct SharedRow {
  static constexpr int V = 16 / static_cast<int>(sizeof(TX));
  RowLayout layout;
  int64_t base;
  TX* cache;  // body vectors first, then the scalars

  template <int N>
  __device__ __forceinline__ void Reread(const NormArgs& a, int64_t offset, float (&v)[N]) const {
    if (a.sum != nullptr) {
      // Written by this thread in this launch: a coherent load, not the read-only path.
      LoadVectorCoherent<TX, N>(static_cast<const TX*>(a.sum) + offset, v);
    } else {
      LoadInput<TX, N>(a, offset, false, v);
    }
  }

  template <int N>
  __device__ __forceinline__ void Vector(const NormArgs& a, int k, float (&v)[N]) const {
    if (kCached) {
      LoadVectorShared<TX, N>(cache + k * V, v);
    } else {
      Reread<N>(a, base + layout.head + k * V, v);
    }
  }

  __device__ __forceinline__ float Scalar(const NormArgs& a, int e) const {
    if (kCached) return ToFloat(cache[layout.body * V + e]);
    float one[1];
    Reread<1>(a, base + ScalarColumn<V>(layout, e), one);
    return one[0];
  }

  // The first pass: X (+ Skip, writing Sum) read once, cached (kCached), and this thread's sum and sum of squares.
  __device__ __forceinline__ void CacheAndSum(const NormArgs& a, float& sum, float& sum_sq) const {
    for (int k = threadIdx.x; k < layout.body; k += blockDim.x) {
      float v[V];
      LoadInput<TX, V>(a, base + layout.head + k * V, true, v);
      if (kCached) StoreVectorShared<TX, V>(cache + k * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sum += v[j];
        sum_sq = fmaf(v[j], v[j], sum_sq);
      }
    }
    for (int e = threadIdx.x; e < layout.scalars(); e += blockDim.x) {
      float one[1];
      LoadInput<TX, 1>(a, base + ScalarColumn<V>(layout, e), true, one);
      if (kCached) cache[layout.body * V + e] = FromFloat<TX>(one[0]);
      sum += one[0];
      sum_sq = fmaf(one[0], one[0], sum_sq);
    }
  }

  // LayerNorm's second pass: this thread's sum of squared deviations from the row's mean.
  __device__ __forceinline__ float Squares(const NormArgs& a, float mean) const {
    float squares = 0.0f;
    for (int k = threadIdx.x; k < layout.body; k += blockDim.x) {
      float v[V];
      Vector<V>(a, k, v);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float d = v[j] - mean;
        squares = fmaf(d, d, squares);
      }
    }
    for (int e = threadIdx.x; e < layout.scalars(); e += blockDim.x) {
      const float d = Scalar(a, e) - mean;
      squares = fmaf(d, d, squares);
    }
    return squares;
  }

  // The output pass: this thread's vectors and scalars normalised and stored; `prow` the row's ParameterRow.
  __device__ __forceinline__ void Normalize(const NormArgs& a, float mean, float inv, int prow) const {
    for (int k = threadIdx.x; k < layout.body; k += blockDim.x) {
      float v[V];
      Vector<V>(a, k, v);
      const int col = layout.head + k * V;
      NormalizeAndStore<V>(a, mean, inv, v, prow + col, base + col);
    }
    for (int e = threadIdx.x; e < layout.scalars(); e += blockDim.x) {
      float one[1] = {Scalar(a, e)};
      const int col = ScalarColumn<V>(layout, e);
      NormalizeAndStore<1>(a, mean, inv, one, prow + col, base + col);
    }
  }
};

template <typename TX, bool kCached>
__global__ void __launch_bounds__(1024, 1) SharedRowKernel(NormArgs a) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  ONNX_NORM_DYNAMIC_SHARED(uint4, dynamic_shared);
  TX* cache = reinterpret_cast<TX*>(dynamic_shared);
  __shared__ ReduceScratch scratch;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const SharedRow<TX, kCached> cached{MakeRowLayout<V>(a, row), row * a.cols, cache};
    float sum = 0.0f;
    float sum_sq = 0.0f;
    cached.CacheAndSum(a, sum, sum_sq);
    float mean = 0.0f;
    float inv;
    if (a.rms) {
      inv = InverseRoot(GroupSum(sum_sq, blockDim.x, scratch, parity) / a.cols, a);
    } else {
      mean = GroupSum(sum, blockDim.x, scratch, parity) / a.cols;
      inv = InverseRoot(GroupSum(cached.Squares(a, mean), blockDim.x, scratch, parity) / a.cols, a);
    }
    if (threadIdx.x == 0) WriteStatistics(a, row, mean, inv);
    cached.Normalize(a, mean, inv, ParameterRow(a, row));
    // The next row's caching pass must not overwrite what a slower thread has still to read.
    if (kCached) __syncthreads();
  }
}

}  // namespace cuda
}  // namespace onnx_norm
