// fp16/bf16 <-> fp32 row conversions, and fused fp16/bf16 row kernels, with the F16C/AVX2 instructions
// where the CPU has them (chosen at run time; the library itself targets baseline x86-64), else the
// portable conversions of float_convert.h.
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

// Whether NormRow16 can run on this CPU (x86-64 with AVX2 and F16C).
bool Fused16Available();

// dst = float(round_T(x + skip)) for fp16 (half true) or bf16 rows, and Sum = the same values in T
// (sum may be null), in one pass. Only where Fused16Available().
void AddSkip16(bool half, const uint16_t* x, const uint16_t* skip, uint16_t* sum, float* dst, int64_t n);

// One row of LayerNorm (rms false) or RMSNorm, X and Y both fp16 (half true) or both bf16, no
// rounding attributes: conversions happen in registers, no intermediate buffer. Same arithmetic and
// summation order as the generic kernels, so the results are bit-identical to theirs.
// scale/bias: float, `period` elements repeating along the row, or null.
// epsilon_outside: 1 / (sqrt(var) + epsilon) instead of 1 / sqrt(var + epsilon).
void NormRow16(bool half, const uint16_t* x, uint16_t* y, int64_t n, bool rms, float epsilon, bool epsilon_outside,
               const float* scale, const float* bias, int64_t period, float* mean, float* inv_std);

// One row of the (rounded, where normalized_type/multiply_type are set) normalisation of docs/ops.md into an
// fp16 (half_out true) or bf16 Y:
// y = round_Y(round_M(round_M(round_N((x - center) * r) * scale) + bias)), round_T the rounding to T
// (0: none), in registers; the same operations in the same order as the generic kernel, so bit-identical
// to it. x is the row in float. Only where Fused16Available().
void NormalizeRounded16(bool half_out, const float* x, uint16_t* y, int64_t n, float center, float r,
                        const float* scale, const float* bias, int64_t period, int normalized_type,
                        int multiply_type);

}  // namespace cpu
}  // namespace onnx_norm
