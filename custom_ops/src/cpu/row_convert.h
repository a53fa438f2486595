// Rows between a float32, float16 or bfloat16 buffer and float32, the CPU kernels' one copy of each: the
// conversions are half_simd's (F16C/AVX2 where the machine has them), called once per row, outside the loops.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/float_convert.h"
#include "cpu/half_simd.h"

namespace onnx_norm {
namespace cpu {

// Bytes per element of a float type (float32: 4, the 16-bit ones: 2).
inline size_t ElemSize(int type) { return type == kFloat ? 4 : 2; }

// `n` elements of a float32, float16 or bfloat16 buffer as float32 (an input stage's loads).
inline void LoadFloats(const void* src, int type, float* dst, int64_t n) {
  if (type == kFloat16) {
    HalfToFloat(static_cast<const uint16_t*>(src), dst, n);
  } else if (type == kBFloat16) {
    BFloatToFloat(static_cast<const uint16_t*>(src), dst, n);
  } else {
    std::copy_n(static_cast<const float*>(src), n, dst);
  }
}

// `n` float32 values written to a buffer of `type` (rounded to nearest even for the 16-bit types).
inline void StoreFloats(const float* src, int type, void* dst, int64_t n) {
  if (type == kFloat16) {
    FloatToHalf(src, static_cast<uint16_t*>(dst), n);
  } else if (type == kBFloat16) {
    FloatToBFloat(src, static_cast<uint16_t*>(dst), n);
  } else {
    std::copy_n(src, n, static_cast<float*>(dst));
  }
}

// `v` rounded in place to `type`, a rounding attribute's type (0 or FLOAT: left as it is).
inline void RoundFloats(float* v, int64_t n, int type) {
  if (type == kFloat16) {
    RoundToHalf(v, n);
  } else if (type == kBFloat16) {
    RoundToBFloat(v, n);
  }
}

// A Scale/Bias-like parameter as float32 (empty when the input is absent): converted once per call.
inline std::vector<float> ParameterFloats(const void* data, int type, int64_t n) {
  std::vector<float> out;
  if (data == nullptr) return out;
  out.resize(static_cast<size_t>(n));
  LoadFloats(data, type, out.data(), n);
  return out;
}

}  // namespace cpu
}  // namespace onnx_norm
