// The fused op's epilogue: a finished slab of another rank's rows is pushed (BF16, TMA store) into
// that owner's receive slot and signalled with an epoch flag; a slab of this rank's own rows is left
// in FP32 and reduced later with its P-1 peers' partials, in rank order, rounded once, in the shadow
// of the following tiles' mainloops (own_slab_reducer.cuh). A tile's slabs have one owner, or in a
// band of two segments (plan/schedule.h) one each. No consumer waits for a peer before its last
// tile, so no order of the pushes can make two ranks wait for each other.
//
// Receive buffer of each rank (symmetric, on its own GPU), double-buffered by call parity; each
// parity half has a fixed base (sized for the largest problem), the rest is laid out for this call:
//   recv[parity][source rank][rows_per_rank][n]          BF16
//   flags[parity][source rank][tile in band][slab]       u32 epoch values
// A rank's calls alternate parity, so the pushes of call e+1 never land on the data of call e. A
// peer can only reach call e+2 (same parity as e) after this rank has started call e+1, i.e. after
// it has finished consuming call e: its own rows in e+1 need this rank's pushes of e+1.
//
// The consumers only stage a finished slab in shared memory; a sender thread (SlabHandoff) stores
// it, the pushed slabs of a tile as one bulk group, and raises their flags. It waits for the
// consumers only, never for a peer, so a flag goes up as soon as its slab has landed.
//
// NOTE (memory ordering, per pushed tile): the sender waits for its bulk group to COMPLETE
// (cp.async.bulk.wait_group, not the .read variant), fences the async proxy, then stores each flag
// with release semantics at system scope. The owner's watcher thread polls the flags with relaxed
// system-scope loads, then fences (acquire at system scope) and publishes its progress in shared
// memory with a CTA-scope release; the consumers read it with a CTA-scope acquire before their
// (generic, L2-only) loads of the partials, so the peers' writes happen before those loads.
#pragma once

#include "kernels/own_slab_reducer.cuh"
#include "kernels/peer_error.h"
#include "kernels/tile_store.cuh"
#include "tpfuse/problem.h"

namespace tpfuse::kernels {

// Flag values compare modulo 2^32, so the epoch may wrap.
__device__ __forceinline__ bool epoch_reached(uint32_t flag, uint32_t epoch) { return int32_t(flag - epoch) >= 0; }

// What the fused op's epilogue needs of one rank's call.
struct PushReduceParams {
  int rank;
  int world_size;
  int rows_per_rank;
  int n;
  int col_tiles;
  int block_m;
  int block_n;
  int tiles_per_band;
  CUtensorMap recv_at[kMaxWorldSize];  // each owner's receive buffer, 4D: (column, row, source, parity)
  CUtensorMap out;                     // rows_per_rank x n, this rank's output
  __nv_bfloat16* out_rows;             // the same, for the reduced rows' generic stores
  const __nv_bfloat16* recv;           // this rank's receive buffer (recv_at[rank]'s memory)
  size_t recv_parity_elems;            // distance between its two parity halves
  float* own_partial;                  // rows_per_rank x n FP32: own slabs waiting for their partials
  uint32_t* flags_at[kMaxWorldSize];   // each owner's flag array (flags_at[rank] is this rank's own)
  size_t flags_parity_words;           // distance between the two parity halves of a flag array
  const uint32_t* epoch_counter;       // calls completed on this rank; this call's epoch is one more
  uint32_t* failed;                    // set by the first wait of this rank that times out
  PeerError* error;                    // host-mapped
  uint64_t timeout_ns;
};

template <class Config>
class PushReduceEpilogue {
 public:
  using Params = PushReduceParams;

  static constexpr bool kHasSender = true;
  static constexpr bool kHasWatcher = true;

  __device__ PushReduceEpilogue(const Params& params, const TileSchedule& schedule, int cta, int num_ctas,
                                int consumer, ChunkBuffers buffers, SharedStorage<Config>& smem)
      : p_(params), consumer_(consumer), slabs_(consumer, buffers), handoff_(buffers.handoff),
        parity_(call_epoch(params) & 1),
        reducer_(OwnRows{params.own_partial, params.recv + size_t(parity_) * params.recv_parity_elems,
                         params.out_rows, params.n, size_t(params.rows_per_rank) * size_t(params.n), params.rank,
                         params.world_size - 1},
                 schedule, cta, num_ctas, consumer, &smem.inputs_arrived) {}

