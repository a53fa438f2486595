// One row split over the blocks of a thread-block cluster (sm_90+), for rows too wide for one block's
// shared memory (float32 65536, float16 262144) and for too few rows to fill the GPU (decode, [1, 4096]).
//
// Block `rank` of a cluster of C holds the rank-th slice of the row's body vectors in its shared memory
// (rank 0 also the scalar ends), so X (and Skip) are read from global memory once. The row's sums are
// block sums exchanged through distributed shared memory: each block writes its partial sum into its own
// shared memory, the cluster barrier makes it visible, and every block reads all C partials in rank order
// (the same order everywhere, so every block gets bit-identical statistics). Semantics: docs/ops.md.
#pragma once

#include <cstdint>

#include "cluster.cuh"
#include "norm_kernels.cuh"

namespace onnx_norm {
namespace cuda {

#ifndef ONNX_NORM_NO_CLUSTERS
// Sum of `v` over every thread of every block of the cluster (all of them must call it).
__device__ __forceinline__ float ClusterSum(float v, ClusterShared& shared, int& parity) {
  const int buffer = parity;
  v = GroupSum(v, blockDim.x, shared.scratch, parity);  // flips parity: the partials alternate with it
  if (threadIdx.x == 0) shared.partial[buffer] = v;
  ClusterSync();
  // A partial is rewritten two sums later; every peer has read it by then (it reads before it arrives at
  // the next sum's barrier).
  const unsigned lane = threadIdx.x & 31;
  float partial = 0.0f;
  if (lane < ClusterSize()) partial = *ClusterMapShared(&shared.partial[buffer], lane);
  return WarpSum(partial, 0xffffffffu, 32);
}

// Step 1 for one batch of the block's slice (`count` vectors from flat offset `base`): this thread's
// kClusterBatch vectors from k0 on, X's then Skip's loads before any use (2 x 4 16-byte loads in flight);
// X + Skip rounded and written as Sum, each vector cached in shared memory and added to the sums.
template <typename TX>
__device__ __forceinline__ void CacheClusterBatch(const NormArgs& a, int64_t base, int count, int k0, uint4* cache,
                                                  float& sum, float& sum_sq) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  constexpr int kWords = 4;
  const int threads = static_cast<int>(blockDim.x);
  const TX* x = static_cast<const TX*>(a.x);
  const TX* skip = static_cast<const TX*>(a.skip);
  TX* sum_out = static_cast<TX*>(a.sum);
  uint32_t xw[kClusterBatch][kWords];
  uint32_t sw[kClusterBatch][kWords];
#pragma unroll
  for (int i = 0; i < kClusterBatch; ++i) {
    const int k = k0 + i * threads;
    if (k < count) LoadWords<kWords, true>(x + base + static_cast<int64_t>(k) * V, xw[i]);
  }
  if (skip != nullptr) {
#pragma unroll
    for (int i = 0; i < kClusterBatch; ++i) {
      const int k = k0 + i * threads;
      if (k < count) LoadWords<kWords, true>(skip + base + static_cast<int64_t>(k) * V, sw[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kClusterBatch; ++i) {
    const int k = k0 + i * threads;
    if (k >= count) continue;
    float v[V];
    UnpackWords<TX>(xw[i], v);
    if (skip != nullptr) {
      AddSkipWords<TX>(sw[i], v, xw[i]);
      if (sum_out != nullptr) StoreWords<kWords, true>(sum_out + base + static_cast<int64_t>(k) * V, xw[i]);
    }
    StoreWords<kWords, false>(cache + k, xw[i]);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      sum += v[j];
      sum_sq = fmaf(v[j], v[j], sum_sq);
    }
  }
}

// Step 1 for the row's scalar end this thread holds (block 0, thread t holds scalar element t): cached in
// shared memory as X's type and added to the sums.
template <typename TX>
__device__ __forceinline__ void CacheScalarEnd(const NormArgs& a, const RowLayout& layout, int64_t row_base,
                                               TX* scalars, float& sum, float& sum_sq) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  const int t = static_cast<int>(threadIdx.x);
  float one[1];
  LoadInput<TX, 1>(a, row_base + ScalarColumn<V>(layout, t), true, one);
  scalars[t] = FromFloat<TX>(one[0]);
  sum += one[0];
  sum_sq = fmaf(one[0], one[0], sum_sq);
}

// LayerNorm's second pass over this thread's cached vectors of the slice.
template <typename TX>
__device__ __forceinline__ float ClusterSliceSquares(const uint4* cache, int count, float mean) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  float squares = 0.0f;
  for (int k = static_cast<int>(threadIdx.x); k < count; k += static_cast<int>(blockDim.x)) {
    float v[V];
    LoadVectorShared<TX, V>(reinterpret_cast<const TX*>(cache + k), v);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float d = v[j] - mean;
      squares = fmaf(d, d, squares);
    }
  }
  return squares;
}

