// Sums over the threads that share a row: shuffles inside a warp, shared memory across warps.
#pragma once

#include "norm_args.cuh"

namespace onnx_norm {
namespace cuda {

// Lanes of the current warp that belong to the same row group of `group` threads (a power of two
// <= 32). Groups that have run out of rows leave the loop, so shuffles name only their own group.
__device__ __forceinline__ unsigned GroupMask(int group) {
  if (group >= 32) return 0xffffffffu;
  const int lane = threadIdx.x & 31;
  return ((1u << group) - 1u) << (lane & ~(group - 1));
}

__device__ __forceinline__ float WarpSum(float v, unsigned mask, int width) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    if (offset < width) v += __shfl_xor_sync(mask, v, offset);
  }
  return v;
}

// A block's threads in row groups of `group` threads (a power of two >= 8; when > 32, the whole block), one row
// per group: blocks take rows_per_block rows at a time and loop over the rows by `step` (the grid's rows).
struct RowGroups {
  int group;
  int rank;  // this thread's place in its group
  int slot;  // its group's place in the block (the row it takes of the block's rows)
  int rows_per_block;
  int64_t step;

  __device__ __forceinline__ explicit RowGroups(int threads_per_row)
      : group(threads_per_row),
        rank(threadIdx.x & (threads_per_row - 1)),
        slot(threadIdx.x / threads_per_row),
        rows_per_block(blockDim.x / threads_per_row),
        step(static_cast<int64_t>(gridDim.x) * rows_per_block) {}

  __device__ __forceinline__ int64_t first() const { return static_cast<int64_t>(blockIdx.x) * rows_per_block; }
};

// Sum of `v` over a row group of `group` threads. group <= 32: the group lies in one warp (no
// barrier). group > 32: the group is group / 32 whole warps, and every thread of the block must call
// this (one barrier), whichever row group it belongs to.
// The summation order is fixed, so results are deterministic run to run.
__device__ __forceinline__ float GroupSum(float v, int group, ReduceScratch& scratch, int& parity) {
  if (group <= 32) return WarpSum(v, GroupMask(group), group);
  v = WarpSum(v, 0xffffffffu, 32);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  float* partial = scratch.partial[parity];
  parity ^= 1;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = group >> 5;
  const int first = warp & ~(warps - 1);  // the group's first warp
  v = lane < warps ? partial[first + lane] : 0.0f;
  return WarpSum(v, 0xffffffffu, 32);
}

}  // namespace cuda
}  // namespace onnx_norm
