// LaunchNorm (launch.h), the one launcher of every op: for the norms and their Skip forms, validates the
// parameters (PrepareNorm), picks a kernel configuration from the row length and the pointers' alignment
// (ChooseNormConfig), makes the tensors' device current and launches on the given stream, dispatching on X's type;
// for a row op, runs the launcher registered under its name (row_op_launch.h), which shares the device, the grid
// and the dispatch (launch_common.h). No allocation, no synchronisation, no stream query: safe inside CUDA graph
// capture. Host code only, so that the CPU emulator (tools/gpu_harness/emulator.cc) runs it.
#include "launch.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "kernel_config.cuh"
#include "launch_common.h"
#include "row_op_launch.h"

namespace onnx_norm {
namespace cuda {
namespace {

// The pieces every launcher shares: sizes, errors, overlap, the device and its cached attributes.
using namespace launch;  // NOLINT(build/namespaces): launch_common.h, inside this file's anonymous namespace

// ------------------------------------------------------------------ LayerNorm, RMSNorm and their Skip forms

int CheckNorm(const NormLaunchParams& p, const char** error) {
  const bool has_parameters = p.scale != nullptr || p.bias != nullptr;
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(OutputType(p));
  const int parameter_size = has_parameters ? ElementSize(p.scale_type) : 4;
  if (p.sum != nullptr && p.skip == nullptr) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: the Sum output needs a Skip input", error);
  }
  if (p.rms && (p.mean != nullptr || p.bias != nullptr)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: RMSNorm has no Mean output and no Bias input", error);
  }
  if (has_parameters && (p.scale_size <= 0 || p.scale_size > p.cols || p.cols % p.scale_size != 0)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: scale_size must divide cols (Scale/Bias cover a suffix of the row)",
                error);
  }
  if (p.scale_groups < 1 || (p.scale_groups > 1 && (!has_parameters || p.scale_size != p.cols ||
                                                    p.rows % p.scale_groups != 0 ||
                                                    p.scale_groups > INT_MAX / p.cols))) {
    return Fail(cudaErrorInvalidValue,
                "LaunchNorm: scale_groups rows of Scale/Bias must each cover the whole row and divide rows", error);
  }
  if (!AlignedTo(p.x, x_size) || !AlignedTo(p.skip, x_size) || !AlignedTo(p.sum, x_size) || !AlignedTo(p.y, y_size) ||
      !AlignedTo(p.scale, parameter_size) || !AlignedTo(p.bias, parameter_size) || !AlignedTo(p.mean, 4) ||
      !AlignedTo(p.inv_std, 4)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: a tensor is not aligned to its element size", error);
  }
  // In-place: Sum may be X or Skip itself (each element is read before the thread that read it writes
  // it, and the kernel that reads the row twice re-reads Sum, not X + Skip); any other overlap of an
  // output with an input would read values already overwritten.
  const int64_t x_bytes = p.rows * p.cols * x_size;
  const int64_t y_bytes = p.rows * p.cols * y_size;
  if ((p.sum != p.x && Overlap(p.sum, x_bytes, p.x, x_bytes)) ||
      (p.sum != p.skip && Overlap(p.sum, x_bytes, p.skip, x_bytes)) || Overlap(p.y, y_bytes, p.x, x_bytes) ||
      Overlap(p.y, y_bytes, p.skip, x_bytes) || Overlap(p.y, y_bytes, p.sum, x_bytes)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: outputs may not overlap the inputs (except Sum onto X or Skip)",
                error);
  }
  return 0;
}

