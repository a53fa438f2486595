// Branch-free float16 / bfloat16 <-> float32 conversions, round to nearest even, NaN and Inf preserved.
// Written as plain integer/float arithmetic with selects so that GCC vectorises loops that use them
// (baseline x86-64 has no F16C). They rely on the default FP environment (round to nearest, no -ffast-math).
#pragma once

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
  // Shift the half into the top of a word, then rebuild the float: normal numbers by re-biasing the
  // exponent through a multiply (which also maps half Inf/NaN to float Inf/NaN), subnormals by
  // placing the mantissa under a 2^-1 exponent and subtracting 0.5.
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = BitsFloat((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = BitsFloat((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t result = two_w < (1u << 27) ? FloatBits(denormalized) : FloatBits(normalized);
  return BitsFloat(sign | result);
}

inline uint16_t Float2Half(float f) {
  // Scale into the half range so that the float adder performs the round-to-nearest-even of the
  // mantissa (and the overflow to Inf), then extract exponent and mantissa bits.
  const float abs_f = BitsFloat(FloatBits(f) & 0x7FFFFFFFu);
  float base = (abs_f * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = FloatBits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = BitsFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = FloatBits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
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

}  // namespace onnx_norm
