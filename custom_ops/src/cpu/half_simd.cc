#include "cpu/half_simd.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/float_convert.h"
#include "cpu/row_math.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ONNX_NORM_X86 1
#endif

namespace onnx_norm {
namespace cpu {
namespace {

void HalfToFloatPortable(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Half2Float(src[i]);
}
void FloatToHalfPortable(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Float2Half(src[i]);
}
void RoundToHalfPortable(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = Half2Float(Float2Half(v[i]));
}

#ifdef ONNX_NORM_X86
// vcvtph2ps / vcvtps2ph convert exactly like the portable code (round to nearest even, NaN kept).
__attribute__((target("avx,f16c"))) void HalfToFloatF16C(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  HalfToFloatPortable(src + i, dst + i, n - i);
}

__attribute__((target("avx,f16c"))) void FloatToHalfF16C(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  FloatToHalfPortable(src + i, dst + i, n - i);
}

__attribute__((target("avx,f16c"))) void RoundToHalfF16C(float* v, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(v + i, _mm256_cvtph_ps(h));
  }
  RoundToHalfPortable(v + i, n - i);
}

// bfloat16 is the top half of a float: widening is a shift; narrowing rounds to nearest even on the
// dropped 16 bits and keeps NaNs quiet NaNs, as Float2BFloat does.
__attribute__((target("avx2"))) void BFloatToFloatAVX2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(w, 16));
  }
  for (; i < n; ++i) dst[i] = BFloat2Float(src[i]);
}

inline __attribute__((target("avx2"), always_inline)) __m256i RoundedBFloatBits(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i quiet_nan = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  // The bfloat16 value in the upper 16 bits of each lane.
  return _mm256_and_si256(_mm256_blendv_epi8(rounded, quiet_nan, is_nan), _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
}

__attribute__((target("avx2"))) void FloatToBFloatAVX2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_srli_epi32(RoundedBFloatBits(_mm256_loadu_ps(src + i)), 16);
    // packus works within 128-bit lanes: pack, then gather the two lane halves.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) dst[i] = Float2BFloat(src[i]);
}

__attribute__((target("avx2"))) void RoundToBFloatAVX2(float* v, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(v + i), RoundedBFloatBits(_mm256_loadu_ps(v + i)));
  }
  for (; i < n; ++i) v[i] = BFloat2Float(Float2BFloat(v[i]));
}

// ONNX_NORM_CPU_SIMD=0 in the environment selects the portable conversions (to test or debug them).
bool SimdAllowed() {
  const char* value = std::getenv("ONNX_NORM_CPU_SIMD");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

bool HasAVX2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return SimdAllowed() && __builtin_cpu_supports("avx2");
  }();
  return has;
}

bool HasF16C() {
  static const bool has = [] {
    __builtin_cpu_init();
    return SimdAllowed() && __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  }();
  return has;
}
#endif

}  // namespace

void HalfToFloat(const uint16_t* src, float* dst, int64_t n) {
#ifdef ONNX_NORM_X86
  if (HasF16C()) return HalfToFloatF16C(src, dst, n);
#endif
  HalfToFloatPortable(src, dst, n);
}

void FloatToHalf(const float* src, uint16_t* dst, int64_t n) {
#ifdef ONNX_NORM_X86
  if (HasF16C()) return FloatToHalfF16C(src, dst, n);
#endif
  FloatToHalfPortable(src, dst, n);
}

void RoundToHalf(float* v, int64_t n) {
#ifdef ONNX_NORM_X86
  if (HasF16C()) return RoundToHalfF16C(v, n);
#endif
  RoundToHalfPortable(v, n);
}

}  // namespace cpu
}  // namespace onnx_norm

