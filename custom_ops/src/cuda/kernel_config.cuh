// How one kernel is launched (chosen by launch.cu), and the per-X-type entry points that launch it.
// Host code only: launch.cu includes no device code, so the CPU emulator of the kernels
// (tools/gpu_harness/emulator.cc) can run the launcher's real configuration logic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <type_traits>

#include "norm_args.cuh"

namespace onnx_norm {
namespace cuda {

// kRowOp: the kernel of a row op (row_op_kernels.cuh), the one its argument block names (Args::Kernel).
enum class KernelKind { kRegisterRow, kSharedRowCached, kSharedRowUncached, kClusterRow, kRowOp };

// Compile-time variants of the register-row kernel (RegisterRowKernel's kFlags): what would otherwise be
// uniform runtime branches between a row's loads, which keep the compiler from issuing them back to back.
enum RegisterRowFlags : int {
  kSkipFlag = 1,    // SkipLayerNorm / SkipRMSNorm: X + Skip, optional Sum
  kRmsFlag = 2,     // RMSNorm: no mean
  kNativeFlag = 4,  // Y, Scale and Bias in X's type: Scale/Bias prefetched as words with the row's loads
  kFlagCombinations = 8,
};

// Variants of a row op's kernel (row_op_kernels.cuh): the row read in units of one 16-byte vector (else single
// elements), and held in registers, up to kRowOpUnits units per thread (else read again from global memory, L2,
// for the variance and the output).
enum RowOpFlags : int {
  kVectorUnitsFlag = 1,
  kCachedRowFlag = 2,
};
constexpr int kRowOpUnits = 4;
constexpr int kRowOpMaxBlock = 1024;

// The units of X a row op's thread holds in registers for X of `element_size` bytes: kRowOpUnits, or what its
// argument block says (`static constexpr int CachedUnits(int element_size)`: an op whose input stage holds float32
// values, N words a unit, holds fewer 16-bit units in the same registers). The launcher's row configuration and the
// kernel's row state both read it.
template <typename Args, typename = void>
struct RowOpUnits {
  static constexpr int For(int /*element_size*/) { return kRowOpUnits; }
};
template <typename Args>
struct RowOpUnits<Args, std::void_t<decltype(Args::CachedUnits(4))>> {
  static constexpr int For(int element_size) { return Args::CachedUnits(element_size); }
};

// Values of vectors_per_thread that are instantiated (16-byte vectors of X held per thread).
constexpr int kMaxVectorsPerThread = 4;
// Launch bounds of the register-row kernel: up to 512 threads per block, and with up to 2 vectors
// per thread two such blocks per SM (64 registers, >= 32 warps per SM); 4 vectors need 128.
constexpr int RegisterRowMaxBlock(int /*vectors_per_thread*/) { return 512; }
constexpr int RegisterRowMinBlocks(int vectors_per_thread) { return vectors_per_thread >= 4 ? 1 : 2; }

// The cluster kernel (ClusterRowKernel): vectors a thread loads before it uses any, and the least slice of
// a row (16-byte vectors) worth a block of its own when rows are split only because there are few of them.
constexpr int kClusterBatch = 4;
// Launch bounds of the cluster kernel: 512 threads, up to 128 registers for the batch's 2 x 4 vectors
// (at 1024 threads ptxas has 64 and spills).
constexpr int kClusterMaxBlock = 512;
constexpr int kMinSliceVectors = 128;

struct KernelConfig {
  KernelKind kind = KernelKind::kRegisterRow;
  int vectors_per_thread = 1;  // kRegisterRow only: 1, 2 or 4
  int flags = 0;               // kRegisterRow: RegisterRowFlags; kRowOp: RowOpFlags
  int group = 8;               // threads per row (NormArgs::group)
  int block = 128;
  unsigned grid = 1;
  size_t shared_bytes = 0;   // dynamic shared memory, kSharedRowCached and kClusterRow only
  int max_shared_bytes = 0;  // the device's opt-in limit, kSharedRowCached and kClusterRow only
  int cluster = 1;           // blocks per cluster (one row each), kClusterRow only
  int device = 0;
};

// The launch of the kernel `config` names, for X of ONNX type kXType (kFloat32, kFloat16, kBFloat16) and the
// argument block of its op (NormArgs, or a row op's own block). Returns the launch status (cudaGetLastError).
// Defined by norm_launch.cuh (the CPU emulator, tools/gpu_harness/emulator.cc, defines its own) and instantiated
// by ONNX_NORM_INSTANTIATE_LAUNCH in the translation unit of each op: NormArgs one per X type (norm_float32.cu,
// norm_float16.cu, norm_bfloat16.cu) so that builds compile them in parallel, a row op's in its own cuda/<op>.cu.
template <int kXType, typename Args>
cudaError_t LaunchKernel(const Args& args, const KernelConfig& config, cudaStream_t stream);

#define ONNX_NORM_INSTANTIATE_LAUNCH(x_type, Args) \
  template cudaError_t LaunchKernel<x_type, Args>(const Args&, const KernelConfig&, cudaStream_t);

// A row op's launch for every X type the kernels read (one list of them for every row op's cuda/<op>.cu).
#define ONNX_NORM_INSTANTIATE_ROW_OP_LAUNCH(Args)  \
  ONNX_NORM_INSTANTIATE_LAUNCH(kFloat32, Args) \
  ONNX_NORM_INSTANTIATE_LAUNCH(kFloat16, Args) \
  ONNX_NORM_INSTANTIATE_LAUNCH(kBFloat16, Args)

}  // namespace cuda
}  // namespace onnx_norm