// Step 3: this thread's cached vectors of the slice (the row's body vectors first, first + 1, ...) normalised and
// stored.
template <typename TX>
__device__ __forceinline__ void NormalizeClusterSlice(const NormArgs& a, const uint4* cache, int count, int first,
                                                      const RowLayout& layout, int64_t row_base, int prow, float mean,
                                                      float inv) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  for (int k = static_cast<int>(threadIdx.x); k < count; k += static_cast<int>(blockDim.x)) {
    float v[V];
    LoadVectorShared<TX, V>(reinterpret_cast<const TX*>(cache + k), v);
    const int col = layout.head + (first + k) * V;
    NormalizeAndStore<V>(a, mean, inv, v, prow + col, row_base + col);
  }
}

// Step 3 for the scalar end this thread holds.
template <typename TX>
__device__ __forceinline__ void NormalizeScalarEnd(const NormArgs& a, const RowLayout& layout, int64_t row_base,
                                                   int prow, const TX* scalars, float mean, float inv) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  const int t = static_cast<int>(threadIdx.x);
  float one[1] = {ToFloat(scalars[t])};
  const int col = ScalarColumn<V>(layout, t);
  NormalizeAndStore<1>(a, mean, inv, one, prow + col, row_base + col);
}
#endif

template <typename TX>
__global__ void __launch_bounds__(kClusterMaxBlock, 1) ClusterRowKernel(NormArgs a) {
#ifdef ONNX_NORM_NO_CLUSTERS
  __trap();
#else
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  ONNX_NORM_DYNAMIC_SHARED(uint4, dynamic_shared);
  ClusterShared& shared = *reinterpret_cast<ClusterShared*>(dynamic_shared);
  uint4* cache = dynamic_shared + sizeof(ClusterShared) / 16;  // this block's slice of the row
  TX* scalars = reinterpret_cast<TX*>(shared.scalars);
  const int rank = static_cast<int>(ClusterRank());
  const int size = static_cast<int>(ClusterSize());
  const int t = static_cast<int>(threadIdx.x);
  int parity = 0;
  // Every block of a cluster runs the same rows (the loop depends on the cluster only), so all reach
  // every cluster barrier. Each thread reads back only the vectors and scalars it cached itself: no
  // barrier between one row's output pass and the next row's caching pass.
  for (int64_t row = ClusterIndex(); row < a.rows; row += ClusterCount()) {
    const RowLayout layout = MakeRowLayout<V>(a, row);
    const int per = (layout.body + size - 1) / size;
    const int first = min(layout.body, rank * per);
    const int count = min(layout.body, first + per) - first;
    const int64_t row_base = row * a.cols;
    const int64_t base = row_base + layout.head + static_cast<int64_t>(first) * V;
    const bool scalar = rank == 0 && t < layout.scalars();  // this thread holds a scalar end (block 0 only)

    // 1. The slice, kClusterBatch vectors per thread at a time (kernel_config.cuh). Sum written here.
    float sum = 0.0f;
    float sum_sq = 0.0f;
    for (int k0 = t; k0 < count; k0 += kClusterBatch * static_cast<int>(blockDim.x)) {
      CacheClusterBatch<TX>(a, base, count, k0, cache, sum, sum_sq);
    }
    if (scalar) CacheScalarEnd<TX>(a, layout, row_base, scalars, sum, sum_sq);

    // 2. Statistics over the cluster.
    float mean = 0.0f;
    float inv;
    if (a.rms) {
      inv = InverseRoot(ClusterSum(sum_sq, shared, parity) / a.cols, a);
    } else {
      mean = ClusterSum(sum, shared, parity) / a.cols;
      float squares = ClusterSliceSquares<TX>(cache, count, mean);
      if (scalar) {
        const float d = ToFloat(scalars[t]) - mean;
        squares = fmaf(d, d, squares);
      }
      inv = InverseRoot(ClusterSum(squares, shared, parity) / a.cols, a);
    }
    if (rank == 0 && t == 0) WriteStatistics(a, row, mean, inv);

    // 3. Normalise the slice from shared memory.
    // The row's Scale row (per row group, docs/ops.md), worked out after its statistics.
    const int prow = ParameterRow(a, row);
    NormalizeClusterSlice<TX>(a, cache, count, first, layout, row_base, prow, mean, inv);
    if (scalar) NormalizeScalarEnd<TX>(a, layout, row_base, prow, scalars, mean, inv);
  }
  // A block's shared memory must outlive every peer's reads of its partial sums.
  ClusterSync();
#endif
}

}  // namespace cuda
}  // namespace onnx_norm
