#include "cpu/half_simd.h"

#include <cstdlib>
#include <cstring>

#include "common/float_convert.h"

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

__attribute__((target("avx2"))) __m256i RoundedBFloatBits(__m256 f) {
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