  // The sender thread: stores the slabs the consumers stage, step by step, each into its owner's
  // receive slot (or this rank's output), and raises the flags of the pushed ones once landed.
  __device__ static void send(const Params& p, const TileSchedule& schedule, SharedStorage<Config>& smem, int cta,
                              int num_ctas) {
    static_assert(Config::kCluster == 1, "every step of a CTA stages its slabs (no duplicate steps of a pair)");
    const uint32_t epoch = call_epoch(p);
    const int num_tiles = schedule.num_tiles();
    for (int wave = 0, step = cta; has_work<Config>(step, num_tiles); step = step_of<Config>(cta, num_ctas, ++wave)) {
      send_slabs(p, smem, wave, epoch);
    }
  }

  // The watcher thread: for each own tile of this CTA, in order, waits (bounded) for the peers'
  // flags of the tile and fences, then publishes that the CTA's waves up to that tile's have their
  // inputs in.
  __device__ static void watch(const Params& p, const TileSchedule& schedule, SharedStorage<Config>& smem, int cta,
                               int num_ctas) {
    const uint32_t epoch = call_epoch(p);
    int waves = 0;
    for_each_work<Config>(schedule, cta, num_ctas, [&](const Work& work) {
      ++waves;
      if (p.world_size == 1 || !has_own_slab(p, work.tile)) return;
      // A timeout is recorded in p.failed; the consumers then reduce whatever is there, and the
      // call reports the error.
      if (wait_for_partials(p, work.tile, epoch)) ptx::fence_acquire_sys();  // flags seen -> partials
      ptx::store_release_cta(&smem.inputs_arrived, waves);
    });
  }

  // Once per K block of the mainloop: a step of the own slabs' reduction.
  __device__ void overlap_begin() { reducer_.overlap_begin(); }
  __device__ void overlap_end() { reducer_.overlap_end(); }

  // Consumers, after a tile's K stages: an own slab (with peers) is left in FP32 for the reducer, any
  // other slab is staged for the sender (pushed to its owner, or stored here without peers).
  __device__ void end_tile(const Work& work, Slab<Config> slab, float (&acc)[Config::kAccPerThread]) {
    const OwnSlab own = reducer_.slab_of(work.tile, slabs_staged_);
    if (own.reduced) reducer_.leave(acc, own);
    store(work.tile, slab, acc, own.reduced);  // one call: the store's code is large
    reducer_.end_wave(own);
  }

  // The sender raises the last flags; the own slabs left are reduced here.
  __device__ void finish() { reducer_.finish(); }

 private:
  // This call's epoch: one more than the calls this rank has completed.
  __device__ static uint32_t call_epoch(const Params& p) {
    return *reinterpret_cast<const volatile uint32_t*>(p.epoch_counter) + 1;
  }

  // Whether a slab of the tile holds this rank's rows.
  __device__ static bool has_own_slab(const Params& p, const Tile& tile) {
    for (int c = 0; c < Config::kConsumers; ++c) {
      if (tile.owner_of(Slab<Config>::of_consumer(c).row) == p.rank) return true;
    }
    return false;
  }

  // Stages the slab and hands it to the sender: a pushed slab's flag, an own slab none. A reduced
  // slab hands over nothing to store; the staging's barrier still orders its FP32 values (left by
  // every thread of the warpgroup) before the reducer's loads of them.
  __device__ void store(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread], bool reduced) {
    const int owner = tile.owner_of(slab.row);
    const int segment_row = tile.segment_row_of(slab.row);
    const int col_begin = tile.col_begin + slab.col;
    // A slab past the band's rows or the last column holds nothing: neither pushed nor awaited.
    const bool empty = tile.row_begin + slab.row >= tile.row_end || col_begin >= tile.col_end;
    const int num_chunks = empty || reduced ? 0 : chunks_before<Config>(col_begin, tile.col_end);
    // The sender's stores of the previous slab must have read the chunk buffers.
    if (slabs_staged_ > 0) ptx::mbarrier_wait(&handoff_->sent, (slabs_staged_ - 1) & 1);
    slabs_.stage<Config::kChunksPerSlab>(acc, num_chunks);
    if (slabs_.leader()) {
      const bool pushed = !empty && owner != p_.rank;
      handoff_->destination = owner;
      handoff_->row = segment_row;
      handoff_->col = col_begin;
      handoff_->num_chunks = num_chunks;
      handoff_->flag = pushed ? flag_at(p_, owner, p_.rank, tile, consumer_, parity_) : nullptr;
      ptx::mbarrier_arrive(&handoff_->staged);
    }
    ++slabs_staged_;
  }

