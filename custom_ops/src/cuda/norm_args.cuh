// Parameters of one kernel launch, shared by the host-side launcher (launch.cu, no device code) and every
// norm kernel (norm_kernels.cuh, cluster_row_kernel.cuh); a row op's kernel has a block of its own, in its header.
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
  // Rows of Scale/Bias, one per row group (scale_size == cols then): row r reads row r % scale_groups.
  int scale_groups;
  float epsilon;
  bool epsilon_outside;  // 1 / (sqrt(var) + epsilon) instead of 1 / sqrt(var + epsilon)
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
  int scale_type;  // also Bias's type; float32 when none is given
  int y_type;
  int normalized_type;
  int multiply_type;
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
