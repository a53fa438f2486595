// Vector loads and stores of N consecutive elements converted to and from float32.
//
// A group of N elements of X's type is 16 bytes; the same group of another type (Y in float32 when X
// is float16, Scale in float16 when X is float32) is 8 to 32 bytes. Each access is split into the
// widest naturally aligned chunks, at most 16 bytes: the launcher only takes this path when every
// pointer is aligned to min(16, N * sizeof(T)) at the group starts (see launch.cu).
#pragma once

#include <cstdint>

#include "element_types.cuh"

// The CPU emulator of the kernels (tools/gpu_harness/emulator.cc) checks every vector access's alignment
// here; on the GPU a misaligned access is a fault, on the CPU it would go unnoticed.
#ifndef ONNX_NORM_CHECK_ALIGNED
#define ONNX_NORM_CHECK_ALIGNED(pointer)
#endif

namespace onnx_norm {
namespace cuda {

template <int Bytes>
struct Chunk;
template <>
struct Chunk<16> {
  using type = uint4;
};
template <>
struct Chunk<8> {
  using type = uint2;
};
template <>
struct Chunk<4> {
  using type = uint32_t;
};
template <>
struct Chunk<2> {
  using type = uint16_t;
};

template <typename T, int N>
struct VectorShape {
  static constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static constexpr int kChunkBytes = kBytes < 16 ? kBytes : 16;
  static constexpr int kChunks = kBytes / kChunkBytes;
  using ChunkType = typename Chunk<kChunkBytes>::type;
  static_assert(kBytes % kChunkBytes == 0, "vector size must be a whole number of chunks");
};

// Read-only data (X, Skip, Scale, Bias) goes through the non-coherent path: nothing in the launch
// writes it.
template <typename T, int N>
__device__ __forceinline__ void LoadVector(const T* p, float (&out)[N]) {
  using Shape = VectorShape<T, N>;
  alignas(16) T raw[N];
  auto* dst = reinterpret_cast<typename Shape::ChunkType*>(raw);
  const auto* src = reinterpret_cast<const typename Shape::ChunkType*>(p);
#pragma unroll
  for (int c = 0; c < Shape::kChunks; ++c) {
    ONNX_NORM_CHECK_ALIGNED(src + c);
    dst[c] = __ldg(src + c);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = ToFloat(raw[i]);
}

template <typename T, int N>
__device__ __forceinline__ void StoreVector(T* p, const float (&in)[N]) {
  using Shape = VectorShape<T, N>;
  alignas(16) T raw[N];
#pragma unroll
  for (int i = 0; i < N; ++i) raw[i] = FromFloat<T>(in[i]);
  const auto* src = reinterpret_cast<const typename Shape::ChunkType*>(raw);
  auto* dst = reinterpret_cast<typename Shape::ChunkType*>(p);
#pragma unroll
  for (int c = 0; c < Shape::kChunks; ++c) {
    ONNX_NORM_CHECK_ALIGNED(dst + c);
    dst[c] = src[c];
  }
}

// Shared memory holds rows that do not fit in registers; each thread reads back only what it wrote.
template <typename T, int N>
__device__ __forceinline__ void LoadVectorShared(const T* p, float (&out)[N]) {
  using Shape = VectorShape<T, N>;
  alignas(16) T raw[N];
  auto* dst = reinterpret_cast<typename Shape::ChunkType*>(raw);
  const auto* src = reinterpret_cast<const typename Shape::ChunkType*>(p);
#pragma unroll
  for (int c = 0; c < Shape::kChunks; ++c) {
    ONNX_NORM_CHECK_ALIGNED(src + c);
    dst[c] = src[c];
  }
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = ToFloat(raw[i]);
}

template <typename T>
__device__ __forceinline__ float LoadScalar(const T* p) {
  return ToFloat(__ldg(p));
}

template <typename T>
__device__ __forceinline__ void StoreScalar(T* p, float v) {
  *p = FromFloat<T>(v);
}

}  // namespace cuda
}  // namespace onnx_norm
