// The reduction of a slab of this rank's own rows, on both of its sides: right after the tile's K
// stages the producer thread streams the peers' partials through the mainloop's ring as extra
// stages (once the watcher has seen their flags, ops/gemm_rs/watcher.cuh), and the consumer adds
// them to its FP32 accumulators in rank order. Most of an own tile's partials need not wait for
// its K stages (where the config gives rounds): the watcher loads them into the consumers' idle
// chunk buffers in rounds, one peer a round, and each consumer adds a round between two K blocks
// while the other consumer's WGMMAs run (partial_rounds.h); the ring streams only the peers no
// round holds.
#pragma once

#include "comm/device.cuh"
#include "gemm/slab_store.cuh"
#include "ops/gemm_rs/partial_rounds.h"
#include "ops/gemm_rs/protocol.cuh"
#include "ops/gemm_rs/shared_storage.h"

namespace tpfuse::kernels {

// A consumer warpgroup's partial rounds (partial_rounds.h), which its epilogue keeps across tiles.
struct RoundProgress {
  int tile_rounds = 0;  // rounds this warpgroup adds during the current tile's K loop
  int next = 0;         // the next of them
  uint32_t added = 0;   // rounds added so far, over all tiles (the parity of round_full)
};

// The consumer warpgroup's side of the reduction, a view made per use over the state its epilogue
// keeps, and the producer thread's side.
template <bool kSharedTiles>
class PartialReducer {
  template <class Config>
  using Layout = PushReduceLayout<Config, kSharedTiles>;

 public:
  __device__ PartialReducer(const PushReduceParams& params, int consumer, const SlabStore& slabs, ChunkBuffer* chunks,
                            RoundProgress& rounds)
      : p_(params), consumer_(consumer), slabs_(slabs), chunks_(chunks), rounds_(rounds) {}

  // Producer thread, after an own tile's K stages: once the watcher has seen the peers' flags of the
  // tile, loads their partials into extra stages of the ring, in the order of partial_piece().
  template <class Config>
  __device__ static void produce_extra_stages(const PushReduceParams& p, const Tile& tile, const KSlice& k_slice,
                                              StorageOf<Config>& smem, StageCursor& ring, uint32_t& own_phase) {
    if constexpr (kSharedTiles) {
      if (k_slice.split != k_slice.num_splits - 1) return;  // only the last split reduces
    }
    const uint32_t reduced = Layout<Config>::reduced_slabs(p, tile);
    if (reduced == 0) return;
    const uint32_t epoch = comm::call_epoch(p.calls);  // a load from global memory: before the wait, not after
    ptx::mbarrier_wait(&smem.op.extra_ready, own_phase);  // the watcher's acquire, passed on at CTA scope
    ptx::mbarrier_arrive(&smem.op.extra_taken);
    own_phase ^= 1;
    const bool arrived = !comm::call_failed(p.failed);
    if (arrived) ptx::fence_proxy_async_global();  // the partials, for the TMA loads (async proxy)
    // The reduced slabs' count as a constant: the piece order's arithmetic, on this one thread per
    // 8 KB piece, then folds into shifts (at run time it took about 80 instructions a piece, not 15).
    if (__popc(reduced) == Config::kConsumers) {
      stream_partials<Config, Config::kConsumers>(p, tile, reduced, epoch, arrived, smem, ring);
    } else {
      stream_partials<Config, 1>(p, tile, reduced, epoch, arrived, smem, ring);
    }
  }

  // Consumers, before a tile's K stages: a slab of the `reduced` ones takes rounds of its peers'
  // partials during them.
  template <class Config>
  __device__ void begin_tile(uint32_t reduced) {
    rounds_.tile_rounds = Layout<Config>::has_rounds(p_, reduced) ? p_.partial_rounds : 0;
    rounds_.next = 0;
  }

  // Consumers, before a step with no epilogue of its own (a split before the last): no rounds.
  __device__ void skip_tile() { rounds_.tile_rounds = 0; }

  // Consumers, after K block kb: asks for round 0 after the first K block, adds a round at its K block
  // (partial_rounds.h).
  template <class Config>
  __device__ __forceinline__ void after_k_block(int kb, float (&acc)[Config::kAccPerThread],
                                                StorageOf<Config>& smem) {
    if constexpr (Layout<Config>::kSlabFitsBuffers) {
      if (rounds_.next >= rounds_.tile_rounds) return;
      if (kb == 0 && slabs_.leader()) ptx::mbarrier_arrive(&smem.op.round_empty[consumer_]);
      if (kb == partial_round_k_block(consumer_, Config::kConsumers, rounds_.next, rounds_.tile_rounds,
                                      p_.num_k_blocks)) {
        add_round<Config>(acc, smem);
      }
    }
  }

