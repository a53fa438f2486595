// The host side of a row op (row_op_kernels.cuh): its launcher registers under a name (RowOpRegistrar, in the op's
// cuda/<op>.cu), LaunchNorm (launch.cu) runs it for NormLaunchParams::row_op, and LaunchRowOp does what every row
// op's launch shares: the op's checks and argument block (its `prepare`), the row configuration (ChooseRowConfig),
// the device and the launch. Host code only, so that the CPU emulator (tools/gpu_harness/emulator.cc) runs it.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "kernel_config.cuh"
#include "launch.h"
#include "launch_common.h"

namespace onnx_norm {
namespace cuda {

// A row op's launcher: as LaunchNorm (launch.h), for parameters whose row_op names it.
using RowOpLaunch = int (*)(const NormLaunchParams& p, void* stream, const char** error);

// Adds a launcher to the ones LaunchNorm finds by name: `const RowOpRegistrar kRegistrar{"Name", &Launch};` at
// namespace scope of the op's translation unit (defined in launch.cu).
struct RowOpRegistrar {
  RowOpRegistrar(const char* name, RowOpLaunch launch);
};

namespace launch {

// A row op's configuration: up to RowOpUnits (kRowOpUnits unless the op says) units per thread in registers, 8 to
// 1024 threads per row (blocks of at least 128 threads); rows longer than 1024 such units are re-read, one row per
// 1024-thread block.
template <typename Args>
int ChooseRowConfig(bool vector, int element_size, int device, Args* args, KernelConfig* config, const char** error) {
  const int64_t units = vector ? args->cols / (16 / element_size) : args->cols;
  const int64_t per_thread = RowOpUnits<Args>::For(element_size);
  const int64_t group = std::max<int64_t>(8, NextPowerOfTwo((units + per_thread - 1) / per_thread));
  const bool cached = group <= kRowOpMaxBlock;
  args->group = cached ? static_cast<int>(group) : kRowOpMaxBlock;
  *config = KernelConfig{};
  config->kind = KernelKind::kRowOp;
  config->flags = (vector ? kVectorUnitsFlag : 0) | (cached ? kCachedRowFlag : 0);
  config->group = args->group;
  config->block = std::max(args->group, 128);
  config->device = device;
  const int64_t rows_per_block = config->block / args->group;
  config->grid = GridSize((args->rows + rows_per_block - 1) / rows_per_block);
  int sm_count = 0;
  const cudaError_t status = CachedAttribute(Info(device).sm_count, cudaDevAttrMultiProcessorCount, device, &sm_count);
  if (status != cudaSuccess) return FailCuda(status, error);
  CapGrid(config, sm_count);
  return 0;
}

// A row op's launch: `prepare(p, &args, &vector, error)` checks the parameters (rows == 0: types and sizes only),
// fills the op's argument block and says whether every tensor can be read in 16-byte units; then the row
// configuration, the device and the launch.
template <typename Args, typename Prepare>
int LaunchRowOp(Prepare&& prepare, const NormLaunchParams& p, void* stream, const char** error) {
  Args args{};
  bool vector = false;
  const int rc = prepare(p, &args, &vector, error);
  if (rc != 0 || p.rows == 0) return rc;
  const auto choose = [&](int device, KernelConfig* config) {
    return ChooseRowConfig(vector, ElementSize(p.x_type), device, &args, config, error);
  };
  return LaunchOnDevice(p, args, choose, stream, error);
}

// The launcher a row op registers: LaunchRowOp with its argument block and its `kPrepare`, as a RowOpLaunch
// (`const RowOpRegistrar k...{name, &RowOpLauncher<Args, &Prepare...>};`).
template <typename Args, auto kPrepare>
int RowOpLauncher(const NormLaunchParams& p, void* stream, const char** error) {
  return LaunchRowOp<Args>(kPrepare, p, stream, error);
}

}  // namespace launch
}  // namespace cuda
}  // namespace onnx_norm
