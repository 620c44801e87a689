// Probe E1 of issue 51 (the embedded sweep), built only with TPFUSE_PROBE_E1=2: a synthetic sweeper
// on the producer warpgroup's spare warp (warp 3, all 32 lanes). It does the loads, adds and stores
// one step of the designed sweep would, on the proxy's preset partials, so that its cost beside the
// K loops can be measured; its sums are wrong by design (unchecked timing only).
//
// At every step of every CTA (tiles of 128 x 256, one owner a tile, every slab staged whole), once
// the sender has read the step's chunk buffers and before the consumers stage the next step's slab,
// it reduces one 16 x 256 stripe: rows 16 * (cta % 8) .. + 16 of this rank's own tile at the step's
// tile's (segment_row, col_begin) (the stripe a CTA of a round's 8 would take if they shared the own
// tile; the step's tile is read from consumer 0's hand-off). For each half of 8 rows it bulk-loads
// (1D cp.async.bulk, global -> shared, a 512-byte row a copy, spread over the lanes; one mbarrier a
// half) the 7 peers' BF16 rows from this rank's receive buffer and 8 rows of an FP32 "park" (a
// static ring of one 16 KB stripe per CTA, L2-resident, standing in for the consumers' parked
// accumulators, which this probe does not write) into the chunk buffers, adds park + peer 0 + ... +
// peer 6 in FP32 in that order (8 columns a lane), rounds once, and stores the BF16 rows into this
// rank's output with 16-byte stores. Then it arrives on sweep_done, which the consumers wait on
// before they stage again. It runs in the producer warpgroup's 40 registers.
//
// The chunk buffers (2 consumers x 4 chunks x 8 KB = 64 KB) hold, in bytes:
//   [0, 8K)       the park's 8 rows of the half being added (FP32, 1 KB a row)
//   [8K, 36K)     half 0: peer j's row r at 8K + (8j + r) * 512 (BF16, 256 columns)
//   [36K, 64K)    half 1: likewise
// Both halves' peers are loaded at once (64 KB in flight); half 1's park rows are loaded into the
// park's slot one row at a time, as half 0's adds finish reading each row there.
//
// Ordering: the sweeper waits on each consumer's `sent` of the step (the sender's TMA stores have
// read the buffers: bulk wait_group.read) before its bulk loads write them; its lanes read them
// (generic proxy) after the half's mbarrier completes; before a bulk load overwrites what its lanes
// read (a park row; the next step's loads), every lane fences generic -> async proxy and the warp
// syncs; before sweep_done every lane has read the buffers (fence, __syncwarp, then lane 0
// arrives: release at CTA scope), and the consumers' staging writes come after their wait.
#pragma once

#if TPFUSE_PROBE_E1 >= 2

#include "comm/device.cuh"
#include "gemm/mainloop.cuh"
#include "gemm/slab_store.cuh"
#include "ops/gemm_rs/protocol.cuh"
#include "ops/gemm_rs/push_timeline.h"
#include "ops/gemm_rs/schedule.h"
#include "ops/gemm_rs/shared_storage.h"

namespace tpfuse::kernels {

struct SweepProbe {
  static constexpr int kRows = 16;       // a stripe: 16 rows x 256 columns of the own tile
  static constexpr int kCols = 256;
  static constexpr int kHalfRows = 8;    // loaded and added in two halves
  static constexpr int kSources = 7;     // peers: the sweeper runs at P = 8 only (op.cuh)
  static constexpr int kStripesPerTile = 8;
  static constexpr uint32_t kParkRowBytes = kCols * 4;
  static constexpr uint32_t kParkHalfBytes = kHalfRows * kParkRowBytes;              // 8 KB
  static constexpr uint32_t kPeerRowBytes = kCols * 2;                               // 512 B
  static constexpr uint32_t kPeersHalfBytes = kSources * kHalfRows * kPeerRowBytes;  // 28 KB
  // Where half h's peer rows start in the chunk buffers.
  __device__ static constexpr uint32_t peers_at(int h) { return kParkHalfBytes + uint32_t(h) * kPeersHalfBytes; }
  static_assert(kParkHalfBytes + 2 * kPeersHalfBytes == 64 * 1024, "the 64 KB of the chunk buffers");

  // The tiles the sweeper runs on: BF16 inputs (what the probe measures), 128 x 256, two consumers,
  // each slab staged whole (64 KB of chunk buffers, one hand-off a slab).
  template <class Config>
  static constexpr bool kTakes = Config::kDType == DType::kBF16 && Config::kBlockM == 128 &&
                                 Config::kBlockN == 256 && Config::kConsumers == 2 &&
                                 Config::kStagedChunks == Config::kChunksPerSlab;