// Checks the parameters of a norm (rows == 0: types and sizes only) and fills `args`.
int PrepareNorm(const NormLaunchParams& p, NormArgs* args, const char** error) {
  const bool has_parameters = p.scale != nullptr || p.bias != nullptr;
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(OutputType(p));
  const int parameter_size = has_parameters ? ElementSize(p.scale_type) : 4;
  if (x_size == 0 || y_size == 0 || parameter_size == 0 || !IsRoundingType(p.normalized_type) ||
      !IsRoundingType(p.multiply_type)) {
    return Fail(kUnsupportedTypes,
                "LaunchNorm: X, Scale/Bias, Y and the rounding types must be float32, float16 or bfloat16",
                error);
  }
  if (p.rows < 0 || p.cols <= 0 || p.cols > INT_MAX) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: rows must be >= 0 and cols in [1, 2^31 - 1]", error);
  }
  if (p.rows == 0) return 0;
  if (p.x == nullptr || p.y == nullptr) return Fail(cudaErrorInvalidValue, "LaunchNorm: X and Y are required", error);
  if (const int rc = CheckNorm(p, error)) return rc;

  SetCommonArgs(p, args);
  args->skip = p.skip;
  args->sum = p.sum;
  args->mean = p.mean;
  args->inv_std = p.inv_std;
  args->epsilon_outside = p.op_ints[0] != 0;  // the norms' own int (launch.h)
  args->scale_size = has_parameters ? static_cast<int>(p.scale_size) : args->cols;
  args->scale_groups = has_parameters ? static_cast<int>(p.scale_groups) : 1;
  args->scale_type = has_parameters ? p.scale_type : kFloat32;
  const int vector = 16 / x_size;
  args->x_phase = static_cast<int>(reinterpret_cast<uintptr_t>(p.x) % 16) / x_size;
  args->vector_ok = VectorAligned(p.skip, x_size, args->x_phase, vector) &&
                    VectorAligned(p.sum, x_size, args->x_phase, vector) &&
                    VectorAligned(p.y, y_size, args->x_phase, vector);
  if (args->vector_ok && has_parameters && args->cols % vector == 0) {
    // Every row starts `head` elements before a vector boundary; the parameter vectors at columns
    // head + k * V must be aligned and, when Scale repeats along the row, must not straddle a repeat.
    const int head = (vector - args->x_phase) % vector;
    const bool fits = args->scale_size == args->cols || (head == 0 && args->scale_size % vector == 0);
    args->scale_vector = fits && VectorAligned(p.scale, parameter_size, (vector - head) % vector, vector) &&
                         VectorAligned(p.bias, parameter_size, (vector - head) % vector, vector);
  }
  return 0;
}

// Register-resident rows (the row in 16-byte vectors across `group` threads, up to 4 vectors each):
//   - at most 32 vectors (256 16-bit or 128 float32 values): one vector per thread, 8 to 32 threads
//     per row, 128-thread blocks of 4 to 16 rows;
//   - up to 1024 vectors (8192 16-bit or 4096 float32 values): 2 vectors per thread, 16 to 512 threads
//     per row (blocks of 128 threads, or one row per block); launch bounds of 64 registers keep at
//     least 32 warps per SM, with X's and Skip's 2 + 2 loads per thread in flight;
//   - up to 2048 vectors: 4 vectors per thread, 512 threads per row.
// Longer rows, or pointers that cannot be read as vectors, go to the shared-memory kernel
// (kSharedRowCached here; the launcher demotes it to kSharedRowUncached when the row does not fit in
// the device's shared memory).
KernelConfig ChooseSingleBlockConfig(const NormArgs& args, int element_size) {
  KernelConfig config;
  const int vector = 16 / element_size;
  if (args.vector_ok) {
    const int64_t body = args.cols / vector;
    const int vpt = body <= 32 ? 1 : body <= 1024 ? 2 : 4;
    const int64_t group = std::max<int64_t>(8, NextPowerOfTwo((body + vpt - 1) / vpt));
    if (group <= RegisterRowMaxBlock(vpt)) {
      config.kind = KernelKind::kRegisterRow;
      config.vectors_per_thread = vpt;
      config.group = static_cast<int>(group);
      config.block = static_cast<int>(std::max<int64_t>(group, 128));
      const int64_t rows_per_block = config.block / group;
      config.grid = GridSize((args.rows + rows_per_block - 1) / rows_per_block);
      return config;
    }
  }
  const int64_t units = args.vector_ok ? args.cols / vector : args.cols;
  config.kind = KernelKind::kSharedRowCached;
  config.block = static_cast<int>(std::clamp<int64_t>(NextPowerOfTwo((units + 3) / 4), 32, 1024));
  config.group = config.block;
  config.grid = GridSize(args.rows);
  // Body and scalars, padded so that the scalars never run past the buffer.
  config.shared_bytes = static_cast<size_t>(((static_cast<int64_t>(args.cols) + 2 * vector) * element_size + 15) / 16 * 16);
  return config;
}

