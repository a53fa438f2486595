// LaunchNorm (launch.h): validates the parameters, picks a kernel configuration from the row length
// and the pointers' alignment, makes the stream's device current and launches on that stream.
// No allocation, no synchronisation: safe inside CUDA graph capture.
#include "launch.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernel_config.cuh"

#if CUDART_VERSION < 12080
#error "LaunchNorm needs cudaStreamGetDevice (CUDA 12.8 or newer)"
#endif

namespace onnx_norm {
namespace cuda {
namespace {

constexpr int kUnsupportedTypes = -1;

int ElementSize(int type) {
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

bool IsRoundingType(int type) { return type == 0 || ElementSize(type) != 0; }

int64_t NextPowerOfTwo(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

unsigned GridSize(int64_t blocks) { return static_cast<unsigned>(std::min<int64_t>(blocks, INT_MAX)); }

bool AlignedTo(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// True when element i of a tensor with `size`-byte elements is aligned for a vector of V elements
// (min(16, V * size) bytes) at every i with (x_phase + i) % V == 0, i.e. at X's 16-byte boundaries.
bool VectorAligned(const void* p, int size, int x_phase, int vector) {
  if (p == nullptr) return true;
  const uintptr_t need = static_cast<uintptr_t>(std::min(16, vector * size));
  return (reinterpret_cast<uintptr_t>(p) - static_cast<uintptr_t>(x_phase) * size) % need == 0;
}

// Register-resident rows: warp-per-row (or 8/16 threads per row, several rows per block) while the
// row fits in 32 threads, then one block of up to 512 threads per row, at most 32 values per thread
// (no spills with 512-thread blocks). Longer rows, or pointers that cannot be read as vectors, go
// to the shared-memory kernel (kSharedRowCached here; the launcher demotes it to kSharedRowUncached
// when the row does not fit in the device's shared memory).
KernelConfig ChooseConfig(const NormArgs& args, int element_size) {
  KernelConfig config;
  const int vector = 16 / element_size;
  const int max_vpt = MaxVectorsPerThread(element_size);
  if (args.vector_ok) {
    const int64_t body = args.cols / vector;
    int64_t group = 0;
    if (body <= 32 * max_vpt) {
      group = std::clamp<int64_t>(NextPowerOfTwo(body), 8, 32);
    } else {
      group = NextPowerOfTwo((body + max_vpt - 1) / max_vpt);
    }
    if (group <= 512) {
      int vpt = 1;
      while (vpt * group < body) vpt <<= 1;
      config.kind = KernelKind::kRegisterRow;
      config.vectors_per_thread = vpt;
      config.group = static_cast<int>(group);
      config.block = group <= 32 ? 128 : static_cast<int>(group);
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

int Fail(int code, const char* message, const char** error) {
  if (error != nullptr) *error = message;
  return code;
}

int FailCuda(cudaError_t status, const char** error) {
  return Fail(static_cast<int>(status), cudaGetErrorString(status), error);
}

}  // namespace

int LaunchNorm(const NormLaunchParams& p, void* stream_handle, const char** error) {
  if (error != nullptr) *error = nullptr;
  const int y_type = p.y_type == 0 ? p.x_type : p.y_type;
  const bool has_parameters = p.scale != nullptr || p.bias != nullptr;
  const int x_size = ElementSize(p.x_type);
  const int y_size = ElementSize(y_type);
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
  if (p.sum != nullptr && p.skip == nullptr) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: the Sum output needs a Skip input", error);
  }
  if (p.rms && p.mean != nullptr) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: RMSNorm has no Mean output", error);
  }
  if (has_parameters && (p.scale_size <= 0 || p.scale_size > p.cols || p.cols % p.scale_size != 0)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: scale_size must divide cols (Scale/Bias cover a suffix of the row)",
                error);
  }
  if (!AlignedTo(p.x, x_size) || !AlignedTo(p.skip, x_size) || !AlignedTo(p.sum, x_size) || !AlignedTo(p.y, y_size) ||
      !AlignedTo(p.scale, parameter_size) || !AlignedTo(p.bias, parameter_size) || !AlignedTo(p.mean, 4) ||
      !AlignedTo(p.inv_std, 4)) {
    return Fail(cudaErrorInvalidValue, "LaunchNorm: a tensor is not aligned to its element size", error);
  }

  NormArgs args{};
  args.x = p.x;
  args.skip = p.skip;
  args.scale = p.scale;
  args.bias = p.bias;
  args.y = p.y;
  args.sum = p.sum;
  args.mean = p.mean;
  args.inv_std = p.inv_std;
  args.rows = p.rows;
  args.cols = static_cast<int>(p.cols);
  args.scale_size = has_parameters ? static_cast<int>(p.scale_size) : args.cols;
  args.epsilon = p.epsilon;
  args.rms = p.rms;
  args.scale_type = has_parameters ? p.scale_type : kFloat32;
  args.y_type = y_type;
  args.normalized_type = p.normalized_type;
  args.multiply_type = p.multiply_type;

  const int vector = 16 / x_size;
  args.x_phase = static_cast<int>(reinterpret_cast<uintptr_t>(p.x) % 16) / x_size;
  args.vector_ok = VectorAligned(p.skip, x_size, args.x_phase, vector) &&
                   VectorAligned(p.sum, x_size, args.x_phase, vector) &&
                   VectorAligned(p.y, y_size, args.x_phase, vector);
  if (args.vector_ok && has_parameters && args.cols % vector == 0) {
    // Every row starts `head` elements before a vector boundary; the parameter vectors at columns
    // head + k * V must be aligned and, when Scale repeats along the row, must not straddle a repeat.
    const int head = (vector - args.x_phase) % vector;
    const bool fits = args.scale_size == args.cols || (head == 0 && args.scale_size % vector == 0);
    args.scale_vector = fits && VectorAligned(p.scale, parameter_size, (vector - head) % vector, vector) &&
                        VectorAligned(p.bias, parameter_size, (vector - head) % vector, vector);
  }

  // The launch reports its status through cudaGetLastError: drop an error left by an earlier call of
  // this runtime (already returned to its caller), so that it is not reported again here. Sticky errors
  // (a corrupted context) come back from the launch itself.
  (void)cudaGetLastError();

  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  // ONNX Runtime's CUDA runtime and ours (static) keep separate current devices: take the stream's.
  int device = 0;
  cudaError_t status = cudaStreamGetDevice(stream, &device);
  if (status != cudaSuccess) return FailCuda(status, error);
  int current = -1;
  status = cudaGetDevice(&current);
  if (status != cudaSuccess) return FailCuda(status, error);
  if (current != device) {
    status = cudaSetDevice(device);
    if (status != cudaSuccess) return FailCuda(status, error);
  }

  KernelConfig config = ChooseConfig(args, x_size);
  args.group = config.group;
  if (config.kind == KernelKind::kSharedRowCached) {
    int max_shared = 0;
    status = cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (status != cudaSuccess) return FailCuda(status, error);
    // The kernel's static reduction scratch comes out of the same budget.
    config.max_shared_bytes = max_shared - static_cast<int>(sizeof(ReduceScratch));
    config.device = device;
    if (config.shared_bytes > static_cast<size_t>(config.max_shared_bytes)) {
      config.kind = KernelKind::kSharedRowUncached;
      config.shared_bytes = 0;
    }
  }

  switch (p.x_type) {
    case kFloat32:
      status = LaunchNormFloat32(args, config, stream);
      break;
    case kFloat16:
      status = LaunchNormFloat16(args, config, stream);
      break;
    default:
      status = LaunchNormBFloat16(args, config, stream);
      break;
  }
  if (status != cudaSuccess) return FailCuda(status, error);
  return 0;
}

}  // namespace cuda
}  // namespace onnx_norm
