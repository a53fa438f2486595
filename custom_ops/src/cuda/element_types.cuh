// Element types of the norm kernels: ONNX type ids, conversions to and from float32, and the
// rounding steps of docs/ops.md (round_T(v): convert to T with round-to-nearest-even and back).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "norm_args.cuh"

namespace onnx_norm {
namespace cuda {

template <typename T>
struct ElementId;
template <>
struct ElementId<float> {
  static constexpr int value = kFloat32;
};
template <>
struct ElementId<__half> {
  static constexpr int value = kFloat16;
};
template <>
struct ElementId<__nv_bfloat16> {
  static constexpr int value = kBFloat16;
};

// The element type of an ONNX type id: the inverse of ElementId.
template <int kType>
struct ElementOf;
template <>
struct ElementOf<kFloat32> {
  using type = float;
};
template <>
struct ElementOf<kFloat16> {
  using type = __half;
};
template <>
struct ElementOf<kBFloat16> {
  using type = __nv_bfloat16;
};

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// round_T for a pair: the packed conversions are single instructions on sm_80+, so rounding costs
// about one instruction per element.
__device__ __forceinline__ void RoundPairToHalf(float& a, float& b) {
  const float2 r = __half22float2(__floats2half2_rn(a, b));
  a = r.x;
  b = r.y;
}
__device__ __forceinline__ void RoundPairToBFloat16(float& a, float& b) {
  const float2 r = __bfloat1622float2(__floats2bfloat162_rn(a, b));
  a = r.x;
  b = r.y;
}

// Rounds N values to `type` (0 or float32: unchanged). `type` is uniform across the grid, so the
// branch costs one predictable test per call.
template <int N>
__device__ __forceinline__ void RoundTo(float (&v)[N], int type) {
  if (type == kFloat16) {
#pragma unroll
    for (int i = 0; i + 1 < N; i += 2) RoundPairToHalf(v[i], v[i + 1]);
    if (N % 2) v[N - 1] = __half2float(__float2half_rn(v[N - 1]));
  } else if (type == kBFloat16) {
#pragma unroll
    for (int i = 0; i + 1 < N; i += 2) RoundPairToBFloat16(v[i], v[i + 1]);
    if (N % 2) v[N - 1] = __bfloat162float(__float2bfloat16_rn(v[N - 1]));
  }
}

// Rounds to T itself: exact for float, one conversion pair otherwise (the Skip sum in X's type).
template <typename T, int N>
__device__ __forceinline__ void RoundToType(float (&v)[N]) {
  RoundTo<N>(v, ElementId<T>::value);
}

}  // namespace cuda
}  // namespace onnx_norm
