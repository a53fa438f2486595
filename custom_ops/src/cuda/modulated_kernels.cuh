// The modulated (adaLN) norm kernel: y = norm(x) [* Scale + Bias], then * round_m(1 + ModScale[sample]) +
// ModShift[sample], every step rounded as docs/ops.md says. Built from the shared pieces of the norm kernels
// (vector_io.cuh loads/stores and conversions, element_types.cuh rounding, reduce.cuh group sums); statistics in
// float32, LayerNorm's variance a second pass over the row held in registers.
#pragma once

#include <cstdint>

#include "element_types.cuh"
#include "kernel_config.cuh"
#include "norm_args.cuh"
#include "reduce.cuh"
#include "vector_io.cuh"

namespace onnx_norm {
namespace cuda {

// A unit of N elements of X held as 32-bit words: a 16-byte vector (4 words) or one element (its float bits).
template <typename TX, int N>
struct Unit {
  static constexpr int kWords = N == 1 ? 1 : 4;

  __device__ __forceinline__ static void Load(const TX* p, uint32_t (&w)[kWords]) {
    if constexpr (N == 1) {
      w[0] = __float_as_uint(LoadScalar(p));
    } else {
      LoadWords<kWords, true>(p, w);
    }
  }

  __device__ __forceinline__ static void Unpack(const uint32_t (&w)[kWords], float (&v)[N]) {
    if constexpr (N == 1) {
      v[0] = __uint_as_float(w[0]);
    } else {
#pragma unroll
      for (int j = 0; j < kWords; ++j) WordCodec<TX>::Unpack(w[j], v + j * WordCodec<TX>::kValues);
    }
  }
};

// N values of a tensor whose type is a runtime (grid-uniform) choice.
template <int N>
__device__ __forceinline__ void LoadTyped(const void* p, int type, int64_t offset, float (&v)[N]) {
  if (type == kFloat16) {
    LoadVector<__half, N>(static_cast<const __half*>(p) + offset, v);
  } else if (type == kBFloat16) {
    LoadVector<__nv_bfloat16, N>(static_cast<const __nv_bfloat16*>(p) + offset, v);
  } else {
    LoadVector<float, N>(static_cast<const float*>(p) + offset, v);
  }
}

template <int N>
__device__ __forceinline__ void StoreTyped(void* p, int type, int64_t offset, const float (&v)[N]) {
  if (type == kFloat16) {
    StoreVector<__half, N>(static_cast<__half*>(p) + offset, v);
  } else if (type == kBFloat16) {
    StoreVector<__nv_bfloat16, N>(static_cast<__nv_bfloat16*>(p) + offset, v);
  } else {
    StoreVector<float, N>(static_cast<float*>(p) + offset, v);
  }
}

// Columns [col, col + N) of one row: normalise, the norm's affine, the modulation, store.
template <int N>
__device__ __forceinline__ void ModulateAndStore(const ModulatedArgs& a, float mean, float inv, int64_t mod_row,
                                                 int64_t offset, int col, float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = (v[i] - mean) * inv;
  RoundTo<N>(v, a.normalized_type);
  float p[N];
  if (a.scale != nullptr) {
    LoadTyped<N>(a.scale, a.scale_type, col, p);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] *= p[i];
    RoundTo<N>(v, a.multiply_type);
  }
  if (a.bias != nullptr) {
    LoadTyped<N>(a.bias, a.scale_type, col, p);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] += p[i];
    RoundTo<N>(v, a.multiply_type);
  }
  LoadTyped<N>(a.mod_scale, a.scale_type, mod_row + col, p);
#pragma unroll
  for (int i = 0; i < N; ++i) p[i] += 1.0f;
  RoundTo<N>(p, a.multiply_type);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] *= p[i];
  RoundTo<N>(v, a.multiply_type);
  LoadTyped<N>(a.mod_shift, a.scale_type, mod_row + col, p);
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] += p[i];
  RoundTo<N>(v, a.multiply_type);
  StoreTyped<N>(a.y, a.y_type, offset, v);
}