  // Adds this warpgroup's pieces of the tile's partials that no round held as the producer streams
  // them in, releasing each extra stage once read. The pieces come source by source, so every
  // element gets its partials in rank order.
  template <class Config>
  __device__ void add_partials(uint32_t reduced, float (&acc)[Config::kAccPerThread], StorageOf<Config>& smem,
                               StageCursor& ring) {
    static_assert(Config::kConsumers <= Config::kPiecesPerStage, "a stage holds a piece of every reduced slab");
    const int num_slabs = __popc(reduced);
    const int num_stages = Layout<Config>::extra_stages(p_, reduced);
    if (num_stages == 0) return;
    const int first = Layout<Config>::round_pieces(p_, reduced);
    int held = 0;  // the extra stage this warpgroup has waited for and not yet released
    // This warpgroup's next piece, counted in the held stage: every num_slabs-th from its place.
    int in_stage = __popc(reduced & ((1u << consumer_) - 1));
    ptx::mbarrier_wait(&smem.ring.full[ring.stage], ring.phase);
    const int num_sources = p_.world_size - 1;
    for (int j = first / Config::kChunksPerSlab; j < num_sources; ++j) {
#pragma unroll
      for (int c = 0; c < Config::kChunksPerSlab; ++c) {
        if (j * Config::kChunksPerSlab + c < first) continue;
        if (in_stage >= Config::kPiecesPerStage) {
          release_extra_stage<Config>(smem, ring);
          ++held;
          in_stage -= Config::kPiecesPerStage;
          ptx::mbarrier_wait(&smem.ring.full[ring.stage], ring.phase);
        }
        add_chunk_bf16(stage_piece<Config>(smem, ring.stage, in_stage), acc + c * 32);
        in_stage += num_slabs;
      }
    }
    release_extra_stage<Config>(smem, ring);
    // The stages left may hold only the other warpgroup's pieces; each is released by both.
    pass_extra_stages<Config>(num_stages - held - 1, smem, ring);
  }

  // Consumers: waits for and releases `count` extra stages without reading them (they hold the other
  // slab's pieces).
  template <class Config>
  __device__ void pass_extra_stages(int count, StorageOf<Config>& smem, StageCursor& ring) {
    for (int i = 0; i < count; ++i) {
      ptx::mbarrier_wait(&smem.ring.full[ring.stage], ring.phase);
      release_extra_stage<Config>(smem, ring);
    }
  }

 private:
  // Producer thread: the TMA loads of an own tile's partials (kSlabs reduced slabs), in the order
  // of partial_piece(); after a failed call only empty stages, so that the consumers finish.
  template <class Config, int kSlabs>
  __device__ static void stream_partials(const PushReduceParams& p, const Tile& tile, uint32_t reduced,
                                         uint32_t epoch, bool arrived, StorageOf<Config>& smem, StageCursor& ring) {
    const int num_pieces = Layout<Config>::streamed_pieces(p, reduced);
    const int rounds_held = kSlabs * Layout<Config>::round_pieces(p, reduced);  // the pieces before these
    for (int first = 0; first < num_pieces; first += Config::kPiecesPerStage) {
      const int stage = ring.stage;
      ptx::mbarrier_wait(&smem.ring.empty[stage], ring.phase ^ 1);
      uint64_t* full = &smem.ring.full[stage];
      const int count = min(Config::kPiecesPerStage, num_pieces - first);
      if (!arrived) {
        ptx::mbarrier_arrive(full);  // the call has failed: only let the consumers finish
      } else {
        ptx::mbarrier_arrive_expect_tx(full, count * Layout<Config>::piece_bytes(p));
        for (int q = 0; q < count; ++q) {
          Layout<Config>::load_piece(
              p, Layout<Config>::template partial_piece<kSlabs>(p, tile, reduced, rounds_held + first + q),
              stage_piece<Config>(smem, stage, q), full, epoch);
        }
      }
      ring.advance<Config>();
    }
  }

  // Adds the current round (the next peer's partial of the slab) from the chunk buffers, and asks
  // for the next one.
  template <class Config>
  __device__ void add_round(float (&acc)[Config::kAccPerThread], StorageOf<Config>& smem) {
    // The accumulators leave the WGMMAs first; the other consumer's keep the tensor cores busy.
    cute::warpgroup_wait<0>();
#pragma unroll
    for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(acc[i]);
    ptx::mbarrier_wait(&smem.op.round_full[consumer_], rounds_.added++ & 1);
    ++rounds_.next;
#pragma unroll
    for (int c = 0; c < Config::kChunksPerSlab; ++c) add_chunk_bf16(chunks_[c], acc + 32 * c);
#pragma unroll
    for (int i = 0; i < Config::kAccPerThread; ++i) cute::warpgroup_fence_operand(acc[i]);
    // Every thread has read the buffers (generic proxy) before the next round's TMA loads or the
    // slab's staging write them.
    ptx::fence_proxy_async_shared();
    slabs_.sync();
    if (rounds_.next < rounds_.tile_rounds && slabs_.leader()) ptx::mbarrier_arrive(&smem.op.round_empty[consumer_]);
  }

  // Every thread of the warpgroup has read the stage (generic proxy) before the producer's next TMA
  // load (async proxy) may overwrite it.
  template <class Config>
  __device__ void release_extra_stage(StorageOf<Config>& smem, StageCursor& ring) {
    ptx::fence_proxy_async_shared();
    slabs_.sync();
    release_stage<Config>(smem, ring.stage);
    ring.advance<Config>();
  }

  const PushReduceParams& p_;
  int consumer_;
  const SlabStore& slabs_;
  ChunkBuffer* chunks_;
  RoundProgress& rounds_;
};

}  // namespace tpfuse::kernels
