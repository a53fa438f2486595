// Host-side pieces of every op's launcher (launch.cu, a row op's cuda/<op>.cu): element sizes, error returns,
// overlap and alignment tests, the device a launch runs on with its attributes read once, the grid cap, and the
// launch on the device with the one dispatch on X's type. Header-only (inline), so that the CPU emulator, which
// compiles the launchers with a stand-in CUDA runtime, needs no extra file.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "kernel_config.cuh"
#include "launch.h"
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

// The return code of an unsupported type combination (launch.h).
constexpr int kUnsupportedTypes = -1;

inline unsigned GridSize(int64_t blocks) { return static_cast<unsigned>(std::min<int64_t>(blocks, INT_MAX)); }

// Blocks loop over rows: a few waves of resident blocks are enough, and a bounded grid.
inline void CapGrid(KernelConfig* config, int sm_count) {
  config->grid = std::min<unsigned>(config->grid, static_cast<unsigned>(sm_count * (2048 / config->block) * 4));
}

inline int OutputType(const NormLaunchParams& p) { return p.y_type == 0 ? p.x_type : p.y_type; }

// Aligned for units of `vector` elements (every row starts at a multiple of cols, which the vector path needs to be
// a multiple of `vector`).
inline bool UnitAligned(const void* p, int size, int vector) { return VectorAligned(p, size, 0, vector); }

// The arguments every kernel reads the same way (NormArgs and every row op's block name them alike).
template <typename Args>
void SetCommonArgs(const NormLaunchParams& p, Args* args) {
  args->x = p.x;
  args->scale = p.scale;
  args->bias = p.bias;
  args->y = p.y;
  args->rows = p.rows;
  args->cols = static_cast<int>(p.cols);
  args->epsilon = p.epsilon;
  args->rms = p.rms;
  args->scale_type = p.scale_type;
  args->y_type = OutputType(p);
  args->normalized_type = p.normalized_type;
  args->multiply_type = p.multiply_type;
}

template <typename Args>
cudaError_t LaunchForXType(int x_type, const Args& args, const KernelConfig& config, cudaStream_t stream) {
  switch (x_type) {
    case kFloat32:
      return LaunchKernel<kFloat32>(args, config, stream);
    case kFloat16:
      return LaunchKernel<kFloat16>(args, config, stream);
    default:
      return LaunchKernel<kBFloat16>(args, config, stream);
  }
}

// After the op's checks: the device, the op's configuration (`choose(device, &config)`), the launch.
template <typename Args, typename Choose>
int LaunchOnDevice(const NormLaunchParams& p, const Args& args, Choose&& choose, void* stream, const char** error) {
  // The launch reports its status through cudaGetLastError: drop an error left by an earlier call of
  // this runtime (already returned to its caller), so that it is not reported again here. Sticky errors
  // (a corrupted context) come back from the launch itself.
  (void)cudaGetLastError();
  int device = 0;
  if (const int rc = MakeDeviceCurrent(p.x, p.device, &device, error)) return rc;
  KernelConfig config;
  if (const int rc = choose(device, &config)) return rc;
  const cudaError_t status = LaunchForXType(p.x_type, args, config, static_cast<cudaStream_t>(stream));
  return status == cudaSuccess ? 0 : FailCuda(status, error);
}

}  // namespace launch
}  // namespace cuda
}  // namespace onnx_norm
