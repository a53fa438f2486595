// Parameters of one kernel launch, shared by the host-side launcher (launch.cu, no device code) and every
// kernel (norm_kernels.cuh, cluster_row_kernel.cuh, modulated_kernels.cuh).
#pragma once

#include <cstdint>

namespace onnx_norm {
namespace cuda {

// ONNXTensorElementDataType values (launch.h): the kernels never see any other id.
constexpr int kFloat32 = 1;
constexpr int kFloat16 = 10;
constexpr int kBFloat16 = 16;

// Everything a kernel needs, passed by value. Built and validated by the launcher (launch.cu).
struct NormArgs {
  const void* x;
  const void* skip;
  const void* scale;
  const void* bias;
  void* y;
  void* sum;
  float* mean;
  float* inv_std;
  int64_t rows;
  int cols;
  int scale_size;
  float epsilon;
  // Threads per row: a power of two >= 8; when > 32 it is the block size (one row per block).
  int group;
  // Element offset of x from the previous 16-byte boundary: vectors start where
  // (x_phase + flat index) % V == 0.
  int x_phase;
  // Every tensor is aligned for a vector access at those starts; when false, all elements are scalar.
  bool vector_ok;
  // Scale and Bias can be read as vectors at the same columns (launch.cu says when).
  bool scale_vector;
  bool rms;
  int scale_type;  // also Bias's type (and the modulation's); float32 when none is given
  int y_type;
  int normalized_type;
  int multiply_type;
};

// The arguments of the modulated kernel (modulated_kernels.cuh): the norm's (named as in NormArgs, which the
// launcher fills alike) and the modulation, ModScale and ModShift, [1 or samples, cols] each, of scale_type;
// rows_per_sample consecutive rows share one modulation row (every row the first when mod_broadcast). A block of
// its own, in this order, rather than NormArgs extended: with NormArgs' fields first, ptxas spilled in two of the
// kernels on sm_100 (and a larger NormArgs made register-row kernels spill on sm_90).
struct ModulatedArgs {
  const void* x;
  const void* scale;  // the norm's own Scale/Bias, scale_type; may be null
  const void* bias;
  const void* mod_scale;
  const void* mod_shift;
  void* y;
  int64_t rows;
  int64_t rows_per_sample;
  bool mod_broadcast;
  int cols;
  int group;  // threads per row, a power of two >= 8; when > 32 the block size (one row per block)
  float epsilon;
  bool rms;
  int scale_type;  // Scale, Bias, ModScale, ModShift
  int y_type;
  int normalized_type;
  int multiply_type;
};

// The arguments of GroupNorm's kernel (group_norm_kernels.cuh): a row is one group of one sample (rows = N * G,
// cols = C / G * spatial); Scale and Bias, [C] of scale_type, are read at channel
// (row % groups) * group_channels + col / spatial. The fields RowStatistics reads are named as in ModulatedArgs.
struct GroupNormArgs {
  const void* x;
  const void* scale;
  const void* bias;
  void* y;
  int64_t rows;
  int cols;
  int group;  // threads per row, a power of two >= 8; when > 32 the block size (one row per block)
  float epsilon;
  bool rms;  // false: RowStatistics' LayerNorm statistics
  int scale_type;
  int y_type;
  int normalized_type;
  int multiply_type;
  int spatial;
  int groups;
  int group_channels;
  int activation;  // 0 none, 1 SiLU
};

// Scratch for cross-warp sums: two buffers used alternately, so consecutive reductions need one
// barrier each (a thread past the barrier of reduction k+1 knows every thread has finished reading
// the buffer of reduction k, which reduction k+2 overwrites).
struct ReduceScratch {
  float partial[2][32];
};

// The most blocks a cluster splits a row over: 8 is the portable cluster size (any sm_90 GPU can launch it).
constexpr int kMaxClusterSize = 8;
// At the start of the cluster kernel's dynamic shared memory (it has no static shared memory, so that each
// block of a cluster has its own in the CPU emulator too): the block's reduction scratch, its partial sums
// that the cluster's other blocks read (two buffers used alternately, like ReduceScratch), and the row's
// scalar ends (at most 2 * (V - 1) elements, rank 0 only). The row's slice follows.
struct ClusterShared {
  ReduceScratch scratch;
  float partial[2];
  float pad[2];
  uint32_t scalars[16];
};
static_assert(sizeof(ClusterShared) % 16 == 0, "the slice that follows is read as 16-byte vectors");

}  // namespace cuda
}  // namespace onnx_norm
