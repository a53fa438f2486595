// Host-side pieces of the launcher (launch.cu): element sizes, error returns, overlap and alignment tests, and the
// device a launch runs on with its attributes read once. Header-only (inline), so that the CPU emulator, which
// compiles the launcher with a stand-in CUDA runtime, needs no extra file.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "norm_args.cuh"

namespace onnx_norm {
namespace cuda {
namespace launch {

// Bytes per element of an ONNX float type (norm_args.cuh), 0 for any other type.
inline int ElementSize(int type) {
  switch (type) {
    case kFloat32:
      return 4;
    case kFloat16:
    case kBFloat16:
      return 2;
    default:
      return 0;
  }
}

// A rounding attribute: 0 (not set) or a float type.
inline bool IsRoundingType(int type) { return type == 0 || ElementSize(type) != 0; }

inline int64_t NextPowerOfTwo(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

inline bool AlignedTo(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// True when element i of a tensor with `size`-byte elements is aligned for a vector of V elements
// (min(16, V * size) bytes) at every i with (x_phase + i) % V == 0, i.e. at X's 16-byte boundaries.
inline bool VectorAligned(const void* p, int size, int x_phase, int vector) {
  if (p == nullptr) return true;
  const uintptr_t need = static_cast<uintptr_t>(std::min(16, vector * size));
  return (reinterpret_cast<uintptr_t>(p) - static_cast<uintptr_t>(x_phase) * size) % need == 0;
}

// Bytes [p, p + bytes) and [q, q + other) share an address.
inline bool Overlap(const void* p, int64_t bytes, const void* q, int64_t other) {
  if (p == nullptr || q == nullptr) return false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto b = reinterpret_cast<uintptr_t>(q);
  return a < b + static_cast<uintptr_t>(other) && b < a + static_cast<uintptr_t>(bytes);
}

// The launchers' error return: `code`, with `message` (static) in *error.
inline int Fail(int code, const char* message, const char** error) {
  if (error != nullptr) *error = message;
  return code;
}

inline int FailCuda(cudaError_t status, const char** error) {
  return Fail(static_cast<int>(status), cudaGetErrorString(status), error);
}

// Device attributes a launch needs, read once per device (not per launch: cheaper, and nothing to refuse inside a
// CUDA graph capture).
constexpr int kMaxDevices = 64;

struct DeviceInfo {
  std::atomic<int> sm_count{0};
  std::atomic<int> max_shared{0};
  std::atomic<int> cluster_launch{0};  // the attribute + 1 (0: not read yet)
};

inline DeviceInfo& Info(int device) {
  static DeviceInfo info[kMaxDevices];
  return info[device];
}

inline cudaError_t CachedAttribute(std::atomic<int>& slot, cudaDeviceAttr attribute, int device, int* value) {
  *value = slot.load(std::memory_order_relaxed);
  if (*value > 0) return cudaSuccess;
  const cudaError_t status = cudaDeviceGetAttribute(value, attribute, device);
  if (status == cudaSuccess) slot.store(*value, std::memory_order_relaxed);
  return status;
}

// A yes/no attribute, cached like CachedAttribute (stored as value + 1, so that "no" is cached too).
inline cudaError_t CachedFlag(std::atomic<int>& slot, cudaDeviceAttr attribute, int device, bool* value) {
  const int cached = slot.load(std::memory_order_relaxed);
  if (cached > 0) {
    *value = cached > 1;
    return cudaSuccess;
  }
  int read = 0;
  const cudaError_t status = cudaDeviceGetAttribute(&read, attribute, device);
  if (status == cudaSuccess) slot.store(read != 0 ? 2 : 1, std::memory_order_relaxed);
  *value = status == cudaSuccess && read != 0;
  return status;
}

// Makes the tensors' device current and returns it in *device. ONNX Runtime's CUDA runtime and ours (static) keep
// separate current devices. `hint` is the device the caller knows (ONNX Runtime: X's memory info), -1 to read it
// from X's pointer attributes. The stream is never asked (cudaStreamGetDevice can invalidate a capture).
inline int MakeDeviceCurrent(const void* x, int hint, int* device, const char** error) {
  *device = hint;
  cudaError_t status = cudaSuccess;
  if (*device < 0) {
    cudaPointerAttributes attributes{};
    status = cudaPointerGetAttributes(&attributes, x);
    if (status != cudaSuccess) return FailCuda(status, error);
    if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
      return Fail(cudaErrorInvalidValue, "launch: X is not CUDA device memory", error);
    }
    *device = attributes.device;
  }
  if (*device >= kMaxDevices) return Fail(cudaErrorInvalidDevice, "launch: device id out of range", error);
  int current = -1;
  status = cudaGetDevice(&current);
  if (status == cudaSuccess && current != *device) status = cudaSetDevice(*device);
  return status == cudaSuccess ? 0 : FailCuda(status, error);
}

}  // namespace launch
}  // namespace cuda
}  // namespace onnx_norm
