// Runs the CUDA norm kernels on the CPU, for checking them on machines without a GPU.
//
// The kernel source (custom_ops/src/cuda/norm_kernels.cuh) is compiled as plain C++ by the host
// compiler, with one coroutine (ucontext) per CUDA thread and the blocks of a grid run one after the
// other. The emulation is strict where the hardware would fail or silently misbehave:
//   - every vector access must be aligned to its size (ONNX_NORM_CHECK_ALIGNED);
//   - a warp shuffle must be made by its partner lane with the same mask and offset, and both lanes
//     must be in the mask (a divergent or exited partner is an error, not a hang);
//   - __syncthreads waits for every live thread of the block; a block that can make no progress is
//     reported as a deadlock;
//   - block size, launch bounds and dynamic shared memory must be within the kernel's limits.
// The launcher (launch.cu), the choice of kernel for a configuration (kernel_dispatch.cuh) and the
// ctypes entry (harness.cu) are the real ones, built with it; only the CUDA runtime calls they make
// are answered here. Nothing about speed can be learnt from this.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <ucontext.h>
#include <vector_functions.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace emu {

struct Index3 {
  unsigned x = 0, y = 0, z = 0;
};

struct ShuffleOp {
  unsigned mask;
  int offset;
  float value;
};

struct Fiber {
  ucontext_t context;
  std::vector<char> stack;
  Index3 thread;
  bool done = false;
  std::vector<ShuffleOp> shuffles;
};

struct Machine {
  Index3 block_idx, block_dim, grid_dim;
  std::vector<Fiber> fibers;
  ucontext_t scheduler;
  int current = 0;
  int live = 0;
  int barrier_arrived = 0;
  long barrier_generation = 0;
  long progress = 0;
  bool failed = false;
  std::string error;
  std::string last_kernel;
  std::string last_launch;  // "grid=<blocks> block=<threads> shared=<bytes>"
  int plan_only_sms = 0;    // > 0: record the configuration, run nothing, and report this many SMs
  std::vector<uint4> dynamic_shared;
  std::function<void()> kernel;
};

Machine machine;

constexpr size_t kStackBytes = 64 * 1024;

void Yield() { swapcontext(&machine.fibers[machine.current].context, &machine.scheduler); }

// Records the first error and parks the fiber for good: the scheduler stops the launch.
[[noreturn]] void Fail(const std::string& message) {
  if (!machine.failed) {
    machine.failed = true;
    machine.error = message + " (thread " + std::to_string(machine.fibers[machine.current].thread.x) + " of block " +
                    std::to_string(machine.block_idx.x) + ")";
  }
  for (;;) Yield();
}

const Index3& ThreadIdx() { return machine.fibers[machine.current].thread; }

void SyncThreads() {
  const long generation = machine.barrier_generation;
  ++machine.barrier_arrived;
  ++machine.progress;
  if (machine.barrier_arrived == machine.live) {
    machine.barrier_arrived = 0;
    ++machine.barrier_generation;
    return;
  }
  while (machine.barrier_generation == generation) Yield();
}

float ShuffleXor(unsigned mask, float value, int offset) {
  Fiber& self = machine.fibers[machine.current];
  const int lane = static_cast<int>(self.thread.x % 32);
  const int partner_lane = lane ^ offset;
  if (offset <= 0 || offset >= 32) Fail("shuffle offset out of range");
  if (!(mask & (1u << lane))) Fail("shuffle by a lane outside its own mask");
  if (!(mask & (1u << partner_lane))) Fail("shuffle partner outside the mask");
  const size_t n = self.shuffles.size();
  self.shuffles.push_back({mask, offset, value});
  ++machine.progress;
  const int partner = static_cast<int>(self.thread.x) - lane + partner_lane;
  if (partner >= static_cast<int>(machine.fibers.size())) Fail("shuffle partner beyond the block");
  Fiber& other = machine.fibers[partner];
  while (other.shuffles.size() <= n) {
    if (other.done) Fail("shuffle partner exited before its shuffle");
    Yield();
  }
  const ShuffleOp& op = other.shuffles[n];
  if (op.mask != mask || op.offset != offset) Fail("shuffle partner made a different shuffle (divergence)");
  return op.value;
}

