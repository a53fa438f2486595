// The library's op table, open for additions: each op's own source file defines its row (an OpRegistrar at
// namespace scope, run during static initialisation), so that register.cc, which registers the rows with ONNX
// Runtime, and this header name no op. A new op adds its files; it edits none of the shared ones.
#pragma once

#include <vector>

#include "common/norm_attributes.h"
#include "common/norm_op.h"

namespace onnx_norm {

// One row: the op's signature and its compute function per provider (nullptr: not built for it).
struct OpEntry {
  OpSignature op;
  ComputeFn cpu;
  ComputeFn cuda;
};

// Optional-input masks for OpSignature::optional_inputs: bit i for input i.
inline constexpr unsigned kInput1 = 1u << 1, kInput2 = 1u << 2, kInput3 = 1u << 3;

// Every registered row, in the order of the op names (not of the link, which no standard fixes). Complete once
// static initialisation is over, i.e. whenever ONNX Runtime or a test can call into the library.
const std::vector<OpEntry>& RegisteredOps();

// Appends its row to the table: `const OpRegistrar kRegistrar{{signature, cpu, cuda}};` in the op's own .cc.
struct OpRegistrar {
  explicit OpRegistrar(const OpEntry& entry);
};

}  // namespace onnx_norm

// The CUDA compute function of a row: `cuda::fn` in a build with the CUDA kernels, nullptr without. The op's
// file declares `cuda::fn` itself, under the same #ifdef (it is defined in the op's cuda/*.cc).
#ifdef ONNX_NORM_WITH_CUDA
#define ONNX_NORM_CUDA_COMPUTE(fn) &cuda::fn
#else
#define ONNX_NORM_CUDA_COMPUTE(fn) nullptr
#endif