// A row split over the blocks of a thread-block cluster (ClusterRowKernel, devices with clusters only,
// vector-aligned tensors only), replacing `single` (ChooseSingleBlockConfig's one block per row) when
//   - the row does not fit in one block's shared memory (`single` would re-read it): the fewest blocks
//     (2, 4 or 8) whose shared memory holds it, so X is read once;
//   - or there are too few rows to fill the GPU (rows * 2 <= SMs): blocks per row doubled (up to 8) while
//     rows * blocks fits in one wave and each block keeps at least kMinSliceVectors of the row.
// Returns false when neither applies (or a row is too wide even for 8 blocks).
bool ChooseClusterConfig(const NormArgs& args, int element_size, const KernelConfig& single, int sm_count,
                         int max_shared, KernelConfig* config) {
  const int64_t body = args.cols / (16 / element_size);  // vectors per row, +-1 with the row's head
  // A block's slice, with one vector of slack for rows whose head leaves one more vector.
  const auto slice = [&](int cluster) { return (body + cluster - 1) / cluster + 1; };
  const auto bytes = [&](int cluster) { return static_cast<int64_t>(sizeof(ClusterShared)) + slice(cluster) * 16; };
  int cluster = 1;
  const bool wide = single.kind == KernelKind::kSharedRowCached &&
                    single.shared_bytes + sizeof(ReduceScratch) > static_cast<size_t>(max_shared);
  if (wide) {
    cluster = 2;
    while (cluster <= kMaxClusterSize && bytes(cluster) > max_shared) cluster *= 2;
    if (cluster > kMaxClusterSize) return false;
  }
  while (cluster * 2 <= kMaxClusterSize && args.rows * cluster * 2 <= sm_count &&
         body >= static_cast<int64_t>(kMinSliceVectors) * cluster * 2) {
    cluster *= 2;
  }
  if (cluster < 2) return false;
  *config = single;
  config->kind = KernelKind::kClusterRow;
  config->cluster = cluster;
  config->vectors_per_thread = 1;
  config->flags = 0;
  config->block = static_cast<int>(
      std::clamp<int64_t>(NextPowerOfTwo((slice(cluster) + kClusterBatch - 1) / kClusterBatch), 128,
                           kClusterMaxBlock));
  config->group = config->block;
  config->shared_bytes = static_cast<size_t>(bytes(cluster));
  config->max_shared_bytes = max_shared;
  // One wave of resident clusters, each looping over rows (shared memory bounds them first).
  const int per_sm = std::max(1, std::min(2048 / config->block, max_shared / static_cast<int>(config->shared_bytes)));
  const int64_t clusters = std::min<int64_t>(args.rows, std::max(1, sm_count * per_sm / cluster));
  config->grid = GridSize(clusters * cluster);
  return true;
}

int RegisterRowFlagsFor(const NormArgs& args, bool native) {
  return (args.skip != nullptr ? kSkipFlag : 0) | (args.rms ? kRmsFlag : 0) | (native ? kNativeFlag : 0);
}

// The shared-memory kernel: its row cached when it fits in the device's shared memory, else re-read.
void FitSharedRow(KernelConfig* config, int sm_count, int max_shared) {
  // The kernel's static reduction scratch comes out of the same budget.
  config->max_shared_bytes = max_shared - static_cast<int>(sizeof(ReduceScratch));
  if (config->shared_bytes > static_cast<size_t>(config->max_shared_bytes)) {
    config->kind = KernelKind::kSharedRowUncached;
    config->shared_bytes = 0;
    return;
  }
  // One wave of resident blocks, each looping over rows (their shared memory bounds them first).
  const int by_memory = max_shared / static_cast<int>(config->shared_bytes + sizeof(ReduceScratch));
  const int per_sm = std::max(1, std::min(2048 / config->block, by_memory));
  config->grid = std::min<unsigned>(config->grid, static_cast<unsigned>(sm_count * per_sm));
}

