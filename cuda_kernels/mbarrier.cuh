// mbarrier.cuh — Hopper's asynchronous copies and the shared-memory barriers that say when
// they have landed (gemm.cu versions 6-8; layer_norm.cu version 6's copies and the cluster
// sums of versions 4 and 6): one copy, so every kernel that waits on a copy engine or on a
// peer's write says it the same way. Pure CUDA, no torch header; the
// instructions exist on sm_90 and later only, so callers compile their bodies for those
// (__CUDA_ARCH__ >= 900) and their launchers refuse other GPUs first.
//
// The idea in one paragraph: a thread asks the copy engine (the TMA unit) for bytes, and
// the engine writes them to shared memory by itself: no registers hold them on the way, and
// the thread goes on at once. An mbarrier in shared memory counts the bytes in: a thread
// announces how many to expect (expect_tx), the engine's writes count them off, and the
// barrier's phase completes when all have arrived. Waiting threads poll the phase by its
// parity (0, 1, 0, ...): a ring of S buffers, each with its barrier, is on round k / S when
// it holds item k, so the consumer of item k waits for parity (k / S) & 1.
//
// Debug: -DLEVELS_MBAR_TIMEOUT=n (through LEVELS_CUDA_NVCC_FLAGS) makes every wait trap after
// n million polls instead of hanging the GPU, printing the block and thread that waited.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <cstdio>

namespace levels_mbarrier {

__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// `count` arrivals (besides the transaction bytes) complete each phase.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(count) : "memory");
}
// After the barriers are initialised, before any copy may complete on them: the initialised
// words must be visible to the async proxy (the copy engine) and to the cluster.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of copies to wait for in this phase.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_addr(bar)) : "memory");
}
// Wait until the phase of parity `parity` has completed. try_wait may give up after a
// system-dependent time: poll it in a loop.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  const uint32_t addr = shared_addr(bar);
#ifdef LEVELS_MBAR_TIMEOUT
  uint64_t polls = 0;
#endif
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
#ifdef LEVELS_MBAR_TIMEOUT
    if (!done && ++polls > (uint64_t)(LEVELS_MBAR_TIMEOUT) * 1000000ull) {
      printf("mbarrier wait timed out (block %d,%d thread %d, parity %d)\n", blockIdx.x, blockIdx.y,
             threadIdx.x, parity);
      __trap();
    }
#endif
  }
}

// `bytes` contiguous bytes from global memory into this block's shared memory at dst, by the
// copy engine, counted off `bar`'s transactions. Both addresses 16-byte aligned, bytes a
// multiple of 16 (the instruction's contract: the caller's plan guarantees it).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(shared_addr(dst)), "l"(src), "r"(bytes), "r"(shared_addr(bar))
      : "memory");
}

// Two floats into the shared memory of block `peer` of this cluster, at the place that
// `local` has in this block, counted off the peer's mbarrier at the place `local_bar` has
// here (st.async: the write and its count travel together, so the peer's wait on its own
// barrier is all the synchronisation there is; no cluster barrier, no memory fence).
__device__ __forceinline__ void push_f32x2(void* local, uint64_t* local_bar, uint32_t peer, float x,
                                           float y) {
  uint32_t remote, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(shared_addr(local)), "r"(peer));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote_bar) : "r"(shared_addr(local_bar)), "r"(peer));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
               ::"r"(remote), "f"(x), "f"(y), "r"(remote_bar)
               : "memory");
}

}  // namespace levels_mbarrier