template <typename T>
void CheckAligned(const T* p) {
  using Value = std::remove_cv_t<T>;
  if (reinterpret_cast<uintptr_t>(p) % alignof(Value) != 0) {
    Fail("misaligned " + std::to_string(sizeof(Value)) + "-byte access");
  }
}

void FiberEntry() {
  machine.kernel();
  Fiber& self = machine.fibers[machine.current];
  self.done = true;
  --machine.live;
  ++machine.progress;
  if (machine.barrier_arrived > 0 && machine.barrier_arrived == machine.live) {
    machine.barrier_arrived = 0;
    ++machine.barrier_generation;
  }
  swapcontext(&self.context, &machine.scheduler);
}

// Runs one block to completion; false (with machine.error) on any failure or deadlock.
bool RunBlock() {
  const int threads = static_cast<int>(machine.block_dim.x);
  machine.fibers.resize(threads);
  machine.live = threads;
  machine.barrier_arrived = 0;
  for (int t = 0; t < threads; ++t) {
    Fiber& fiber = machine.fibers[t];
    fiber.stack.resize(kStackBytes);
    fiber.thread = Index3{static_cast<unsigned>(t), 0, 0};
    fiber.done = false;
    fiber.shuffles.clear();
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack.data();
    fiber.context.uc_stack.ss_size = fiber.stack.size();
    fiber.context.uc_link = nullptr;
    makecontext(&fiber.context, FiberEntry, 0);
  }
  while (machine.live > 0) {
    const long before = machine.progress;
    for (int t = 0; t < threads && !machine.failed; ++t) {
      if (machine.fibers[t].done) continue;
      machine.current = t;
      swapcontext(&machine.scheduler, &machine.fibers[t].context);
    }
    if (machine.failed) return false;
    if (machine.progress == before && machine.live > 0) {
      machine.failed = true;
      machine.error = "deadlock in block " + std::to_string(machine.block_idx.x);
      return false;
    }
  }
  return true;
}

void* DynamicShared() { return machine.dynamic_shared.data(); }

}  // namespace emu

// What norm_kernels.cuh needs from CUDA, for the host compiler.
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)
#define threadIdx (::emu::ThreadIdx())
#define blockIdx (::emu::machine.block_idx)
#define blockDim (::emu::machine.block_dim)
#define gridDim (::emu::machine.grid_dim)
#define ONNX_NORM_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::emu::DynamicShared())
#define ONNX_NORM_CHECK_ALIGNED(pointer) ::emu::CheckAligned(pointer)

inline void __syncthreads() { emu::SyncThreads(); }
inline float __shfl_xor_sync(unsigned mask, float value, int offset) { return emu::ShuffleXor(mask, value, offset); }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
template <typename T>
void __stwb(T* p, const T& value) {
  *p = value;
}
inline unsigned int __float_as_uint(float v) {
  unsigned int u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
}
inline float __uint_as_float(unsigned int u) {
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
}
using std::memcpy;
using std::min;

#include "kernel_dispatch.cuh"

