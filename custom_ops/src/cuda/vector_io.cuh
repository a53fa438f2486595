// Vector loads and stores of N consecutive elements converted to and from float32.
//
// A group of N elements of X's type is 16 bytes; the same group of another type (Y in float32 when X
// is float16, Scale in float16 when X is float32) is 8 to 32 bytes. Each access is split into the
// widest naturally aligned chunks, at most 16 bytes: the launcher only takes this path when every
// pointer is aligned to min(16, N * sizeof(T)) at the group starts (see launch.cu).
//
// Values are packed into and unpacked from 32-bit words with explicit bit operations: going through a
// local array of T reinterpreted as uint4 lets the compiler split the 16-byte stores into 4-byte ones.
#pragma once

#include <cstdint>
#include <cstring>

#include "element_types.cuh"

// The CPU emulator of the kernels (tools/gpu_harness/emulator.cc) checks every vector access's alignment
// here; on the GPU a misaligned access is a fault, on the CPU it would go unnoticed.
#ifndef ONNX_NORM_CHECK_ALIGNED
#define ONNX_NORM_CHECK_ALIGNED(pointer)
#endif

namespace onnx_norm {
namespace cuda {

// One 32-bit word holds 4 / sizeof(T) values.
template <typename T>
struct WordCodec;

template <>
struct WordCodec<float> {
  static constexpr int kValues = 1;
  __device__ __forceinline__ static uint32_t Pack(const float* v) { return __float_as_uint(v[0]); }
  __device__ __forceinline__ static void Unpack(uint32_t w, float* v) { v[0] = __uint_as_float(w); }
};

template <>
struct WordCodec<__half> {
  static constexpr int kValues = 2;
  __device__ __forceinline__ static uint32_t Pack(const float* v) {
    const __half2 pair = __floats2half2_rn(v[0], v[1]);  // one packed conversion for two values
    uint32_t w;
    memcpy(&w, &pair, sizeof(w));
    return w;
  }
  __device__ __forceinline__ static void Unpack(uint32_t w, float* v) {
    v[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
    v[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
};

template <>
struct WordCodec<__nv_bfloat16> {
  static constexpr int kValues = 2;
  __device__ __forceinline__ static uint32_t Pack(const float* v) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(v[0], v[1]);
    uint32_t w;
    memcpy(&w, &pair, sizeof(w));
    return w;
  }
  // bfloat16 is the upper half of a float32: widening is a shift.
  __device__ __forceinline__ static void Unpack(uint32_t w, float* v) {
    v[0] = __uint_as_float(w << 16);
    v[1] = __uint_as_float(w & 0xffff0000u);
  }
};

// Loads or stores W words (W = 1, 2, 4 or a multiple of 4) as 4-, 8- or 16-byte accesses.
template <int W, bool kReadOnly>
__device__ __forceinline__ void LoadWords(const void* p, uint32_t (&w)[W]) {
  if constexpr (W % 4 == 0) {
    const uint4* src = static_cast<const uint4*>(p);
#pragma unroll
    for (int c = 0; c < W / 4; ++c) {
      ONNX_NORM_CHECK_ALIGNED(src + c);
      const uint4 q = kReadOnly ? __ldg(src + c) : src[c];
      w[4 * c] = q.x;
      w[4 * c + 1] = q.y;
      w[4 * c + 2] = q.z;
      w[4 * c + 3] = q.w;
    }
  } else if constexpr (W == 2) {
    const uint2* src = static_cast<const uint2*>(p);
    ONNX_NORM_CHECK_ALIGNED(src);
    const uint2 q = kReadOnly ? __ldg(src) : *src;
    w[0] = q.x;
    w[1] = q.y;
  } else {
    static_assert(W == 1, "unsupported vector width");
    const unsigned int* src = static_cast<const unsigned int*>(p);
    ONNX_NORM_CHECK_ALIGNED(src);
    w[0] = kReadOnly ? __ldg(src) : *src;
  }
}

// Four words (16 bytes) read-only when `valid`, else zeros. On the GPU one predicated load in straight-line
// PTX: as `if (valid) LoadWords(...)` it is a branch there, and ptxas then issued the last vector's loads of
// the non-native 4-vector Skip kernels after the first sums (6 of 8 loads in flight instead of 8).
__device__ __forceinline__ void LoadWordsIf(bool valid, const void* p, uint32_t (&w)[4]) {
#ifdef __CUDA_ARCH__
  asm volatile(
      "{\n\t.reg .pred valid;\n\tsetp.ne.b32 valid, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\t"
      "mov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t@valid ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
      : "l"(p), "r"(static_cast<int>(valid)));
#else
  if (valid) {
    LoadWords<4, true>(p, w);
  } else {
    w[0] = w[1] = w[2] = w[3] = 0u;
  }
#endif
}

// Global stores go through the __stwb intrinsic (an ordinary write-back store): a plain uint4 assignment
// is a member-wise struct copy, which nvcc emits as four 4-byte stores.
template <int W, bool kGlobal>
__device__ __forceinline__ void StoreWords(void* p, const uint32_t (&w)[W]) {
  if constexpr (W % 4 == 0) {
    uint4* dst = static_cast<uint4*>(p);
#pragma unroll
    for (int c = 0; c < W / 4; ++c) {
      ONNX_NORM_CHECK_ALIGNED(dst + c);
      const uint4 q = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
      if constexpr (kGlobal) {
        __stwb(dst + c, q);
      } else {
        dst[c] = q;
      }
    }
  } else if constexpr (W == 2) {
    uint2* dst = static_cast<uint2*>(p);
    ONNX_NORM_CHECK_ALIGNED(dst);
    const uint2 q = make_uint2(w[0], w[1]);
    if constexpr (kGlobal) {
      __stwb(dst, q);
    } else {
      *dst = q;
    }
  } else {
    static_assert(W == 1, "unsupported vector width");
    unsigned int* dst = static_cast<unsigned int*>(p);
    ONNX_NORM_CHECK_ALIGNED(dst);
    *dst = w[0];
  }
}

template <typename T, int N, bool kReadOnly>
__device__ __forceinline__ void LoadConverted(const T* p, float (&out)[N]) {
  if constexpr (N * sizeof(T) < 4) {
    static_assert(N == 1, "a sub-word access is a single 16-bit element");
    out[0] = ToFloat(kReadOnly ? __ldg(p) : *p);
  } else {
    constexpr int kWords = N * static_cast<int>(sizeof(T)) / 4;
    uint32_t w[kWords];
    LoadWords<kWords, kReadOnly>(p, w);
#pragma unroll
    for (int i = 0; i < kWords; ++i) WordCodec<T>::Unpack(w[i], out + i * WordCodec<T>::kValues);
  }
}

// Read-only data (X, Skip, Scale, Bias) goes through the non-coherent path: nothing in the launch
// writes it.
template <typename T, int N>
__device__ __forceinline__ void LoadVector(const T* p, float (&out)[N]) {
  LoadConverted<T, N, true>(p, out);
}

// Shared memory holds rows that do not fit in registers; each thread reads back only what it wrote.
template <typename T, int N>
__device__ __forceinline__ void LoadVectorShared(const T* p, float (&out)[N]) {
  LoadConverted<T, N, false>(p, out);
}

// Global data written earlier in the same launch (the uncached kernel's Sum): an ordinary, coherent load.
template <typename T, int N>
__device__ __forceinline__ void LoadVectorCoherent(const T* p, float (&out)[N]) {
  LoadConverted<T, N, false>(p, out);
}

template <typename T, int N, bool kGlobal>
__device__ __forceinline__ void StoreConverted(T* p, const float (&in)[N]) {
  if constexpr (N * sizeof(T) < 4) {
    static_assert(N == 1, "a sub-word access is a single 16-bit element");
    *p = FromFloat<T>(in[0]);
  } else {
    constexpr int kWords = N * static_cast<int>(sizeof(T)) / 4;
    uint32_t w[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = WordCodec<T>::Pack(in + i * WordCodec<T>::kValues);
    StoreWords<kWords, kGlobal>(p, w);
  }
}

template <typename T, int N>
__device__ __forceinline__ void StoreVector(T* p, const float (&in)[N]) {
  StoreConverted<T, N, true>(p, in);
}

template <typename T, int N>
__device__ __forceinline__ void StoreVectorShared(T* p, const float (&in)[N]) {
  StoreConverted<T, N, false>(p, in);
}

template <typename T>
__device__ __forceinline__ float LoadScalar(const T* p) {
  return ToFloat(__ldg(p));
}

}  // namespace cuda
}  // namespace onnx_norm
