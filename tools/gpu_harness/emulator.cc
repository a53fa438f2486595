// Runs the CUDA norm kernels on the CPU, for checking them on machines without a GPU.
//
// The kernel source (custom_ops/src/cuda: the norm kernels and every row op's) is compiled as plain C++ by the host
// compiler, with one coroutine (ucontext) per CUDA thread and the blocks of a grid run one
// after the other, except the blocks of a thread-block cluster, which run together (their threads in
// turn). The emulation is strict where the hardware would fail or silently misbehave:
//   - every vector access must be aligned to its size (ONNX_NORM_CHECK_ALIGNED);
//   - a warp shuffle must be made by its partner lane with the same mask and offset, and both lanes
//     must be in the mask (a divergent or exited partner is an error, not a hang);
//   - __syncthreads waits for every live thread of the block; a block that can make no progress is
//     reported as a deadlock;
//   - the cluster barrier waits for every live thread of every block of the cluster; distributed shared
//     memory (mapa) must name the block's own dynamic shared memory and a peer that has not exited, and a
//     block may exit only after a cluster barrier that follows every peer's access to its shared memory;
//   - block size, launch bounds, dynamic shared memory and cluster shape must be within the kernel's and
//     the emulated device's limits (kDevices: with and without clusters).
// The launcher (launch.cu), the choice of kernel for a configuration (kernel_dispatch.cuh) and the
// ctypes entry (harness.cu) are the real ones, built with it; only the CUDA runtime calls they make
// are answered here. Nothing about speed can be learnt from this.
//
// Built as one translation unit with the kernels' own (tools/gpu_harness/gpu_build.py includes every
// custom_ops/src/cuda/*.cu but launch.cu after this file): their ONNX_NORM_INSTANTIATE_LAUNCH lines instantiate
// the LaunchKernel defined here, and the op launchers among them register as they do in the library.
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
#include <utility>
#include <vector>

// norm_launch.cuh: the kernels' translation units instantiate this file's LaunchKernel, not the GPU's.
#define ONNX_NORM_EMULATED_LAUNCH 1

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
  int block = 0;  // index into Machine::blocks (the block's rank in its cluster)
  bool done = false;
  std::vector<ShuffleOp> shuffles;
};

// One block of the cluster being run: its index, barrier and dynamic shared memory.
struct Block {
  Index3 idx;
  int live = 0;
  int barrier_arrived = 0;
  long barrier_generation = 0;
  long peer_read_epoch = -1;  // the cluster barrier generation in which a peer last mapped its shared memory
  std::vector<uint4> dynamic_shared;
};

struct Machine {
  Index3 block_dim, grid_dim;
  int cluster_size = 1;
  std::vector<Block> blocks;  // the blocks of one cluster, run together (one block without clusters)
  std::vector<Fiber> fibers;  // block b's threads are fibers [b * threads, (b + 1) * threads)
  ucontext_t scheduler;
  int current = 0;
  int live = 0;  // over the whole cluster
  int cluster_arrived = 0;
  long cluster_generation = 0;
  long progress = 0;
  bool failed = false;
  std::string error;
  std::string last_kernel;
  std::string last_launch;  // "grid=<blocks> block=<threads> shared=<bytes> cluster=<blocks>"
  int plan_only_sms = 0;    // > 0: record the configuration, run nothing, and report this many SMs
  size_t shared_bytes = 0;
  std::function<void()> kernel;
};

Machine machine;

// Fiber stacks: a cluster of 8 blocks of 1024 threads is 8192 fibers.
constexpr size_t kStackBytes = 48 * 1024;

Fiber& Self() { return machine.fibers[machine.current]; }
Block& SelfBlock() { return machine.blocks[Self().block]; }

void Yield() { swapcontext(&machine.fibers[machine.current].context, &machine.scheduler); }

// Records the first error and parks the fiber for good: the scheduler stops the launch.
[[noreturn]] void Fail(const std::string& message) {
  if (!machine.failed) {
    machine.failed = true;
    machine.error = message + " (thread " + std::to_string(Self().thread.x) + " of block " +
                    std::to_string(SelfBlock().idx.x) + ")";
  }
  for (;;) Yield();
}

const Index3& ThreadIdx() { return Self().thread; }
const Index3& BlockIdx() { return SelfBlock().idx; }

// One arrival at a barrier of `live` threads (a block's or the cluster's): the last to arrive opens it (the next
// generation), the others yield until it has.
void ArriveAndWait(int& arrived, long& generation, const int& live) {
  const long mine = generation;
  ++arrived;
  ++machine.progress;
  if (arrived == live) {
    arrived = 0;
    ++generation;
    return;
  }
  while (generation == mine) Yield();
}

