// Branch-free float16 / bfloat16 <-> float32 conversions, round to nearest even, NaN and Inf preserved.
// Written as plain integer/float arithmetic with selects so that GCC can vectorise loops that use them
// (baseline x86-64 has no F16C). They rely on the default FP environment (round to nearest, no -ffast-math).
#pragma once

#include <algorithm>

#include <cstdint>
#include <cstring>

namespace onnx_norm {

// ONNX / ORT element type codes used everywhere in the library.
enum ElemType : int { kUndefined = 0, kFloat = 1, kFloat16 = 10, kBFloat16 = 16 };

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float Half2Float(uint16_t h) {
  // Integer re-biasing for normal numbers, an exact int->float conversion for subnormals, all
  // computed and selected without branches, and without producing float subnormals on the way
  // (those cost a microcode assist per operation on x86).
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  const uint32_t normal = (em << 13) + ((127u - 15u) << 23);
  const uint32_t inf_nan = (em << 13) | 0x7F800000u;
  const uint32_t subnormal = FloatBits(static_cast<float>(static_cast<int32_t>(em)) * 0x1.0p-24f);
  const uint32_t magnitude = em >= 0x7C00u ? inf_nan : (em >= 0x0400u ? normal : subnormal);
  return BitsFloat(sign | magnitude);
}

inline uint16_t Float2Half(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // |f| >= 65536 (after rounding everything from 65520 up overflows too, through the normal path):
  // Inf, or a quiet NaN.
  const uint32_t overflow = a > 0x7F800000u ? 0x7E00u : 0x7C00u;
  // Normal halves: re-bias the exponent, round the 13 dropped mantissa bits to nearest even.
  const uint32_t normal = (a + ((15u - 127u) << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal halves and zero (|f| < 2^-14): adding 0.5 lines the half's subnormal ulp (2^-24) up
  // with the float ulp of 0.5, so the FPU's own round-to-nearest-even does the rounding.
  const uint32_t subnormal = FloatBits(BitsFloat(a) + 0.5f) - 0x3F000000u;
  const uint32_t magnitude = a >= 0x47800000u ? overflow : (a >= 0x38800000u ? normal : subnormal);
  return static_cast<uint16_t>(sign | magnitude);
}

inline float BFloat2Float(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t Float2BFloat(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  // A NaN must stay a NaN (rounding could carry its payload into the exponent or clear it): quiet it.
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? ((u >> 16) | 0x40u) : rounded);
}

// round_T(v) of docs/ops.md: convert to T and back.
inline float RoundTo(float v, int type) {
  switch (type) {
    case kFloat16:
      return Half2Float(Float2Half(v));
    case kBFloat16:
      return BFloat2Float(Float2BFloat(v));
    default:
      return v;
  }
}

// exp(x), branch-free so that a loop of it vectorises with baseline SSE2 (std::exp does not): x = n ln2 + r with
// |r| <= ln2/2 (Cody-Waite, round to nearest by the 1.5 * 2^23 trick, which needs no SSE4.1 rounding instruction),
// e^r by its degree-6 Taylor polynomial (relative error < 2e-7 there), times 2^n built in the exponent bits.
// Arguments are clamped to [-87, 87]: a logistic function of them is 0 or 1 in float32 beyond.
inline __attribute__((always_inline)) float VectorisableExp(float x) {
  x = std::min(87.0f, std::max(-87.0f, x));
  const float shifted = x * 1.44269504f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  return p * BitsFloat(static_cast<uint32_t>(e) << 23);
}

}  // namespace onnx_norm