  // Sender thread: stores every consumer's staged slab of a step as one bulk group, hands their
  // chunk buffers back once read, and raises the flags of the pushed ones once landed.
  __device__ static void send_slabs(const Params& p, SharedStorage<Config>& smem, int step, uint32_t epoch) {
    uint32_t* flags[Config::kConsumers] = {};
    bool any_flag = false;
    for (int c = 0; c < Config::kConsumers; ++c) {
      SlabHandoff& slab = smem.handoff[c];
      ptx::mbarrier_wait(&slab.staged, step & 1);
      flags[c] = slab.flag;
      any_flag |= slab.flag != nullptr;
      for (int i = 0; i < slab.num_chunks; ++i) {
        const int col = slab.col + i * kChunkCols;
        if (slab.destination == p.rank) {
          ptx::tma_store_2d(&p.out, smem.chunks[c][i], col, slab.row);
        } else {
          ptx::tma_store_4d(&p.recv_at[slab.destination], smem.chunks[c][i], col, slab.row, p.rank, epoch & 1);
        }
      }
    }
    ptx::bulk_commit_group();
    ptx::bulk_wait_group_read<0>();
    for (int c = 0; c < Config::kConsumers; ++c) ptx::mbarrier_arrive(&smem.handoff[c].sent);
    if (!any_flag) return;
    ptx::bulk_wait_group<0>();
    ptx::fence_proxy_async_global();
    for (int c = 0; c < Config::kConsumers; ++c) {
      if (flags[c] != nullptr) ptx::store_release_sys(flags[c], epoch);
    }
  }

  // Watcher thread: waits, boundedly, for every flag of the tile's own slabs (each peer, each slab).
  // The flags are polled with relaxed loads, several in flight at once; the caller fences after.
  __device__ static bool wait_for_partials(const Params& p, const Tile& tile, uint32_t epoch) {
    static_assert(Config::kConsumers == 2 && 2 * kMaxWorldSize <= 32, "two slab flags per source in one mask");
    uint32_t waiting = 0;  // bit 2 * source + slab: a flag not seen yet
    for (int s = 0; s < Config::kConsumers; ++s) {
      const Slab<Config> slab = Slab<Config>::of_consumer(s);
      if (tile.owner_of(slab.row) != p.rank) continue;
      if (tile.row_begin + slab.row >= tile.row_end || tile.col_begin + slab.col >= tile.col_end) continue;
      for (int source = 0; source < p.world_size; ++source) {
        if (source != p.rank) waiting |= 1u << (2 * source + s);
      }
    }
    const uint32_t* flags = flag_at(p, p.rank, 0, tile, 0, epoch & 1);
    const size_t source_stride = size_t(p.tiles_per_band) * 2;
    const uint64_t deadline = ptx::globaltimer_ns() + p.timeout_ns;
    for (;;) {
      // Four loads in flight at a time (more would spill registers in the 40 the watcher has).
      for (int first = 0; first < 2 * kMaxWorldSize; first += 4) {
        uint32_t seen[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int f = first + i;
          if (waiting & (1u << f)) seen[i] = ptx::load_relaxed_sys(flags + (f / 2) * source_stride + f % 2);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int f = first + i;
          if ((waiting & (1u << f)) && epoch_reached(seen[i], epoch)) waiting &= ~(1u << f);
        }
      }
      if (waiting == 0) return true;
      if (*reinterpret_cast<volatile uint32_t*>(p.failed) != 0) return false;  // this call already failed
      if (ptx::globaltimer_ns() > deadline) {
        const int f = __ffs(waiting) - 1;
        report_timeout(p, f / 2, tile.row_begin + Slab<Config>::of_consumer(f % 2).row,
                       tile.col_begin + Slab<Config>::of_consumer(f % 2).col);
        return false;
      }
      __nanosleep(100);
    }
  }

  // The first timeout of this rank's call records what it waited for; the host reads it after the call.
  __device__ static void report_timeout(const Params& p, int source, int row, int col) {
    if (atomicCAS(p.failed, 0u, 1u) != 0u) return;
    volatile PeerError* error = p.error;
    error->waiting_rank = p.rank;
    error->missing_rank = source;
    error->row = row;
    error->col = col;
    __threadfence_system();
    error->code = 1;
    __threadfence_system();
  }

  // Flag of (owner's flag array, source, tile, slab) in the given parity half.
  __device__ static uint32_t* flag_at(const Params& p, int owner, int source, const Tile& tile, int slab, int parity) {
    const int row_tile = tile.segment_row / p.block_m;
    const int col_tile = tile.col_begin / p.block_n;
    const int tile_idx = row_tile * p.col_tiles + col_tile;
    const size_t index = (size_t(source) * p.tiles_per_band + tile_idx) * 2 + slab;
    return p.flags_at[owner] + parity * p.flags_parity_words + index;
  }

  const Params& p_;
  int consumer_;
  SlabStore slabs_;
  SlabHandoff* handoff_;
  int parity_;
  int slabs_staged_ = 0;  // also the CTA's waves this warpgroup has finished
  OwnSlabReducer<Config> reducer_;
};

}  // namespace tpfuse::kernels