namespace onnx_norm {
namespace cpu {

void BFloatToFloat(const uint16_t* src, float* dst, int64_t n) {
#ifdef ONNX_NORM_X86
  if (HasAVX2()) return BFloatToFloatAVX2(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat2Float(src[i]);
}

void FloatToBFloat(const float* src, uint16_t* dst, int64_t n) {
#ifdef ONNX_NORM_X86
  if (HasAVX2()) return FloatToBFloatAVX2(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = Float2BFloat(src[i]);
}

void RoundToBFloat(float* v, int64_t n) {
#ifdef ONNX_NORM_X86
  if (HasAVX2()) return RoundToBFloatAVX2(v, n);
#endif
  for (int64_t i = 0; i < n; ++i) v[i] = BFloat2Float(Float2BFloat(v[i]));
}

}  // namespace cpu
}  // namespace onnx_norm

#ifdef ONNX_NORM_X86
namespace onnx_norm {
namespace cpu {
namespace {

#define ONNX_NORM_AVX2 __attribute__((target("avx2,f16c"), always_inline)) inline

struct HalfIO {
  ONNX_NORM_AVX2 static __m256 Load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  ONNX_NORM_AVX2 static void Store(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static float LoadOne(uint16_t h) { return Half2Float(h); }
  static uint16_t StoreOne(float f) { return Float2Half(f); }
};

struct BFloatIO {
  ONNX_NORM_AVX2 static __m256 Load(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  ONNX_NORM_AVX2 static void Store(uint16_t* p, __m256 v) {
    const __m256i bits = _mm256_srli_epi32(RoundedBFloatBits(v), 16);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static float LoadOne(uint16_t b) { return BFloat2Float(b); }
  static uint16_t StoreOne(float f) { return Float2BFloat(f); }
};

// sum(x) or sum((x - center)^2) with the lane layout of row_math.h: lanes 0-7 in a0, 8-15 in a1.
template <class IO, bool kSquares>
__attribute__((target("avx2,f16c"))) float SumLanes(const uint16_t* x, int64_t n, float center) {
  __m256 a0 = _mm256_setzero_ps();
  __m256 a1 = _mm256_setzero_ps();
  const __m256 c = _mm256_set1_ps(center);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    __m256 v0 = IO::Load(x + i);
    __m256 v1 = IO::Load(x + i + 8);
    if (kSquares) {
      v0 = _mm256_sub_ps(v0, c);
      v1 = _mm256_sub_ps(v1, c);
      v0 = _mm256_mul_ps(v0, v0);
      v1 = _mm256_mul_ps(v1, v1);
    }
    a0 = _mm256_add_ps(a0, v0);
    a1 = _mm256_add_ps(a1, v1);
  }
  float acc[kLanes];
  _mm256_storeu_ps(acc, a0);
  _mm256_storeu_ps(acc + 8, a1);
  for (int k = 0; i < n; ++i, ++k) {
    if (kSquares) {
      const float d = IO::LoadOne(x[i]) - center;
      acc[k] += d * d;
    } else {
      acc[k] += IO::LoadOne(x[i]);
    }
  }
  return ReduceLanes(acc);
}

// v rounded to `type` (0: left in float) and widened again, in registers.
ONNX_NORM_AVX2 __m256 RoundVec(__m256 v, int type) {
  if (type == kFloat16) return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  if (type == kBFloat16) return _mm256_castsi256_ps(RoundedBFloatBits(v));
  return v;
}

float RoundOne(float v, int type) {
  if (type == kFloat16) return Half2Float(Float2Half(v));
  if (type == kBFloat16) return BFloat2Float(Float2BFloat(v));
  return v;
}

// A float32 row read like the 16-bit ones, so that one normalising loop serves both.
struct FloatIn {
  ONNX_NORM_AVX2 static __m256 Load(const float* p) { return _mm256_loadu_ps(p); }
  static float LoadOne(float f) { return f; }
};

// y = Out(round_M(round_M(round_N((x - center) * r) * scale) + bias)), x read through In (FloatIn, HalfIO,
// BFloatIO); rounding types 0 leave the value in float.
template <class In, class Out, class T>
__attribute__((target("avx2,f16c"))) void NormalizeTo(const T* x, uint16_t* y, int64_t n, float center, float r,
                                                       const float* scale, const float* bias, int64_t period,
                                                       int normalized_type, int multiply_type) {
  const __m256 c = _mm256_set1_ps(center);
  const __m256 rv = _mm256_set1_ps(r);
  for (int64_t start = 0; start < n; start += period) {
    const int64_t len = period < n - start ? period : n - start;
    const T* xs = x + start;
    uint16_t* ys = y + start;
    int64_t j = 0;
    for (; j + 8 <= len; j += 8) {
      __m256 v = RoundVec(_mm256_mul_ps(_mm256_sub_ps(In::Load(xs + j), c), rv), normalized_type);
      if (scale) v = RoundVec(_mm256_mul_ps(v, _mm256_loadu_ps(scale + j)), multiply_type);
      if (bias) v = RoundVec(_mm256_add_ps(v, _mm256_loadu_ps(bias + j)), multiply_type);
      Out::Store(ys + j, v);
    }
    for (; j < len; ++j) {
      float v = RoundOne((In::LoadOne(xs[j]) - center) * r, normalized_type);
      if (scale) v = RoundOne(v * scale[j], multiply_type);
      if (bias) v = RoundOne(v + bias[j], multiply_type);
      ys[j] = Out::StoreOne(v);
    }
  }
}

template <class IO>
__attribute__((target("avx2,f16c"))) void AddSkipWith(const uint16_t* x, const uint16_t* skip, uint16_t* sum,
                                                       float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_add_ps(IO::Load(x + i), IO::Load(skip + i));
    // Sum is rounded to T; the row normalised is the float32 sum (docs/ops.md). Both loads come first: Sum may
    // be X or Skip itself.
    if (sum) IO::Store(sum + i, v);
    _mm256_storeu_ps(dst + i, v);
  }
  for (; i < n; ++i) {
    const float v = IO::LoadOne(x[i]) + IO::LoadOne(skip[i]);
    if (sum) sum[i] = IO::StoreOne(v);
    dst[i] = v;
  }
}

template <class IO>
void NormRowWith(const uint16_t* x, uint16_t* y, int64_t n, bool rms, float epsilon, bool epsilon_outside, const float* scale,
                 const float* bias, int64_t period, float* mean, float* inv_std) {
  float center = 0.0f;
  float var;
  if (rms) {
    var = SumLanes<IO, true>(x, n, 0.0f) / static_cast<float>(n);
  } else {
    center = SumLanes<IO, false>(x, n, 0.0f) / static_cast<float>(n);
    var = SumLanes<IO, true>(x, n, center) / static_cast<float>(n);
  }
  const float r = epsilon_outside ? 1.0f / (std::sqrt(var) + epsilon) : 1.0f / std::sqrt(var + epsilon);
  *mean = center;
  *inv_std = r;
  NormalizeTo<IO, IO>(x, y, n, center, r, scale, bias, period, 0, 0);
}

}  // namespace

bool Fused16Available() { return HasAVX2() && HasF16C(); }

void NormalizeRounded16(bool half_out, const float* x, uint16_t* y, int64_t n, float center, float r,
                        const float* scale, const float* bias, int64_t period, int normalized_type,
                        int multiply_type) {
  if (half_out) {
    NormalizeTo<FloatIn, HalfIO>(x, y, n, center, r, scale, bias, period, normalized_type, multiply_type);
  } else {
    NormalizeTo<FloatIn, BFloatIO>(x, y, n, center, r, scale, bias, period, normalized_type, multiply_type);
  }
}

void AddSkip16(bool half, const uint16_t* x, const uint16_t* skip, uint16_t* sum, float* dst, int64_t n) {
  if (half) {
    AddSkipWith<HalfIO>(x, skip, sum, dst, n);
  } else {
    AddSkipWith<BFloatIO>(x, skip, sum, dst, n);
  }
}

void NormRow16(bool half, const uint16_t* x, uint16_t* y, int64_t n, bool rms, float epsilon, bool epsilon_outside, const float* scale,
               const float* bias, int64_t period, float* mean, float* inv_std) {
  if (half) {
    NormRowWith<HalfIO>(x, y, n, rms, epsilon, epsilon_outside, scale, bias, period, mean, inv_std);
  } else {
    NormRowWith<BFloatIO>(x, y, n, rms, epsilon, epsilon_outside, scale, bias, period, mean, inv_std);
  }
}

}  // namespace cpu
}  // namespace onnx_norm
#else
namespace onnx_norm {
namespace cpu {
bool Fused16Available() { return false; }
void NormalizeRounded16(bool, const float*, uint16_t*, int64_t, float, float, const float*, const float*, int64_t, int,
                        int) {}
void AddSkip16(bool, const uint16_t*, const uint16_t*, uint16_t*, float*, int64_t) {}
void NormRow16(bool, const uint16_t*, uint16_t*, int64_t, bool, float, bool, const float*, const float*, int64_t, float*,
               float*) {}
}  // namespace cpu
}  // namespace onnx_norm
#endif
