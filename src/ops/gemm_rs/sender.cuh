// The reduce-scatter's sender thread (warp 1 of the producer warpgroup). The consumers only stage a
// finished slab in shared memory; the sender (SlabHandoff) stores it, a pushed chunk at a time, and
// raises the pushed slabs' flags. It waits for the consumers only, never for a peer, so a flag goes
// up as soon as its slab has landed, whatever the consumers wait for next. (The memory ordering of
// a push and its flags: the NOTE in ops/gemm_rs/epilogue.cuh.)
#pragma once

#include "comm/device.cuh"
#include "ops/gemm_rs/protocol.cuh"
#include "ops/gemm_rs/push_timeline.h"
#include "ops/gemm_rs/schedule.h"
#include "ops/gemm_rs/shared_storage.h"

namespace tpfuse::kernels {

// kRecordsPushes: as the epilogue's (epilogue.cuh).
template <bool kSharedTiles, bool kRecordsPushes>
class SlabSender {
  template <class Config>
  using Layout = PushReduceLayout<Config, kSharedTiles>;

 public:
  // Pushed chunks the sender lets the TMA unit hold unread at a time: a step's pushes queued at
  // once measured slower on the compute-bound shapes (docs/EXPERIMENTS.md).
  static constexpr int kPushQueue = 1;

  // The sender thread: stores the slabs the consumers stage, step by step, each into its owner's
  // receive slot (or this rank's output), and raises the flags of the pushed ones once landed.
  template <class Config>
  __device__ static void send(const PushReduceParams& p, const TileSchedule& schedule, StorageOf<Config>& smem,
                              int cta, int num_ctas) {
    constexpr uint32_t kAllSlabs = (1u << Config::kConsumers) - 1;
    const uint32_t epoch = comm::call_epoch(p.calls);
    const int num_tiles = schedule.num_tiles();
    uint32_t handoffs[Config::kConsumers] = {};  // taken from each consumer so far
    for (CtaSteps steps(cta, num_ctas); steps.step() < num_tiles; steps.next()) {
      if constexpr (kSharedTiles) {
        if (!schedule.last_split(steps.step())) continue;  // no hand-offs
      }
      // The pushes first: an own slab waits for its peers' partials, and in a band of several
      // segments the partners' partials of it wait for this rank's pushes of their rows.
      // Without bands a step's slabs are all pushed or all own: one batch, and no schedule to walk
      // (walking it cost the fused call 0.5%).
      uint32_t slabs = kAllSlabs, own = 0;
      if (schedule.shape().segments_per_tile != 1) {
        const Tile tile = schedule.tile(steps.step());
        slabs = Layout<Config>::pushed_slabs(p, tile);
        own = Layout<Config>::own_slabs(p, tile);
      }
      // One call site: the stores are compiled once.
#pragma unroll 1
      for (int batch = 0; batch < 2; ++batch, slabs = own) send_slabs<Config>(p, smem, slabs, handoffs, epoch);
    }
  }

 private:
  // Sender thread: stores the given slabs of a step (a bit per consumer; `handoffs` counts each
  // consumer's hand-offs taken so far), a pushed chunk of one owner as a bulk group of its own and
  // the others of a hand-off as one, hands the chunk buffers back once read, and raises the flags of
  // the pushed slabs once every group has landed.
  template <class Config>
  __device__ static void send_slabs(const PushReduceParams& p, StorageOf<Config>& smem, uint32_t slabs,
                                    uint32_t (&handoffs)[Config::kConsumers], uint32_t epoch) {
    if (slabs == 0) return;
    SlabOwners flagged[Config::kConsumers];
    int flags[Config::kConsumers];
    for (int c = 0; c < Config::kConsumers; ++c) flags[c] = -1;
    bool any_flag = false;
#pragma unroll 1
    for (int h = 0; h < Layout<Config>::kHandoffsPerSlab; ++h) {
      for (int c = 0; c < Config::kConsumers; ++c) {
        if (!(slabs & (1u << c))) continue;
        SlabHandoff& slab = smem.op.handoff[c];
        ptx::mbarrier_wait(&slab.staged, handoffs[c]++ & 1);
        if (slab.flag >= 0) {
          flags[c] = slab.flag;
          flagged[c] = {slab.first_owner, slab.last_owner};
          any_flag = true;
        }
        if constexpr (kRecordsPushes) {
          if (slab.num_chunks > 0) record_handoff(p, slab);
        }
        for (int i = 0; i < slab.num_chunks; ++i) {
          const int col = slab.col + i * kChunkCols;
          if constexpr (!kSharedTiles) {
            if (slab.to_output) {
              ptx::tma_store_2d(&p.out, smem.chunks[c][i], col, slab.row);
            } else {
              ptx::tma_store_4d(&p.recv_at[slab.first_owner], smem.chunks[c][i], col, slab.row, p.rank, epoch & 1);
              ptx::bulk_commit_group();
              ptx::bulk_wait_group_read<kPushQueue - 1>();
            }
            continue;
          }
          if (slab.to_output) {
            const BoxPlace box = place_box(slab.row);
            ptx::tma_store_2d(&p.out, smem.chunks[c][i] + box.chunk_row * kChunkCols, col, box.segment_row);
            continue;
          }
          // One box per other owner of the slab, all queued: they are a segment's rows each.
          for (int owner = slab.first_owner, row = slab.row; owner <= slab.last_owner; ++owner, row -= p.rows_per_rank) {
            if (owner == p.rank) continue;
            const BoxPlace box = place_box(row);
            ptx::tma_store_4d(&p.recv_at[owner], smem.chunks[c][i] + box.chunk_row * kChunkCols, col, box.segment_row,
                              p.rank, epoch & 1);
          }
        }
      }
      ptx::bulk_commit_group();
      ptx::bulk_wait_group_read<0>();
      for (int c = 0; c < Config::kConsumers; ++c) {
        if (slabs & (1u << c)) ptx::mbarrier_arrive(&smem.op.handoff[c].sent);
      }
    }
    if (!any_flag) return;
    ptx::bulk_wait_group<0>();
    ptx::fence_proxy_async_global();
    ptx::fence_release_sys();
    for (int c = 0; c < Config::kConsumers; ++c) {
      if (flags[c] < 0) continue;
      for (int owner = flagged[c].first; owner <= flagged[c].last; ++owner) {
        if (owner != p.rank) raise_flag(flag_at(p, owner, flags[c], epoch & 1), epoch);
      }
    }
  }

  // Sender thread: a hand-off's stores in the push timeline, one event (its boxes to every other
  // owner of the slab, the first of them named; or this rank's rows into its output).
  __device__ static void record_handoff(const PushReduceParams& p, const SlabHandoff& slab) {
    const bool holds_own = slab.first_owner <= p.rank && p.rank <= slab.last_owner;
    const int boxes = slab.to_output ? 1 : slab.last_owner - slab.first_owner + 1 - holds_own;
    const uint32_t bytes = uint32_t(slab.num_chunks) * uint32_t(boxes * p.box_rows * kChunkCols) * sizeof(uint16_t);
    const int owner = slab.to_output ? p.rank : slab.first_owner + (slab.first_owner == p.rank);
    record_push(p.timeline, ptx::globaltimer_ns(), bytes, owner);
  }
};

}  // namespace tpfuse::kernels
