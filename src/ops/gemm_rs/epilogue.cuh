// The reduce-scatter's epilogue: a finished slab of another rank's rows is pushed (BF16, TMA store) into
// that owner's receive slot and signalled with an epoch flag; for a slab of this rank's own rows the
// producer streams the P-1 peers' partials through the mainloop's ring right after the tile's K
// stages, the consumer adds them to its FP32 accumulators in rank order, and the slab is rounded
// once. (Streamed through the ring, the partials are in flight as deep as the ring while the tile
// is still being multiplied; the consumers never wait on a peer themselves.) A tile's slabs have
// one owner, or in a band of two segments (schedule.h) one each: then an own band's tile has
// one slab to reduce and one to push, and the push goes first. With one band of all segments a
// slab may hold rows of several owners (whole segments: the config shares tiles only where a
// segment's rows divide a slab's): it is pushed to each of them, a TMA box of one segment's rows
// from the same chunk buffers per owner, and the rows of this rank are then reduced like an own
// slab (the peers' partials loaded into boxes at the same rows of the buffers; the other rows are
// left as they were, added, and never stored) and stored, a box of this rank's rows. Shared tiles
// may also split K (schedule.h): every split writes its FP32 partial of the slab to the workspace
// and counts it in; the tile's last split waits (bounded) until all have, adds them in split order
// (one sum, whichever CTAs ran the splits), and only its step pushes and reduces. Where the band
// of all segments is one slab of rows (M <= 64), shared tiles take an epilogue of their own
// instead, from the consumers' registers (ops/gemm_rs/shared_tiles.cuh), on the same parameters,
// buffers and flags (ops/gemm_rs/protocol.cuh).
//
// Its roles, each in a file of its own: the consumers (this class) only stage a finished slab in
// shared memory and hand it to the sender thread (sender.cuh), which pushes it and raises its
// flags; the watcher thread (watcher.cuh) waits for an own tile's flags and tells the producer;
// the reducer (reducer.cuh) streams an own tile's partials through the ring on the producer
// thread and adds them on the consumers (where the config gives rounds, most of them during the
// K loop).
//
// NOTE (memory ordering, per pushed tile): the sender waits for its bulk groups to COMPLETE
// (cp.async.bulk.wait_group, not the .read variant), fences the async proxy, then fences at system
// scope (release) and stores the flags, relaxed, at system scope: one fence for all of a step's
// flags, not one a flag (docs/EXPERIMENTS.md). The owner's watcher thread polls the flags with
// relaxed system-scope loads, then fences (acquire at system scope) and arrives on an mbarrier; the producer
// waits on it (acquire at CTA scope, so the peers' writes happen before what follows) and fences
// generic -> async proxy before its TMA loads of the data.
#pragma once

#include "comm/device.cuh"
#include "gemm/mainloop.cuh"
#include "gemm/slab_store.cuh"
#include "gemm/split_k_epilogue.cuh"
#include "ops/gemm_rs/protocol.cuh"
#include "ops/gemm_rs/reducer.cuh"
#include "ops/gemm_rs/schedule.h"
#include "ops/gemm_rs/sender.cuh"
#include "ops/gemm_rs/shared_storage.h"
#include "ops/gemm_rs/watcher.cuh"

namespace tpfuse::kernels {

// kSharedTiles: the instantiation for tiles of several owners' rows (one band of all segments,
// ops/gemm_rs/schedule.h; of 16-32 rows a segment, unless overridden); the other keeps every slab to
// one owner, without its arithmetic. kRecordsPushes: the testing library's instantiation, which
// records its pushes in the params' timeline (push_timeline.h); the library's records none.
template <bool kSharedTiles, bool kRecordsPushes>
class PushReduceEpilogue : public EpilogueBase {
  template <class Config>
  using Layout = PushReduceLayout<Config, kSharedTiles>;

 public:
  using Params = PushReduceParams;

  static constexpr bool kHasSender = true;
  static constexpr bool kHasWatcher = true;
  static constexpr bool kRecordsTimeline = kRecordsPushes;

  template <class Storage>
  __device__ PushReduceEpilogue(const Params& params, int consumer, Storage& smem)
      : p_(params), consumer_(consumer), slabs_(consumer, smem.chunks[consumer]), chunks_(smem.chunks[consumer]),
        handoff_(&smem.op.handoff[consumer]) {}

  // The op's barriers: each consumer's hand-off and rounds, the watcher's news for the producer.
  template <class Config>
  __device__ static void init(StorageOf<Config>& smem) {
    for (int c = 0; c < Config::kConsumers; ++c) {
      ptx::mbarrier_init(&smem.op.handoff[c].staged, 1);
      ptx::mbarrier_init(&smem.op.handoff[c].sent, 1);
      ptx::mbarrier_init(&smem.op.round_empty[c], 1);
      ptx::mbarrier_init(&smem.op.round_full[c], 1);
    }
    ptx::mbarrier_init(&smem.op.extra_ready, 1);
    ptx::mbarrier_init(&smem.op.extra_taken, 1);
  }