void SyncThreads() {
  Block& block = SelfBlock();
  ArriveAndWait(block.barrier_arrived, block.barrier_generation, block.live);
}

// barrier.cluster.arrive + wait: every live thread of every block of the cluster.
void ClusterSync() {
  if (machine.cluster_size < 2) Fail("cluster barrier in a launch without clusters");
  ArriveAndWait(machine.cluster_arrived, machine.cluster_generation, machine.live);
}

// mapa: the same offset in block `rank`'s dynamic shared memory. Only dynamic shared memory is per block
// here (static __shared__ is one instance for all), so the cluster kernel keeps everything it shares
// there; a block that has exited has no shared memory left to read.
void* MapShared(const void* p, unsigned rank) {
  if (machine.cluster_size < 2) Fail("distributed shared memory in a launch without clusters");
  if (rank >= static_cast<unsigned>(machine.cluster_size)) Fail("mapa to a rank outside the cluster");
  const char* base = reinterpret_cast<const char*>(SelfBlock().dynamic_shared.data());
  const size_t offset = static_cast<size_t>(static_cast<const char*>(p) - base);
  if (static_cast<const char*>(p) < base || offset >= machine.shared_bytes) {
    Fail("mapa of an address outside the block's dynamic shared memory");
  }
  Block& peer = machine.blocks[rank];
  if (peer.live == 0) Fail("distributed shared memory of a block that has exited");
  if (&peer != &SelfBlock()) peer.peer_read_epoch = machine.cluster_generation;
  return reinterpret_cast<char*>(peer.dynamic_shared.data()) + offset;
}

float ShuffleXor(unsigned mask, float value, int offset) {
  Fiber& self = Self();
  const int lane = static_cast<int>(self.thread.x % 32);
  const int partner_lane = lane ^ offset;
  if (offset <= 0 || offset >= 32) Fail("shuffle offset out of range");
  if (!(mask & (1u << lane))) Fail("shuffle by a lane outside its own mask");
  if (!(mask & (1u << partner_lane))) Fail("shuffle partner outside the mask");
  const size_t n = self.shuffles.size();
  self.shuffles.push_back({mask, offset, value});
  ++machine.progress;
  const int partner_thread = static_cast<int>(self.thread.x) - lane + partner_lane;
  if (partner_thread >= static_cast<int>(machine.block_dim.x)) Fail("shuffle partner beyond the block");
  Fiber& other = machine.fibers[self.block * machine.block_dim.x + partner_thread];
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
  Fiber& self = Self();
  Block& block = SelfBlock();
  // A block may exit only once a cluster barrier separates it from every peer access to its shared memory:
  // a peer that mapped it since the last barrier may not have finished reading (or may not have started).
  if (block.live == 1 && block.peer_read_epoch == machine.cluster_generation) {
    Fail("block exits without a cluster barrier after a peer's access to its shared memory");
  }
  self.done = true;
  --block.live;
  --machine.live;
  ++machine.progress;
  if (block.barrier_arrived > 0 && block.barrier_arrived == block.live) {
    block.barrier_arrived = 0;
    ++block.barrier_generation;
  }
  if (machine.cluster_arrived > 0 && machine.cluster_arrived == machine.live) {
    machine.cluster_arrived = 0;
    ++machine.cluster_generation;
  }
  swapcontext(&self.context, &machine.scheduler);
}

// Runs the cluster of blocks [first, first + cluster_size) to completion, their threads in turn; false
// (with machine.error) on any failure or deadlock.
bool RunCluster(unsigned first) {
  const int threads = static_cast<int>(machine.block_dim.x);
  const int count = machine.cluster_size;
  machine.blocks.resize(count);
  for (int b = 0; b < count; ++b) {
    Block& block = machine.blocks[b];
    block.idx = Index3{first + b, 0, 0};
    block.live = threads;
    block.barrier_arrived = 0;
    block.peer_read_epoch = -1;
    block.dynamic_shared.assign((machine.shared_bytes + 15) / 16, uint4{0, 0, 0, 0});
  }
  machine.fibers.resize(static_cast<size_t>(threads) * count);
  machine.live = threads * count;
  machine.cluster_arrived = 0;
  for (int f = 0; f < threads * count; ++f) {
    Fiber& fiber = machine.fibers[f];
    fiber.stack.resize(kStackBytes);
    fiber.thread = Index3{static_cast<unsigned>(f % threads), 0, 0};
    fiber.block = f / threads;
    fiber.done = false;
    fiber.shuffles.clear();
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack.data();
    fiber.context.uc_stack.ss_size = fiber.stack.size();
    fiber.context.uc_link = nullptr;
    makecontext(&fiber.context, FiberEntry, 0);
  }
  const int total = threads * count;
  while (machine.live > 0) {
    const long before = machine.progress;
    for (int t = 0; t < total && !machine.failed; ++t) {
      if (machine.fibers[t].done) continue;
      machine.current = t;
      swapcontext(&machine.scheduler, &machine.fibers[t].context);
    }
    if (machine.failed) return false;
    if (machine.progress == before && machine.live > 0) {
      machine.failed = true;
      machine.error = "deadlock in the cluster of block " + std::to_string(first);
      return false;
    }
  }
  return true;
}

