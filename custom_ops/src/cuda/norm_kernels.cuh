// LayerNorm / RMSNorm (+ Skip) forward kernels. Semantics: docs/ops.md.
//
// A row is split into an aligned body of V-element vectors (V * sizeof(X) = 16 bytes) and up to
// V - 1 scalar elements on each side (head and tail), so rows of any length and any start address
// get 16-byte accesses for all but at most 2 * (V - 1) elements. Every element of X (and Skip) is
// read from global memory once: the row stays in registers (RegisterRowKernel) or, when it is too
// long for them, in shared memory (SharedRowKernel). Rows that do not fit in shared memory either
// are re-read (SharedRowKernel<..., false>), the only path that reads X more than once.
//
// Statistics are accumulated in float32; LayerNorm's variance is a second pass over the cached
// row (sum of squared deviations from the mean), not E[x^2] - E[x]^2.
#pragma once

#include <cstdint>

#include "element_types.cuh"
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

// N Scale (or Bias) values for columns [col, col + N).
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
// + Bias), stored as Y, for one vector (or one scalar) of a row.
template <int N>
__device__ __forceinline__ void NormalizeAndStore(const NormArgs& a, float mean, float inv, float (&v)[N], int col,
                                                  int64_t offset) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = (v[i] - mean) * inv;
  RoundTo<N>(v, a.normalized_type);
  ApplyParameters<N>(a, col, v);
  StoreOutput<N>(a, offset, v);
}

__device__ __forceinline__ float InverseRoot(float mean_square, float epsilon) {
  // IEEE sqrt and division (not rsqrtf's approximation): once per row, so exactness is free.
  return 1.0f / sqrtf(mean_square + epsilon);
}

__device__ __forceinline__ void WriteStatistics(const NormArgs& a, int64_t row, float mean, float inv) {
  if (a.mean != nullptr) a.mean[row] = mean;
  if (a.inv_std != nullptr) a.inv_std[row] = inv;
}

// ---------------------------------------------------------------------------------------------
// Rows of up to group * VPT vectors (plus head and tail) held in registers.

// Loads one vector of the row as X's bits (4 words) and as floats. With Skip, the words are the sum
// rounded to X's type (exact, and also what Sum receives), so keeping words instead of floats loses
// nothing and halves the registers a 16-bit row needs.
template <typename TX, int V, int W>
__device__ __forceinline__ void LoadInputWords(const NormArgs& a, int64_t offset, uint32_t (&w)[W], float (&v)[V]) {
  LoadWords<W, true>(static_cast<const TX*>(a.x) + offset, w);
#pragma unroll
  for (int i = 0; i < W; ++i) WordCodec<TX>::Unpack(w[i], v + i * WordCodec<TX>::kValues);
  if (a.skip != nullptr) {
    float s[V];
    LoadVector<TX, V>(static_cast<const TX*>(a.skip) + offset, s);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] += s[i];
    RoundToType<TX, V>(v);
#pragma unroll
    for (int i = 0; i < W; ++i) w[i] = WordCodec<TX>::Pack(v + i * WordCodec<TX>::kValues);
    if (a.sum != nullptr) StoreWords<W, true>(static_cast<TX*>(a.sum) + offset, w);
  }
}

template <typename TX, int VPT>
struct RegisterRow {
  static constexpr int V = 16 / static_cast<int>(sizeof(TX));
  static constexpr int kWords = 4;  // 16 bytes
  // group >= 8 threads and head + tail <= 2 * (V - 1) <= 14: two scalar slots per thread suffice.
  static constexpr int kScalarSlots = 2;
  uint32_t w[VPT][kWords];  // the body vectors, as X's bits
  float s[kScalarSlots];

  __device__ __forceinline__ void Get(int i, float (&v)[V]) const {
#pragma unroll
    for (int j = 0; j < kWords; ++j) WordCodec<TX>::Unpack(w[i][j], v + j * WordCodec<TX>::kValues);
  }
};