  // Producer thread, before a tile's K stages: where its rows of A are. A segment's rows are the
  // owner's shards of the sequences (ops/sequence_rows.h; one sequence: its rows as they are), and
  // a tile's lie in one shard (the config's tiles are no taller than the shards line up with). Shared
  // tiles hold several owners' rows, in one sequence.
  template <class Config, class Mainloop>
  __device__ static ALoad a_load(const Params& p, const Mainloop& mainloop, const Tile& tile) {
    ALoad a = EpilogueBase::a_load<Config>(p, mainloop, tile);
    if constexpr (!kSharedTiles) a.row = p.sequences.row_of(tile.owner_rank, tile.segment_row);
    return a;
  }

  // The sender thread (sender.cuh).
  template <class Config>
  __device__ static void send(const Params& p, const TileSchedule& schedule, StorageOf<Config>& smem, int cta,
                              int num_ctas) {
    SlabSender<kSharedTiles, kRecordsPushes>::template send<Config>(p, schedule, smem, cta, num_ctas);
  }

  // The watcher thread (watcher.cuh).
  template <class Config>
  __device__ static void watch(const Params& p, const TileSchedule& schedule, StorageOf<Config>& smem, int cta,
                               int num_ctas) {
    PartialWatcher<kSharedTiles>::template watch<Config>(p, schedule, smem, cta, num_ctas);
  }

  // The producer thread's extra stages (reducer.cuh).
  template <class Config>
  __device__ static void produce_extra_stages(const Params& p, const Tile& tile, const KSlice& k_slice,
                                              StorageOf<Config>& smem, StageCursor& ring, uint32_t& own_phase) {
    PartialReducer<kSharedTiles>::template produce_extra_stages<Config>(p, tile, k_slice, smem, ring, own_phase);
  }

  // Consumers, before a tile's K stages (all of its K blocks: this schedule does not split K): a
  // slab of this rank's rows takes rounds of its peers' partials during them.
  template <class Config>
  __device__ void begin_tile(const Tile& tile, const KSlice& k_slice) {
    if constexpr (kSharedTiles) {
      k_slice_ = k_slice;
      if (k_slice.split != k_slice.num_splits - 1) {  // a split before the last: no epilogue of its own
        pushed_ = own_ = reduced_ = 0;
        reducer().skip_tile();
        return;
      }
    }
    if constexpr (kSharedTiles) pushed_ = Layout<Config>::pushed_slabs(p_, tile);  // else every slab is pushed or own
    own_ = Layout<Config>::own_slabs(p_, tile);
    reduced_ = Layout<Config>::reduced_slabs(p_, tile);
    reducer().template begin_tile<Config>(reduced_);
  }

  // Consumers, after K block kb: the rounds of an own tile's partials (reducer.cuh).
  template <class Config>
  __device__ __forceinline__ void after_k_block(int kb, float (&acc)[Config::kAccPerThread],
                                                StorageOf<Config>& smem) {
    reducer().template after_k_block<Config>(kb, acc, smem);
  }

  // Consumers, after a tile's K stages: a slab of other owners' rows is staged for the sender
  // first; then rows of this rank take their peers' partials from the tile's extra stages and are
  // stored. A slab without rows of this rank passes the extra stages the tile may have for the other
  // slab only after its push (its owners may be waiting for it to reduce that same tile, in a band
  // of several segments).
  template <class Config>
  __device__ void end_tile(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread],
                           StorageOf<Config>& smem, StageCursor& ring) {
    if constexpr (kSharedTiles) {
      if (k_slice_.num_splits > 1 && !combine_splits<Config>(tile, slab, acc)) return;
    }
    const uint32_t bit = 1u << consumer_;  // begin_tile's masks, for the same work
    const bool reduces = (reduced_ & bit) != 0;
    const bool keeps = (own_ & bit) != 0;
    // With shared tiles a slab may hold this rank's rows and others': those are pushed first.
    if constexpr (kSharedTiles) {
      if (keeps && (pushed_ & bit)) hand_off<Config>(tile, slab, acc, /*to_output=*/false);
    }
    if (reduces) reducer().template add_partials<Config>(reduced_, acc, smem, ring);
    if (keeps && p_.bias != nullptr) add_bias(acc, p_.bias, tile.col_begin + slab.col, tile.col_end);
    hand_off<Config>(tile, slab, acc, /*to_output=*/keeps);
    if (reduced_ != 0 && !reduces) {
      reducer().template pass_extra_stages<Config>(Layout<Config>::extra_stages(p_, reduced_), smem, ring);
    }
  }

  // The sender raises the last flags; nothing is left to the consumers.
  __device__ void finish() {}