int ChooseNormConfig(const NormLaunchParams& p, int device, NormArgs* args, KernelConfig* config,
                     const char** error) {
  const int x_size = ElementSize(p.x_type);
  const bool has_parameters = p.scale != nullptr || p.bias != nullptr;
  // A per-row-group Scale is read after the statistics (NormalizeAndStore): prefetching it with the row's loads
  // (the native register-row kernels) needs the row group's offset in registers, and those kernels then spilled
  // on sm_90.
  const bool native = args->y_type == p.x_type && (!has_parameters || p.scale_type == p.x_type) &&
                      args->scale_groups == 1;
  *config = ChooseSingleBlockConfig(*args, x_size);
  config->device = device;
  int sm_count = 0;
  cudaError_t status = CachedAttribute(Info(device).sm_count, cudaDevAttrMultiProcessorCount, device, &sm_count);
  if (status != cudaSuccess) return FailCuda(status, error);
  bool clusters = false;
  status = CachedFlag(Info(device).cluster_launch, cudaDevAttrClusterLaunch, device, &clusters);
  if (status != cudaSuccess) return FailCuda(status, error);
  int max_shared = 0;
  const bool split = clusters && p.clusters && args->vector_ok;
  if (split || config->kind == KernelKind::kSharedRowCached) {
    status = CachedAttribute(Info(device).max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device, &max_shared);
    if (status != cudaSuccess) return FailCuda(status, error);
  }
  KernelConfig cluster_config;
  if (split && ChooseClusterConfig(*args, x_size, *config, sm_count, max_shared, &cluster_config)) {
    *config = cluster_config;
  }
  if (config->kind != KernelKind::kClusterRow) CapGrid(config, sm_count);
  args->group = config->group;
  if (config->kind == KernelKind::kRegisterRow) config->flags = RegisterRowFlagsFor(*args, native);
  if (config->kind == KernelKind::kSharedRowCached) FitSharedRow(config, sm_count, max_shared);
  return 0;
}

// The row ops' launchers (RowOpRegistrar): a fixed array, filled during static initialisation (no allocation).
constexpr int kMaxRowOps = 16;
struct RowOps {
  struct Entry {
    const char* name;
    RowOpLaunch launch;
  } entries[kMaxRowOps];
  int count = 0;
};

RowOps& RegisteredRowOps() {
  static RowOps ops;  // function-local: constructed by the first registrar, whatever the order of the units
  return ops;
}

}  // namespace

RowOpRegistrar::RowOpRegistrar(const char* name, RowOpLaunch launch) {
  RowOps& ops = RegisteredRowOps();
  if (ops.count < kMaxRowOps) ops.entries[ops.count++] = {name, launch};
}

int LaunchNorm(const NormLaunchParams& p, void* stream, const char** error) {
  if (error != nullptr) *error = nullptr;
  if (p.row_op != nullptr) {
    const RowOps& ops = RegisteredRowOps();
    for (int i = 0; i < ops.count; ++i) {
      if (std::strcmp(ops.entries[i].name, p.row_op) == 0) return ops.entries[i].launch(p, stream, error);
    }
    return Fail(cudaErrorInvalidValue, "LaunchNorm: row_op names no registered launcher", error);
  }
  NormArgs args{};
  const int rc = PrepareNorm(p, &args, error);
  if (rc != 0 || p.rows == 0) return rc;
  const auto choose = [&](int device, KernelConfig* config) { return ChooseNormConfig(p, device, &args, config, error); };
  return LaunchOnDevice(p, args, choose, stream, error);
}

}  // namespace cuda
}  // namespace onnx_norm