void* DynamicShared() { return SelfBlock().dynamic_shared.data(); }

}  // namespace emu

// What norm_kernels.cuh needs from CUDA, for the host compiler.
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)
#define threadIdx (::emu::ThreadIdx())
#define blockIdx (::emu::BlockIdx())
#define ONNX_NORM_EMULATED_CLUSTERS 1
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

// cluster.cuh's primitives, for cluster_row_kernel.cuh.
namespace onnx_norm {
namespace cuda {
inline unsigned ClusterRank() { return ::emu::Self().block; }
inline unsigned ClusterSize() { return static_cast<unsigned>(::emu::machine.cluster_size); }
inline unsigned ClusterIndex() { return ::emu::BlockIdx().x / ClusterSize(); }
inline unsigned ClusterCount() { return ::emu::machine.grid_dim.x / ClusterSize(); }
inline void ClusterSync() { ::emu::ClusterSync(); }
template <typename T>
T* ClusterMapShared(T* p, unsigned rank) {
  return static_cast<T*>(::emu::MapShared(p, rank));
}
}  // namespace cuda
}  // namespace onnx_norm
[[noreturn]] inline void __trap() { ::emu::Fail("trap"); }

#include "kernel_dispatch.cuh"

namespace onnx_norm {
namespace cuda {
namespace {

// The emulated devices (the device argument of a launch; X's pointer attributes say device 0).
struct EmulatedDevice {
  int sms;
  int shared_optin;  // bytes of shared memory a block may opt in to
  bool clusters;     // thread-block clusters (sm_90+)
};
constexpr EmulatedDevice kDevices[] = {
    // 0: an H100/H200's shared memory and clusters, few SMs (the launcher's grid cap then gives blocks
    //    several rows each, as on a GPU with many rows).
    {3, 227 * 1024, true},
    // 1: an A100's shared memory, no clusters: the paths that split a row fall back.
    {3, 163 * 1024, false},
    // 2: many SMs and little shared memory: few rows split over up to 8 blocks, and rows over 8 blocks at
    //    sizes that emulate quickly.
    {64, 48 * 1024, true},
};
constexpr int kEmulatedDevices = static_cast<int>(sizeof(kDevices) / sizeof(kDevices[0]));

const EmulatedDevice& Device(int device) { return kDevices[device >= 0 && device < kEmulatedDevices ? device : 0]; }

// A row op's argument block that names the compile-time variant its runtime attributes pick (`Variant()`).
template <typename Args, typename = void>
struct NamesVariant : std::false_type {};
template <typename Args>
struct NamesVariant<Args, std::void_t<decltype(std::declval<const Args&>().Variant())>> : std::true_type {};

// The name a test sees (onnx_norm_emulator_last_kernel): a row op's is its argument block's (Args::kName, then the
// variant its attributes picked where it names one).
template <typename Args>
std::string KernelName(const KernelConfig& config, const Args& args) {
  if constexpr (!std::is_same_v<Args, NormArgs>) {
    std::string name = Args::kName;
    if constexpr (NamesVariant<Args>::value) name += std::string(" ") + args.Variant();
    return name + ((config.flags & kVectorUnitsFlag) != 0 ? " vector" : " scalar") +
           ((config.flags & kCachedRowFlag) != 0 ? " registers" : " reread") + " group=" + std::to_string(config.group);
  }
  switch (config.kind) {
    case KernelKind::kRegisterRow:
      return "register vpt=" + std::to_string(config.vectors_per_thread) + " flags=" + std::to_string(config.flags) +
             " group=" + std::to_string(config.group);
    case KernelKind::kSharedRowCached:
      return "shared";
    case KernelKind::kSharedRowUncached:
      return "reread";
    case KernelKind::kClusterRow:
      return "cluster blocks=" + std::to_string(config.cluster) + " group=" + std::to_string(config.group);
    case KernelKind::kRowOp:
      return "row op";
  }
  return "?";
}

// The launch of norm_launch.cuh, on the CPU: the same kernel (SelectKernel, shared with it) and the
// checks that the hardware would make of the configuration.
template <typename TX, typename Args>
cudaError_t Emulate(const Args& args, const KernelConfig& config) {
  emu::Machine& m = emu::machine;
  m.failed = false;
  m.error.clear();
  const auto kernel = SelectKernel<TX>(config, &args);
  if (kernel == nullptr) {
    m.failed = true;
    m.error = "no kernel for this configuration";
    return cudaErrorInvalidConfiguration;
  }
  const int max_block = config.kind == KernelKind::kRegisterRow  ? RegisterRowMaxBlock(config.vectors_per_thread)
                        : config.kind == KernelKind::kClusterRow ? kClusterMaxBlock
                        : config.kind == KernelKind::kRowOp      ? kRowOpMaxBlock
                                                                 : 1024;
  if (config.block < 32 || config.block > max_block || config.block % 32 != 0 || config.grid == 0 ||
      config.block % config.group != 0) {
    m.failed = true;
    m.error = "block size outside the kernel's launch bounds";
    return cudaErrorInvalidConfiguration;
  }
  const int optin = Device(config.device).shared_optin;
  const bool dynamic = config.kind == KernelKind::kSharedRowCached || config.kind == KernelKind::kClusterRow;
  const size_t static_bytes = config.kind == KernelKind::kClusterRow ? 0 : sizeof(ReduceScratch);
  if (dynamic && (config.shared_bytes > static_cast<size_t>(config.max_shared_bytes) ||
                  config.shared_bytes + static_bytes > static_cast<size_t>(optin))) {
    m.failed = true;
    m.error = "dynamic shared memory beyond the device's limit";
    return cudaErrorInvalidConfiguration;
  }
  const int cluster = config.kind == KernelKind::kClusterRow ? config.cluster : 1;
  if (cluster != 1 && (!Device(config.device).clusters || cluster < 2 || cluster > kMaxClusterSize ||
                       config.grid % static_cast<unsigned>(cluster) != 0)) {
    m.failed = true;
    m.error = "cluster launch the device cannot make (no clusters, size, or a grid not a multiple of it)";
    return cudaErrorInvalidConfiguration;
  }
  m.shared_bytes = config.shared_bytes;
  m.cluster_size = cluster;
  m.kernel = [&] { kernel(args); };
  m.last_kernel = KernelName<Args>(config, args);
  m.last_launch = "grid=" + std::to_string(config.grid) + " block=" + std::to_string(config.block) +
                  " shared=" + std::to_string(config.shared_bytes) + " cluster=" + std::to_string(cluster);
  if (m.plan_only_sms > 0) return cudaSuccess;
  m.grid_dim = emu::Index3{config.grid, 1, 1};
  m.block_dim = emu::Index3{static_cast<unsigned>(config.block), 1, 1};
  for (unsigned b = 0; b < config.grid; b += static_cast<unsigned>(cluster)) {
    if (!emu::RunCluster(b)) return cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

}  // namespace

template <int kXType, typename Args>
cudaError_t LaunchKernel(const Args& args, const KernelConfig& config, cudaStream_t) {
  return Emulate<typename ElementOf<kXType>::type>(args, config);
}

}  // namespace cuda
}  // namespace onnx_norm

// The CUDA runtime calls of launch.cu, answered for the emulated devices (kDevices).
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

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (device < 0 || device >= onnx_norm::cuda::kEmulatedDevices) return cudaErrorInvalidDevice;
  const auto& emulated = onnx_norm::cuda::Device(device);
  switch (attribute) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = emulated.shared_optin;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = emu::machine.plan_only_sms > 0 ? emu::machine.plan_only_sms : emulated.sms;
      return cudaSuccess;
    case cudaDevAttrClusterLaunch:
      *value = emulated.clusters ? 1 : 0;
      return cudaSuccess;
    default:
      return cudaErrorInvalidValue;
  }
}

const char* cudaGetErrorString(cudaError_t) {
  return emu::machine.error.empty() ? "emulated CUDA error" : emu::machine.error.c_str();
}

// For tests: which kernel the last launch ran ("register vpt=<n> flags=<f> group=<threads>", "shared",
// "reread", "cluster blocks=<n> group=<threads>"), so that a test can show its cases reach every path.
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
