// The reduce-scatter's watcher thread (warp 2 of the producer warpgroup): for each own tile of its
// CTA it waits (bounded) for the peers' flags of the tile's reduced slabs, fences, and tells the
// producer, which then streams their partials through the ring; where the config gives rounds it
// also loads the tile's first partials into the consumers' chunk buffers, a round at a time, during
// the K loop. No consumer waits on a peer. (The memory ordering of the flags and the partials: the
// NOTE in ops/gemm_rs/epilogue.cuh.)
#pragma once

#include "comm/device.cuh"
#include "ops/gemm_rs/protocol.cuh"
#include "ops/gemm_rs/schedule.h"
#include "ops/gemm_rs/shared_storage.h"

namespace tpfuse::kernels {

template <bool kSharedTiles>
class PartialWatcher {
  template <class Config>
  using Layout = PushReduceLayout<Config, kSharedTiles>;

 public:
  // The watcher thread: for each own tile of this CTA, in order, waits (bounded) for the peers'
  // flags of the tile and fences, then tells the producer (at most one own tile ahead of it) and
  // feeds the tile's rounds to the consumers.
  template <class Config>
  __device__ static void watch(const PushReduceParams& p, const TileSchedule& schedule, StorageOf<Config>& smem,
                               int cta, int num_ctas) {
    const uint32_t epoch = comm::call_epoch(p.calls);
    uint32_t own_tiles = 0;
    uint32_t rounds_fed = 0;
    int step = 0;  // this CTA's steps before the current one
    for_each_step(schedule, cta, num_ctas, [&](int s, const Tile& tile) {
      // Only a tile's last split reduces (shared tiles may split K).
      const uint32_t reduced = !kSharedTiles || schedule.last_split(s) ? Layout<Config>::reduced_slabs(p, tile) : 0;
      if (reduced != 0) {
        if (own_tiles > 0) ptx::mbarrier_wait(&smem.op.extra_taken, (own_tiles - 1) & 1);
        // A timeout is recorded in p.failed, which the producer reads.
        const bool arrived = wait_for_partials<Config>(p, tile, epoch);
        if (arrived) ptx::fence_acquire_sys();  // flags seen -> partials
        ptx::mbarrier_arrive(&smem.op.extra_ready);
        ++own_tiles;
        if constexpr (Layout<Config>::kSlabFitsBuffers) {
          if (Layout<Config>::has_rounds(p, reduced)) {
            feed_rounds<Config>(p, tile, arrived, step, epoch, smem, rounds_fed);
          }
        }
      }
      ++step;
    });
  }

 private:
  // Watcher thread: loads an own tile's rounds of partials (round r: peer r's partial of the slab)
  // into each consumer's chunk buffers as it asks for them; after a failed call only arrives, so
  // that the consumers finish.
  template <class Config>
  __device__ static void feed_rounds(const PushReduceParams& p, const Tile& tile, bool arrived, int step,
                                     uint32_t epoch, StorageOf<Config>& smem, uint32_t& rounds_fed) {
    if (arrived) ptx::fence_proxy_async_global();  // the partials, for the TMA loads (async proxy)
    for (int r = 0; r < p.partial_rounds; ++r, ++rounds_fed) {
      for (int c = 0; c < Config::kConsumers; ++c) {
        ptx::mbarrier_wait(&smem.op.round_empty[c], rounds_fed & 1);
        // Round 0: the sender's stores of the consumer's previous slab must have read the buffers.
        // (The consumer has staged every earlier hand-off, so that phase is the barrier's current
        // or last one.)
        if (r == 0 && step > 0) {
          ptx::mbarrier_wait(&smem.op.handoff[c].sent, (step * Layout<Config>::kHandoffsPerSlab - 1) & 1);
        }
        uint64_t* full = &smem.op.round_full[c];
        if (!arrived) {
          ptx::mbarrier_arrive(full);
          continue;
        }
        ptx::mbarrier_arrive_expect_tx(full, Config::kChunksPerSlab * Layout<Config>::piece_bytes(p));
        for (int b = 0; b < Config::kChunksPerSlab; ++b) {
          Layout<Config>::load_piece(p, Layout<Config>::slab_piece(p, tile, c, r * Config::kChunksPerSlab + b),
                                     smem.chunks[c][b], full, epoch);
        }
      }
    }
  }

  // Watcher thread: waits, boundedly, for every flag of the tile's reduced slabs (each peer, each slab).
  // The flags are polled with relaxed loads, several in flight at once; the caller fences after.
  template <class Config>
  __device__ static bool wait_for_partials(const PushReduceParams& p, const Tile& tile, uint32_t epoch) {
    static_assert(Config::kConsumers == 2 && 2 * kMaxWorldSize <= 32, "two slab flags per source in one mask");
    uint32_t waiting = 0;  // bit 2 * source + slab: a flag not seen yet
    const uint32_t own = Layout<Config>::own_slabs(p, tile);
    for (int s = 0; s < Config::kConsumers; ++s) {
      const Slab<Config> slab = Slab<Config>::of_consumer(s);
      if (!(own & (1u << s))) continue;
      if (tile.row_begin + slab.row >= tile.row_end || tile.col_begin + slab.col >= tile.col_end) continue;
      for (int source = 0; source < p.world_size; ++source) {
        if (source != p.rank) waiting |= 1u << (2 * source + s);
      }
    }
    const uint32_t* flags = flag_at(p, p.rank, flag_index<Config>(p, 0, tile, 0), epoch & 1);
    const size_t source_stride = flag_source_stride(p);
    const uint64_t deadline = comm::wait_deadline(p.timeout_ns);
    // Four loads in flight at a time (more would spill registers in the 40 the watcher has).
    return comm::wait_bounded</*kEndsOnFailure=*/true, 100>(
        p, deadline,
        [&] {
          waiting = comm::poll_flags<2 * kMaxWorldSize, 4>(
              waiting, epoch, [&](int f) { return flags + (f / 2) * source_stride + f % 2; });
          return waiting == 0;
        },
        [] {},
        [&] {
          const int f = __ffs(waiting) - 1;
          const Slab<Config> slab = Slab<Config>::of_consumer(f % 2);
          return comm::Awaited{f / 2, tile.row_begin + slab.row, tile.col_begin + slab.col};
        });
  }
};

}  // namespace tpfuse::kernels