  // The sweeper warp: one stripe per step of this CTA.
  template <class Config>
  __device__ static void sweep(const PushReduceParams& p, const TileSchedule& schedule, StorageOf<Config>& smem,
                               int cta, int num_ctas);

 private:
  // One step's stripe: the CTA's step i.
  template <class Config>
  __device__ static void step(const PushReduceParams& p, StorageOf<Config>& smem, int stripe, uint32_t i);
};

// Register-lean helpers: the sweeper's warp has the producer warpgroup's 40 registers, and values
// the compiler hoists out of its loops leave too few for the loads of a row to be in flight together.
// So the lane, the CTA and the step's note are read where they are needed (volatile: never hoisted).
__device__ __forceinline__ uint32_t sweep_lane() {
  uint32_t lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}
__device__ __forceinline__ uint32_t sweep_cta_id() {
  uint32_t cta;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  return cta;
}
__device__ __forceinline__ int4 sweep_read_note(uint32_t addr) {
  int4 v;
  asm volatile("ld.volatile.shared.v4.s32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sweep_write_note(uint32_t addr, int4 v) {
  asm volatile("st.volatile.shared.v4.s32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Shared-memory loads through a generic pointer made from the shared address (the compiler then
// knows the space and schedules them as its own), and a vector store.
__device__ __forceinline__ uint4 sweep_lds128(uint32_t addr) {
  return *static_cast<const uint4*>(__cvta_shared_to_generic(addr));
}
__device__ __forceinline__ void sweep_stg128(void* ptr, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// The park ring: one FP32 stripe per CTA (of a launch's first kParkSlots), contiguous. Never written:
// its numbers are zero; only its bytes and place (L2) matter.
constexpr int kParkSlots = 264;
static __device__ float g_sweep_park[kParkSlots][SweepProbe::kRows * SweepProbe::kCols];

template <class Config>
__device__ void SweepProbe::sweep(const PushReduceParams& p, const TileSchedule& schedule, StorageOf<Config>& smem,
                                  int cta, int num_ctas) {
  if constexpr (!kTakes<Config>) {
    return;
  } else {
    if (!p.probe_sweep) return;
    // This CTA's steps (CtaSteps: one a wave, the last wave's only where its place is before the end).
    const int num_tiles = schedule.num_tiles();
    const int waves = num_tiles / num_ctas;
    const uint32_t num_steps = waves + ((cta + waves) % num_ctas < num_tiles - waves * num_ctas ? 1 : 0);
    const int stripe = kRows * (cta % kStripesPerTile);
    for (uint32_t i = 0; i < num_steps; ++i) step<Config>(p, smem, stripe, i);
  }
}

template <class Config>
__device__ __forceinline__ void SweepProbe::step(const PushReduceParams& p, StorageOf<Config>& smem, int stripe,
                                                 uint32_t i) {
  const uint32_t base = ptx::smem_addr(&smem.chunks[0][0][0]);
  const uint32_t note = ptx::smem_addr(&smem.op.sweep_note[0]);
  // The sender's TMA stores of both consumers' slabs of this step have read the chunk buffers.
  ptx::mbarrier_wait(&smem.op.handoff[0].sent, i & 1);
  ptx::mbarrier_wait(&smem.op.handoff[1].sent, i & 1);
  if (sweep_lane() == 0) {
    // The step's tile, from consumer 0's hand-off (its slab's first row in the segment, its first
    // column): the consumers write the next one only after sweep_done. The own tile at the same place
    // has the same rows and columns (a band of one segment). The note: the stripe's first row in this
    // rank's segment, its first column, its rows and columns.
    const int first_row = smem.op.handoff[0].row + stripe;
    const int col_begin = smem.op.handoff[0].col;
    const int rows = max(0, min(kRows, p.rows_per_rank - first_row));
    const int cols = max(0, min(kCols, p.n - col_begin));
    sweep_write_note(note, {first_row, col_begin, rows, cols});
    if (p.timeline != nullptr) record_probe(p.timeline, ProbeKind::kSweepStart, int(i));
    const uint32_t peer_bytes = uint32_t(cols) * 2 * kSources;
    ptx::mbarrier_arrive_expect_tx(&smem.op.sweep_half[0], kParkHalfBytes + peer_bytes * min(rows, kHalfRows));
    // Half 1's park rows come later, row by row, on the same barrier.
    ptx::mbarrier_arrive_expect_tx(&smem.op.sweep_half[1], kParkHalfBytes + peer_bytes * max(0, rows - kHalfRows));
  }
  __syncwarp();
  {
    // The loads, spread over the lanes: lane L < 28 peer j = L / 4, rows 2 (L % 4) and 2 (L % 4) + 1 of
    // both halves; lane 31 the park's half 0. (Half 1's park rows: lane 0, after half 0's adds.)
    const uint32_t lane = sweep_lane();
    const int4 n = sweep_read_note(note);  // first_row, col_begin, rows, cols
    if (lane == 31) {
      ptx::bulk_load(&smem.chunks[0][0][0], g_sweep_park[sweep_cta_id() % kParkSlots], kParkHalfBytes,
                     &smem.op.sweep_half[0]);
    } else if (lane < 4 * kSources && n.w > 0) {
      const int j = lane / 4, row = 2 * (lane % 4);
      const int source = j < p.rank ? j : j + 1;  // peers in rank order, skipping this rank
      const uint32_t epoch = comm::call_epoch(p.calls);
      const uint16_t* src = p.recv[p.rank] + (epoch & 1) * p.recv_parity_elems +
                            (size_t(source) * p.rows_per_rank + n.x + row) * p.n + n.y;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (kHalfRows * h + row + r < n.z) {
            ptx::bulk_load(reinterpret_cast<uint8_t*>(&smem.chunks[0][0][0]) + peers_at(h) +
                               (j * kHalfRows + row + r) * kPeerRowBytes,
                           src + size_t(kHalfRows * h + r) * p.n, uint32_t(n.w) * 2, &smem.op.sweep_half[h]);
          }
        }
      }
    }
  }
#pragma unroll 1
  for (int h = 0; h < 2; ++h) {
    ptx::mbarrier_wait(&smem.op.sweep_half[h], i & 1);
#pragma unroll 1
    for (int r = 0; r < kHalfRows; ++r) {
      // 8 columns a lane (8 * lane ..): park, then the peers in rank order, in FP32, rounded once.
      const uint32_t col = 8 * sweep_lane();
      const uint4 park_lo = sweep_lds128(base + r * kParkRowBytes + 4 * col);
      const uint4 park_hi = sweep_lds128(base + r * kParkRowBytes + 4 * col + 16);
      float acc[8] = {__uint_as_float(park_lo.x), __uint_as_float(park_lo.y), __uint_as_float(park_lo.z),
                      __uint_as_float(park_lo.w), __uint_as_float(park_hi.x), __uint_as_float(park_hi.y),
                      __uint_as_float(park_hi.z), __uint_as_float(park_hi.w)};
      const uint32_t peer = base + peers_at(h) + r * kPeerRowBytes + 2 * col;
#pragma unroll
      for (int j = 0; j < kSources; ++j) {
        const uint4 v = sweep_lds128(peer + j * kHalfRows * kPeerRowBytes);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // A BF16 is the top half of the FP32 of the same value.
          acc[2 * e] += __uint_as_float(w[e] << 16);
          acc[2 * e + 1] += __uint_as_float(w[e] & 0xffff0000u);
        }
      }
      const int4 n = sweep_read_note(note);
      if (kHalfRows * h + r < n.z && int(col) < n.w) {
        uint16_t* out = p.out_rows + size_t(n.x + kHalfRows * h + r) * p.n + n.y + col;
        sweep_stg128(out, {pack_bf16x2(acc[0], acc[1]), pack_bf16x2(acc[2], acc[3]), pack_bf16x2(acc[4], acc[5]),
                           pack_bf16x2(acc[6], acc[7])});
      }
      if (h == 0) {
        // Park row r has been read by every lane: half 1's row r may land there.
        ptx::fence_proxy_async_shared();
        __syncwarp();
        if (sweep_lane() == 0) {
          ptx::bulk_load(reinterpret_cast<uint8_t*>(&smem.chunks[0][0][0]) + r * kParkRowBytes,
                         g_sweep_park[sweep_cta_id() % kParkSlots] + (kHalfRows + r) * kCols, kParkRowBytes,
                         &smem.op.sweep_half[1]);
        }
      }
    }
  }
  // Every lane has read the buffers before the consumers stage into them (and before the next step's
  // bulk loads write them).
  ptx::fence_proxy_async_shared();
  __syncwarp();
  if (sweep_lane() == 0) {
    if (p.timeline != nullptr) record_probe(p.timeline, ProbeKind::kSweepEnd, int(i));
    ptx::mbarrier_arrive(&smem.op.sweep_done);
  }
}

}  // namespace tpfuse::kernels

#endif  // TPFUSE_PROBE_E1 >= 2
