// The lane layout of the row reductions, shared by the generic kernels and the fused 16-bit ones
// so that both sum in exactly the same order (and give bit-identical statistics).
#pragma once

namespace onnx_norm {
namespace cpu {

// Independent partial sums: without -ffast-math GCC may not reorder a single running sum, but it
// vectorises these lanes, and spreading the accumulation over lanes also improves its accuracy.
// Element i of a row goes to lane i % kLanes.
constexpr int kLanes = 16;

inline float ReduceLanes(float* acc) {
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  return acc[0];
}

}  // namespace cpu
}  // namespace onnx_norm
