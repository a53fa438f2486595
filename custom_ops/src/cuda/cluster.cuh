// Thread-block cluster primitives (sm_90+): a block's rank in its cluster, the cluster barrier and the
// address of a peer block's shared memory (distributed shared memory). The CPU emulator of the kernels
// (tools/gpu_harness/emulator.cc) defines ONNX_NORM_EMULATED_CLUSTERS and provides its own, with the
// same semantics, so that the kernels' real source runs there too.
#pragma once

// Device passes for architectures without clusters (sm_80..sm_89) compile the cluster kernel to a trap:
// the launcher never selects it there (cudaDevAttrClusterLaunch).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define ONNX_NORM_NO_CLUSTERS 1
#endif

#if !defined(ONNX_NORM_EMULATED_CLUSTERS) && !defined(ONNX_NORM_NO_CLUSTERS)
namespace onnx_norm {
namespace cuda {

__device__ __forceinline__ unsigned ClusterRank() { return __clusterRelativeBlockRank(); }
__device__ __forceinline__ unsigned ClusterSize() { return __clusterDim().x; }
__device__ __forceinline__ unsigned ClusterIndex() { return __clusterIdx().x; }
__device__ __forceinline__ unsigned ClusterCount() { return __clusterGridDimInClusters().x; }

// Every thread of every block of the cluster: barrier.cluster.arrive (release) + wait (acquire), so
// shared-memory writes before it are visible to the peers' reads after it.
__device__ __forceinline__ void ClusterSync() {
  __cluster_barrier_arrive();
  __cluster_barrier_wait();
}

// The same variable in the shared memory of the cluster's block `rank` (mapa).
template <typename T>
__device__ __forceinline__ T* ClusterMapShared(T* p, unsigned rank) {
  return static_cast<T*>(__cluster_map_shared_rank(p, rank));
}

}  // namespace cuda
}  // namespace onnx_norm
#endif