namespace onnx_norm {
namespace cuda {
namespace {

constexpr int kEmulatedSharedOptin = 227 * 1024;  // an H100/H200's opt-in limit per block
constexpr int kEmulatedSms = 3;

std::string KernelName(const KernelConfig& config) {
  switch (config.kind) {
    case KernelKind::kRegisterRow:
      return "register vpt=" + std::to_string(config.vectors_per_thread) + " flags=" + std::to_string(config.flags) +
             " group=" + std::to_string(config.group);
    case KernelKind::kSharedRowCached:
      return "shared";
    case KernelKind::kSharedRowUncached:
      return "reread";
  }
  return "?";
}

// The launch of norm_launch.cuh, on the CPU: the same kernel (SelectNormKernel, shared with it) and the
// checks that the hardware would make of the configuration.
template <typename TX>
cudaError_t Emulate(const NormArgs& args, const KernelConfig& config) {
  emu::Machine& m = emu::machine;
  m.failed = false;
  m.error.clear();
  const NormKernel kernel = SelectNormKernel<TX>(config);
  if (kernel == nullptr) {
    m.failed = true;
    m.error = "no kernel for this configuration";
    return cudaErrorInvalidConfiguration;
  }
  const int max_block = config.kind == KernelKind::kRegisterRow ? RegisterRowMaxBlock(config.vectors_per_thread) : 1024;
  if (config.block < 32 || config.block > max_block || config.block % 32 != 0 || config.grid == 0 ||
      config.block % config.group != 0) {
    m.failed = true;
    m.error = "block size outside the kernel's launch bounds";
    return cudaErrorInvalidConfiguration;
  }
  if (config.kind == KernelKind::kSharedRowCached &&
      (config.shared_bytes > static_cast<size_t>(config.max_shared_bytes) ||
       config.shared_bytes + sizeof(ReduceScratch) > static_cast<size_t>(kEmulatedSharedOptin))) {
    m.failed = true;
    m.error = "dynamic shared memory beyond the device's limit";
    return cudaErrorInvalidConfiguration;
  }
  m.dynamic_shared.assign((config.shared_bytes + 15) / 16, uint4{0, 0, 0, 0});
  m.kernel = [&] { kernel(args); };
  m.last_kernel = KernelName(config);
  m.last_launch = "grid=" + std::to_string(config.grid) + " block=" + std::to_string(config.block) +
                  " shared=" + std::to_string(config.shared_bytes);
  if (m.plan_only_sms > 0) return cudaSuccess;
  m.grid_dim = emu::Index3{config.grid, 1, 1};
  m.block_dim = emu::Index3{static_cast<unsigned>(config.block), 1, 1};
  for (unsigned b = 0; b < config.grid; ++b) {
    m.block_idx = emu::Index3{b, 0, 0};
    if (!emu::RunBlock()) return cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchNormFloat32(const NormArgs& args, const KernelConfig& config, cudaStream_t) {
  return Emulate<float>(args, config);
}
cudaError_t LaunchNormFloat16(const NormArgs& args, const KernelConfig& config, cudaStream_t) {
  return Emulate<__half>(args, config);
}
cudaError_t LaunchNormBFloat16(const NormArgs& args, const KernelConfig& config, cudaStream_t) {
  return Emulate<__nv_bfloat16>(args, config);
}

}  // namespace cuda
}  // namespace onnx_norm

// The CUDA runtime calls of launch.cu, answered for one emulated device.
extern "C" {

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void*) {
  *attributes = cudaPointerAttributes{};
  attributes->type = cudaMemoryTypeDevice;
  attributes->device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int) { return cudaSuccess; }

cudaError_t cudaGetLastError() { return cudaSuccess; }

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  switch (attribute) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = onnx_norm::cuda::kEmulatedSharedOptin;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      // Few SMs: the launcher's grid cap then gives blocks several rows each, as on a GPU with many rows.
      *value = emu::machine.plan_only_sms > 0 ? emu::machine.plan_only_sms : onnx_norm::cuda::kEmulatedSms;
      return cudaSuccess;
    default:
      return cudaErrorInvalidValue;
  }
}

const char* cudaGetErrorString(cudaError_t) {
  return emu::machine.error.empty() ? "emulated CUDA error" : emu::machine.error.c_str();
}

// For tests: which kernel the last launch ran ("register vpt=<n> flags=<f> group=<threads>", "shared",
// "reread"),
// so that a test can show its cases reach every path.
__attribute__((visibility("default"))) const char* onnx_norm_emulator_last_kernel() {
  return emu::machine.last_kernel.c_str();
}

__attribute__((visibility("default"))) const char* onnx_norm_emulator_last_launch() {
  return emu::machine.last_launch.c_str();
}

// For the launch plan of tools/gpu_check.py --plan: with sms > 0, launches only choose their
// configuration for a GPU of that many SMs (pointers are never read); 0 runs kernels again.
__attribute__((visibility("default"))) void onnx_norm_emulator_plan_only(int sms) {
  emu::machine.plan_only_sms = sms;
}

}  // extern "C"
