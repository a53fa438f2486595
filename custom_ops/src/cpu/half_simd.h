// fp16/bf16 <-> fp32 row conversions with the F16C/AVX2 instructions where the CPU has them (chosen at run
// time, the library itself targets baseline x86-64), else the portable conversions of float_convert.h.
#pragma once

#include <cstdint>

namespace onnx_norm {
namespace cpu {

void HalfToFloat(const uint16_t* src, float* dst, int64_t n);
void FloatToHalf(const float* src, uint16_t* dst, int64_t n);
// v = float(half(v)) in place.
void RoundToHalf(float* v, int64_t n);

// The same for bfloat16 (AVX2 where available).
void BFloatToFloat(const uint16_t* src, float* dst, int64_t n);
void FloatToBFloat(const float* src, uint16_t* dst, int64_t n);
void RoundToBFloat(float* v, int64_t n);

}  // namespace cpu
}  // namespace onnx_norm
