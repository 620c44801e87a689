// Thin wrappers over the Hopper instructions the kernels use: mbarriers, TMA copies, bulk-group
// waits, proxy fences, system-scope flags, and WGMMA shared-memory descriptors. Shared by the GEMM
// and the communication layer.
#pragma once

#include <cuda.h>
#include <cstdint>

namespace tpfuse::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// ---- mbarrier ----------------------------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrive_count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(arrive_count));
}

// Makes the barrier inits visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Waits until the phase with the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// ---- TMA (bulk tensor copies) -------------------------------------------------------------------

// Loads a 2D box at (x = inner coordinate, y) into shared memory; completion counts bytes on `bar`.
__device__ __forceinline__ void tma_load_2d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_addr(smem_dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y)
      : "memory");
}

// Loads a 4D box at (x, y, z, w) into shared memory; completion counts bytes on `bar`.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, uint64_t* bar, int x, int y, int z,
                                            int w) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(
          smem_addr(smem_dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(x), "r"(y), "r"(z), "r"(w)
      : "memory");
}

// Stores a 2D box from shared memory to global memory (local or peer-mapped) at (x, y). Parts of the
// box outside the tensor are not written.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* smem_src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(smem_addr(smem_src)), "r"(x), "r"(y)
               : "memory");
}

// The same for a 4D tensor: (x, y) within matrix (z, w).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem_src, int x, int y, int z, int w) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(map),
               "r"(smem_addr(smem_src)), "r"(x), "r"(y), "r"(z), "r"(w)
               : "memory");
}

// Contiguous bulk copies (no tensor map): `bytes` (a multiple of 16, 16-byte aligned addresses)
// from global memory into shared memory, completion counted on `bar`; and from shared memory to
// global memory (local or peer-mapped), in the current bulk group, with an L2 cache policy.
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(smem_dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

// An L2 policy that evicts the lines it is given first: for data this SM writes and will not read
// again, which should not push others' working sets out of the L2.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void bulk_store(void* dst, const void* smem_src, uint32_t bytes, uint64_t policy) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(dst),
               "r"(smem_addr(smem_src)), "r"(bytes), "l"(policy)
               : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until at most N bulk groups are pending their READ of shared memory: the source buffer may
// be reused. NOTE: this says nothing about the data having landed in global memory.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Waits until at most N bulk groups are pending at all: their writes are complete (visible to this
// thread). Required before signalling another GPU that a TMA store has landed.
template <int N>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA) reads.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Orders async-proxy global accesses after this thread's earlier generic-proxy ones (e.g. after an
// acquire of a flag, before a TMA read of the data it guards).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Brings the 128-byte line of `address` into L1, for loads that follow later.
__device__ __forceinline__ void prefetch_l1(const void* address) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(address));
}

// Stores four 8x8 BF16 matrices to shared memory: register i of every thread is its piece of matrix
// i (row lane / 4, columns 2 * (lane % 4) + {0, 1}); thread t gives the address of row t % 8 of
// matrix t / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// Loads four 8x8 BF16 matrices from shared memory: the inverse of stmatrix_x4, same addressing.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

// ---- barriers among a subset of warps -----------------------------------------------------------

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// True in every thread of the `threads` that sync on named barrier `id` when `pred` is true in any.
__device__ __forceinline__ bool named_barrier_any(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n"
      ".reg .pred p, q;\n"
      "setp.ne.u32 p, %1, 0;\n"
      "bar.red.or.pred q, %2, %3, p;\n"
      "selp.u32 %0, 1, 0, q;\n"
      "}\n"
      : "=r"(any)
      : "r"(uint32_t(pred)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

// ---- counters in global memory ------------------------------------------------------------------

// Adds to a 64-bit counter without waiting for the result (no ordering of its own).
__device__ __forceinline__ void red_add_u64(uint64_t* counter, uint64_t value) {
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(counter), "l"(value) : "memory");
}

// Adds to a 32-bit counter and returns its value before (no ordering of its own: pair it with
// fence_acq_rel_gpu).
__device__ __forceinline__ uint32_t atomic_add_relaxed_gpu(uint32_t* counter, uint32_t value) {
  uint32_t old;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(value) : "memory");
  return old;
}

__device__ __forceinline__ void store_relaxed_gpu(uint32_t* counter, uint32_t value) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(counter), "r"(value) : "memory");
}

// Orders this thread's earlier accesses (and those it has synchronized with: a barrier's) before its
// later ones, for every thread of the GPU: before a counter's add, a release; after it, an acquire.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// ---- register reallocation between warpgroups ---------------------------------------------------

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- system-scope flags (cross-GPU signalling) ----------------------------------------------------

__device__ __forceinline__ void store_release_sys(uint32_t* flag, uint32_t value) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

// Several flags raised at once: one release fence, then relaxed stores (the fence orders what came
// before it before each of them), instead of a release store each. A release only (not acq_rel):
// nothing after it needs ordering, and it skips the L1 invalidation.
__device__ __forceinline__ void fence_release_sys() { asm volatile("fence.release.sys;" ::: "memory"); }
__device__ __forceinline__ void store_relaxed_sys(uint32_t* flag, uint32_t value) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(flag), "r"(value) : "memory");
}

// Counts one arrival at a counter of `arrivals` at system scope: returns the count before it; the last
// arrival (which sees arrivals - 1) leaves the counter at 0 again. No ordering of its own (several
// can be in flight): a release fence before it, and for the last arrival an acquire fence after.
__device__ __forceinline__ uint32_t count_arrival_relaxed_sys(uint32_t* counter, uint32_t arrivals) {
  uint32_t old;
  asm volatile("atom.relaxed.sys.global.inc.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(arrivals - 1) : "memory");
  return old;
}

// No ordering of its own (several can be in flight): pair with fence_acquire_sys once one is seen.
__device__ __forceinline__ uint32_t load_relaxed_sys(const uint32_t* flag) {
  uint32_t value;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(flag));
  return value;
}

// After relaxed loads that observed release stores, orders every later access after those stores'
// releases (the PTX memory model's acquire pattern: strong load, then fence). An acquire only: it
// invalidates the L1 and does not wait for this thread's own writes to drain at system scope, as an
// acq_rel fence does.
__device__ __forceinline__ void fence_acquire_sys() { asm volatile("fence.acquire.sys;" ::: "memory"); }

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- WGMMA shared-memory matrix descriptors (128-byte swizzle) -----------------------------------

// A tile stored K-major with 128-byte rows (64 BF16 of K per row, TMA SWIZZLE_128B): 8-row groups
// are 1024 bytes apart. Stepping 16 elements of K adds 32 bytes to the start address.
__device__ __forceinline__ uint64_t smem_desc_k_major_sw128(const void* tile) {
  const uint64_t addr = smem_addr(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// A tile stored MN-major as column chunks of 64 BF16 (128-byte rows, one row per K index, TMA
// SWIZZLE_128B), each chunk `chunk_bytes` apart: the leading offset steps between 64-wide chunks
// along MN, the stride offset between 8-row groups along K (1024 bytes). Stepping 16 elements of K
// adds 16 rows = 2048 bytes to the start address.
__device__ __forceinline__ uint64_t smem_desc_mn_major_sw128(const void* tile, uint32_t chunk_bytes) {
  const uint64_t addr = smem_addr(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(chunk_bytes >> 4) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

}  // namespace tpfuse::ptx
