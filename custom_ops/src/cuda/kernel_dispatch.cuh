// From a KernelConfig to the kernel function it names, for every op (SelectKernel). Shared by the GPU launch
// (norm_launch.cuh) and the CPU emulator of the kernels (tools/gpu_harness/emulator.cc), so the emulator runs
// the very instantiation that the GPU would.
#pragma once

#include <utility>

#include "kernel_config.cuh"
#include "cluster_row_kernel.cuh"
#include "norm_kernels.cuh"

namespace onnx_norm {
namespace cuda {

using NormKernel = void (*)(NormArgs);

template <typename TX, int VPT, int... kFlags>
NormKernel RegisterRowKernelFor(int flags, std::integer_sequence<int, kFlags...>) {
  NormKernel kernel = nullptr;
  ((flags == kFlags ? (kernel = &RegisterRowKernel<TX, VPT, kFlags>, true) : false) || ...);
  return kernel;
}

// The kernel for `config` with X of type TX, or nullptr when the configuration names none.
template <typename TX>
NormKernel SelectNormKernel(const KernelConfig& config) {
  using AllFlags = std::make_integer_sequence<int, kFlagCombinations>;
  switch (config.kind) {
    case KernelKind::kRegisterRow:
      switch (config.vectors_per_thread) {
        case 1:
          return RegisterRowKernelFor<TX, 1>(config.flags, AllFlags{});
        case 2:
          return RegisterRowKernelFor<TX, 2>(config.flags, AllFlags{});
        case 4:
          return RegisterRowKernelFor<TX, 4>(config.flags, AllFlags{});
        default:
          return nullptr;
      }
    case KernelKind::kSharedRowCached:
      return &SharedRowKernel<TX, true>;
    case KernelKind::kSharedRowUncached:
      return &SharedRowKernel<TX, false>;
    case KernelKind::kClusterRow:
      return &ClusterRowKernel<TX>;
    case KernelKind::kRowOp:
      return nullptr;  // a row op's kernel (SelectKernel below)
  }
  return nullptr;
}

// The kernel for `config`, X of type TX and the op's argument block (the pointer only picks the overload), or
// nullptr when the configuration names none for that block.
template <typename TX>
NormKernel SelectKernel(const KernelConfig& config, const NormArgs* /*args*/) {
  return SelectNormKernel<TX>(config);
}
// A row op's argument block names its kernel (Args::Kernel, in the op's kernels header, row_op_kernels.cuh), from
// the configuration and the arguments (a runtime attribute may pick a compile-time variant of the op's own).
template <typename TX, typename Args>
auto SelectKernel(const KernelConfig& config, const Args* args) -> void (*)(Args) {
  return config.kind == KernelKind::kRowOp ? Args::template Kernel<TX>(config, *args) : nullptr;
}

}  // namespace cuda
}  // namespace onnx_norm