// Registers hold up to 32 values per thread; more would spill in 512-thread blocks, and fewer
// registers per thread (the default bound asks for two blocks per SM) are enough up to 16 values.
template <typename TX, int VPT>
__global__ void __launch_bounds__(512, VPT * 16 / static_cast<int>(sizeof(TX)) > 16 ? 1 : 2)
    RegisterRowKernel(NormArgs a) {
  using Row = RegisterRow<TX, VPT>;
  constexpr int V = Row::V;
  constexpr int kSlots = Row::kScalarSlots;
  __shared__ ReduceScratch scratch;
  int parity = 0;
  const int group = a.group;
  const int rank = threadIdx.x & (group - 1);
  const int rows_per_block = blockDim.x / group;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * rows_per_block;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block + threadIdx.x / group; row < a.rows;
       row += row_step) {
    const RowLayout layout = MakeRowLayout<V>(a, row);
    const int64_t base = row * a.cols;
    Row r;
    float sum = 0.0f;
    float sum_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int k = rank + i * group;
      float v[V];
      if (k < layout.body) {
        LoadInputWords<TX, V, Row::kWords>(a, base + layout.head + k * V, r.w[i], v);
      } else {
#pragma unroll
        for (int j = 0; j < Row::kWords; ++j) r.w[i][j] = 0u;
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sum += v[j];
        sum_sq = fmaf(v[j], v[j], sum_sq);
      }
    }
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int e = rank + j * group;
      float one[1] = {0.0f};
      if (e < layout.scalars()) LoadInput<TX, 1>(a, base + ScalarColumn<V>(layout, e), true, one);
      r.s[j] = one[0];
      sum += one[0];
      sum_sq = fmaf(one[0], one[0], sum_sq);
    }

    float mean = 0.0f;
    float inv;
    if (a.rms) {
      inv = InverseRoot(GroupSum(sum_sq, group, scratch, parity) / a.cols, a.epsilon);
    } else {
      mean = GroupSum(sum, group, scratch, parity) / a.cols;
      float squares = 0.0f;
#pragma unroll
      for (int i = 0; i < VPT; ++i) {
        if (rank + i * group < layout.body) {
          float v[V];
          r.Get(i, v);
#pragma unroll
          for (int j = 0; j < V; ++j) {
            const float d = v[j] - mean;
            squares = fmaf(d, d, squares);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        if (rank + j * group < layout.scalars()) {
          const float d = r.s[j] - mean;
          squares = fmaf(d, d, squares);
        }
      }
      inv = InverseRoot(GroupSum(squares, group, scratch, parity) / a.cols, a.epsilon);
    }
    if (rank == 0) WriteStatistics(a, row, mean, inv);

    // One vector at a time: each is unpacked, normalised and stored before the next, so only one
    // vector's floats are live. (The type and rounding branches are uniform across the grid.)
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int k = rank + i * group;
      if (k < layout.body) {
        float v[V];
        r.Get(i, v);
        const int col = layout.head + k * V;
        NormalizeAndStore<V>(a, mean, inv, v, col, base + col);
      }
    }
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int e = rank + j * group;
      if (e < layout.scalars()) {
        const int col = ScalarColumn<V>(layout, e);
        float one[1] = {r.s[j]};
        NormalizeAndStore<1>(a, mean, inv, one, col, base + col);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One row per block, any length. kCached: the row is kept in shared memory (dynamic, as X's type,
// exact because Skip sums are already rounded to it); otherwise it is re-read from global memory.
// Each thread reads back only the elements it wrote, so the cache needs no barriers.

template <typename TX, bool kCached>
struct SharedRow {
  static constexpr int V = 16 / static_cast<int>(sizeof(TX));
  RowLayout layout;
  int64_t base;
  TX* cache;  // body vectors first, then the scalars

  template <int N>
  __device__ __forceinline__ void Vector(const NormArgs& a, int k, float (&v)[N]) const {
    if (kCached) {
      LoadVectorShared<TX, N>(cache + k * V, v);
    } else {
      LoadInput<TX, N>(a, base + layout.head + k * V, false, v);
    }
  }

  __device__ __forceinline__ float Scalar(const NormArgs& a, int e) const {
    if (kCached) return ToFloat(cache[layout.body * V + e]);
    float one[1];
    LoadInput<TX, 1>(a, base + ScalarColumn<V>(layout, e), false, one);
    return one[0];
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
    const RowLayout layout = MakeRowLayout<V>(a, row);
    const SharedRow<TX, kCached> cached{layout, row * a.cols, cache};
    float sum = 0.0f;
    float sum_sq = 0.0f;
    for (int k = threadIdx.x; k < layout.body; k += blockDim.x) {
      float v[V];
      LoadInput<TX, V>(a, cached.base + layout.head + k * V, true, v);
      if (kCached) StoreVectorShared<TX, V>(cache + k * V, v);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        sum += v[j];
        sum_sq = fmaf(v[j], v[j], sum_sq);
      }
    }
    for (int e = threadIdx.x; e < layout.scalars(); e += blockDim.x) {
      float one[1];
      LoadInput<TX, 1>(a, cached.base + ScalarColumn<V>(layout, e), true, one);
      if (kCached) cache[layout.body * V + e] = FromFloat<TX>(one[0]);
      sum += one[0];
      sum_sq = fmaf(one[0], one[0], sum_sq);
    }

    float mean = 0.0f;
    float inv;
    if (a.rms) {
      inv = InverseRoot(GroupSum(sum_sq, blockDim.x, scratch, parity) / a.cols, a.epsilon);
    } else {
      mean = GroupSum(sum, blockDim.x, scratch, parity) / a.cols;
      float squares = 0.0f;
      for (int k = threadIdx.x; k < layout.body; k += blockDim.x) {
        float v[V];
        cached.template Vector<V>(a, k, v);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = v[j] - mean;
          squares = fmaf(d, d, squares);
        }
      }
      for (int e = threadIdx.x; e < layout.scalars(); e += blockDim.x) {
        const float d = cached.Scalar(a, e) - mean;
        squares = fmaf(d, d, squares);
      }
      inv = InverseRoot(GroupSum(squares, blockDim.x, scratch, parity) / a.cols, a.epsilon);
    }
    if (threadIdx.x == 0) WriteStatistics(a, row, mean, inv);

    for (int k = threadIdx.x; k < layout.body; k += blockDim.x) {
      float v[V];
      cached.template Vector<V>(a, k, v);
      const int col = layout.head + k * V;
      NormalizeAndStore<V>(a, mean, inv, v, col, cached.base + col);
    }
    for (int e = threadIdx.x; e < layout.scalars(); e += blockDim.x) {
      float one[1] = {cached.Scalar(a, e)};
      const int col = ScalarColumn<V>(layout, e);
      NormalizeAndStore<1>(a, mean, inv, one, col, cached.base + col);
    }
  }
}

}  // namespace cuda
}  // namespace onnx_norm