 private:
  // This warpgroup's side of the own slabs' reduction.
  __device__ PartialReducer<kSharedTiles> reducer() { return {p_, consumer_, slabs_, chunks_, rounds_}; }

  // Split K: writes the slab's FP32 partial of this split and counts it in; in the tile's last split
  // waits (bounded) until every split has, then holds p_0 + ... + p_{S-1} in acc. False in the
  // other splits: their step is done.
  template <class Config>
  __device__ bool combine_splits(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread]) {
    const bool last = k_slice_.split == k_slice_.num_splits - 1;
    const int rows = tile.row_end - tile.row_begin - slab.row;
    // A slab past the tile's rows or columns holds nothing: no partial, no count (in any split).
    if (rows <= 0 || tile.col_begin + slab.col >= tile.col_end) return last;
    const SplitPartials split(p_.split_partials, p_.splits_done, consumer_, k_slice_);
    const bool holds_rows = SplitPartials::holds_rows(rows);
    if (holds_rows) split.write<Config>(acc);
    slabs_.sync();
    if (slabs_.leader()) {
      split.count_in();
      if (last) wait_for_splits(split, tile.row_begin + slab.row, tile.col_begin + slab.col);
    }
    if (!last) return false;
    slabs_.sync();
    if (holds_rows) split.add_all<Config>(acc);
    return true;
  }

  // The leader of the last split: waits until all splits of the slab have counted in (CTAs of this
  // rank, resident at once: the splits of a tile are steps of one wave), then sets the counter back.
  // Also in a failed call: the other splits wait for no peer and count in all the same, and the
  // counters are the stream's split workspace, which later calls (the plain GEMM's too) count on.
  __device__ void wait_for_splits(const SplitPartials& split, int row, int col) const {
    const uint32_t all = uint32_t(k_slice_.num_splits);
    const bool counted = comm::wait_bounded</*kEndsOnFailure=*/false, 64>(
        p_, comm::wait_deadline(p_.timeout_ns),
        [&] { return ptx::load_relaxed_sys(split.counter_address()) == all; }, [] {},
        [&] { return comm::Awaited{p_.rank, row, col}; });
    if (counted) split.finish_count();
  }

  // Stages the slab and hands it to the sender, kStagedChunks chunks at a time: pushed to its other
  // owners, or this rank's rows into its output. The last hand-off of a push carries the slab's flag.
  template <class Config>
  __device__ void hand_off(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread], bool to_output) {
    const SlabOwners owners = to_output ? SlabOwners{p_.rank, p_.rank} : Layout<Config>::slab_owners(tile, slab.row);
    const int row = kSharedTiles ? tile.segment_row_for(slab.row, owners.first) : tile.segment_row_of(slab.row);
    const int col_begin = tile.col_begin + slab.col;
    // A slab past the band's rows or the last column holds nothing: neither pushed nor awaited.
    const bool empty = tile.row_begin + slab.row >= tile.row_end || col_begin >= tile.col_end;
    const int num_chunks = empty ? 0 : chunks_before<Config>(col_begin, tile.col_end);
    const bool flagged = !empty && !to_output;
    // Unrolled: the accumulators are indexed with constants only (or they would leave registers).
#pragma unroll
    for (int h = 0; h < Layout<Config>::kHandoffsPerSlab; ++h) {
      const int first = h * Config::kStagedChunks;
      const int count = max(0, min(num_chunks - first, Config::kStagedChunks));
      // The sender's stores of the previous hand-off must have read the chunk buffers.
      if (handoffs_ > 0) ptx::mbarrier_wait(&handoff_->sent, (handoffs_ - 1) & 1);
      slabs_.stage<Config::kStagedChunks>(acc + 32 * first, count);
      if (slabs_.leader()) {
        const bool last = h == Layout<Config>::kHandoffsPerSlab - 1;
        handoff_->to_output = to_output;
        handoff_->first_owner = owners.first;
        handoff_->last_owner = owners.last;
        handoff_->row = row;
        handoff_->col = col_begin + first * kChunkCols;
        handoff_->num_chunks = count;
        handoff_->flag = flagged && last ? flag_index<Config>(p_, p_.rank, tile, consumer_) : -1;
        ptx::mbarrier_arrive(&handoff_->staged);
      }
      ++handoffs_;
    }
  }

  const Params& p_;
  int consumer_;
  SlabStore slabs_;
  ChunkBuffer* chunks_;
  SlabHandoff* handoff_;
  int handoffs_ = 0;  // hand-offs of staged chunks to the sender so far
  uint32_t pushed_ = 0;      // the current tile's slabs with other owners' rows (shared tiles)
  uint32_t own_ = 0;         // the current tile's slabs with this rank's rows
  uint32_t reduced_ = 0;     // the current tile's slabs that take their peers' partials
  RoundProgress rounds_;     // the reducer's, kept across tiles
  KSlice k_slice_{};         // the current step's
};

}  // namespace tpfuse::kernels