// `group` threads per row, blockDim.x / group rows per block, blocks looping over rows. Every thread runs the same
// iterations (a row slot past the last row is an empty row), so block-wide sums (group > 32) miss no thread.
// Launch bounds: up to 1024 threads and at least one block per SM, i.e. 64 registers; without the minimum, ptxas
// aimed at two 1024-thread blocks (32 registers) and spilled in the scalar-unit and re-reading variants.
template <typename TX, int N, bool kCached>
__global__ void __launch_bounds__(kModulatedMaxBlock, 1) ModulatedNormKernel(ModulatedArgs a) {
  using U = Unit<TX, N>;
  constexpr int kSlots = kCached ? kModulatedUnits : 1;
  __shared__ ReduceScratch scratch;
  int parity = 0;
  const RowGroups rows(a.group);
  const int group = rows.group;
  const int rank = rows.rank;
  const int units = a.cols / N;
  const TX* x = static_cast<const TX*>(a.x);
  for (int64_t first = rows.first(); first < a.rows; first += rows.step) {
    const int64_t row = first + rows.slot;
    const int live_units = row < a.rows ? units : 0;
    const int64_t base = row * a.cols;

    uint32_t w[kSlots][U::kWords];
    float sum = 0.0f;
    if constexpr (kCached) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int k = rank + i * group;
        if (k < live_units) {
          U::Load(x + base + k * N, w[i]);
        } else {
#pragma unroll
          for (int j = 0; j < U::kWords; ++j) w[i][j] = 0u;
        }
      }
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        float v[N];
        U::Unpack(w[i], v);
#pragma unroll
        for (int j = 0; j < N; ++j) sum = a.rms ? fmaf(v[j], v[j], sum) : sum + v[j];
      }
    } else {
      for (int k = rank; k < live_units; k += group) {
        float v[N];
        LoadVector<TX, N>(x + base + k * N, v);
#pragma unroll
        for (int j = 0; j < N; ++j) sum = a.rms ? fmaf(v[j], v[j], sum) : sum + v[j];
      }
    }

    float mean = 0.0f;
    float inv;
    if (a.rms) {
      inv = 1.0f / sqrtf(GroupSum(sum, group, scratch, parity) / a.cols + a.epsilon);
    } else {
      mean = GroupSum(sum, group, scratch, parity) / a.cols;
      float squares = 0.0f;
      if constexpr (kCached) {
#pragma unroll
        for (int i = 0; i < kSlots; ++i) {
          if (rank + i * group < live_units) {
            float v[N];
            U::Unpack(w[i], v);
#pragma unroll
            for (int j = 0; j < N; ++j) squares = fmaf(v[j] - mean, v[j] - mean, squares);
          }
        }
      } else {
        for (int k = rank; k < live_units; k += group) {
          float v[N];
          LoadVector<TX, N>(x + base + k * N, v);
#pragma unroll
          for (int j = 0; j < N; ++j) squares = fmaf(v[j] - mean, v[j] - mean, squares);
        }
      }
      // IEEE sqrt and division, not rsqrtf's approximation: once per row.
      inv = 1.0f / sqrtf(GroupSum(squares, group, scratch, parity) / a.cols + a.epsilon);
    }
    if (live_units == 0) continue;

    // 32-bit division (the launcher keeps rows below 2^31): a 64-bit one is a subroutine call, whose calling
    // convention made ptxas spill.
    const int64_t sample = a.mod_broadcast ? 0 : static_cast<uint32_t>(row) / static_cast<uint32_t>(a.rows_per_sample);
    const int64_t mod_row = sample * a.cols;
    if constexpr (kCached) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int k = rank + i * group;
        if (k < live_units) {
          float v[N];
          U::Unpack(w[i], v);
          ModulateAndStore<N>(a, mean, inv, mod_row, base + k * N, k * N, v);
        }
      }
    } else {
      for (int k = rank; k < live_units; k += group) {
        float v[N];
        LoadVector<TX, N>(x + base + k * N, v);
        ModulateAndStore<N>(a, mean, inv, mod_row, base + k * N, k * N, v);
      }
    }
  }
}

// The kernel a configuration of kind kModulatedRow names, for X of type TX (kernel_dispatch.cuh).
template <typename TX>
auto SelectModulatedKernel(const KernelConfig& config) -> void (*)(ModulatedArgs) {
  constexpr int V = 16 / static_cast<int>(sizeof(TX));
  const bool cached = (config.flags & kCachedRowFlag) != 0;
  if ((config.flags & kVectorUnitsFlag) != 0) {
    return cached ? &ModulatedNormKernel<TX, V, true> : &ModulatedNormKernel<TX, V, false>;
  }
  return cached ? &ModulatedNormKernel<TX, 1, true> : &ModulatedNormKernel<TX, 1, false>;
}

}  // namespace cuda
}  // namespace onnx_norm
