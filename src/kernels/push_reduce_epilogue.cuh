// The fused op's epilogue: a finished slab of another rank's rows is pushed (BF16, TMA store) into
// that owner's receive slot and signalled with an epoch flag; a slab of this rank's own rows takes
// the P-1 peers' partials into its FP32 accumulators and is rounded once. The partials of an own
// slab come two ways, each half of its chunks:
//  - the first chunks are summed in the mainloop's shadow: while the tile is being multiplied, the
//    consumer loads them from the receive buffer a few rows per K block, adds them up in FP32 (rank
//    order) and keeps the sums in its chunk buffers, idle until the slab is staged (PresumShape);
//  - the other chunks the producer streams through the mainloop's ring right after the tile's K
//    stages, and the consumer adds them in rank order.
// Each way alone leaves the consumers waiting: the ring's loads and adds after the multiply took
// about as long as the tile's K stages' last third, and there is shared memory for the sums of half
// the slab only. A tile's slabs have one owner, or in a band of two segments (plan/schedule.h) one
// each: then an own band's tile has one slab to reduce and one to push, and the push goes first.
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
// consumers only, never for a peer, so a flag goes up as soon as its slab has landed, whatever the
// consumers wait for next.
//
// NOTE (memory ordering, per pushed tile): the sender waits for its bulk group to COMPLETE
// (cp.async.bulk.wait_group, not the .read variant), fences the async proxy, then stores each flag
// with release semantics at system scope. The owner's watcher thread polls the flags with relaxed
// system-scope loads, then fences (acquire at system scope) and arrives on an mbarrier; the producer
// waits on it (acquire at CTA scope, so the peers' writes happen before what follows) and fences
// generic -> async proxy before its TMA loads of the data.
#pragma once

#include "kernels/peer_error.h"
#include "kernels/tile_store.cuh"
#include "plan/epoch.h"
#include "tpfuse/problem.h"

namespace tpfuse::kernels {

// How an own slab's first chunks are pre-summed: each pass, every thread of the warpgroup loads 16
// bytes (8 columns of one row) of each peer's partial, so a pass covers kRowsPerPass rows of the
// chunks; the FP32 sums take the slab's chunk buffers (half their chunks' worth of BF16 each), rows
// of kCols floats whose 16-byte pieces are permuted by (piece ^ row % 8), which keeps the reads in
// accumulator layout free of bank conflicts.
template <class Config>
struct PresumShape {
  static constexpr int kChunks = Config::kChunksPerSlab / 2;
  static constexpr int kStreamedChunks = Config::kChunksPerSlab - kChunks;  // through the ring
  static constexpr int kCols = kChunks * kChunkCols;
  static constexpr int kLanesPerRow = kCols / 8;
  static constexpr int kRowsPerPass = 128 / kLanesPerRow;
  static constexpr int kPasses = kChunkRows / kRowsPerPass;
  static_assert(kChunks >= 1 && kChunkRows % kRowsPerPass == 0, "whole passes over whole chunks");
  static_assert(kCols * kChunkRows * 4 <= Config::kChunksPerSlab * kChunkElems * 2, "the sums fit in the buffers");

  // Where the sum of (row, col) lies, col a multiple of 2 (two floats) or 4 (four).
  __device__ static int index(int row, int col) { return row * kCols + (((col / 4) ^ (row % 8)) * 4) + col % 4; }
};

// Flag values compare modulo 2^32, so the epoch may wrap.
__device__ __forceinline__ bool epoch_reached(uint32_t flag, uint32_t epoch) { return int32_t(flag - epoch) >= 0; }

class PushReduceEpilogue {
 public:
  struct Params {
    int rank;
    int world_size;
    int rows_per_rank;
    int n;
    int col_tiles;
    int block_m;
    int block_n;
    int tiles_per_band;
    CUtensorMap recv_at[kMaxWorldSize];  // each owner's receive buffer, 4D: (column, row, source, parity)
    const __nv_bfloat16* recv;       // this rank's receive buffer (the pre-summed chunks' loads)
    size_t recv_parity_elems;        // distance between its two parity halves
    CUtensorMap out;                 // rows_per_rank x n, this rank's output
    uint32_t* flags_at[kMaxWorldSize];   // each owner's flag array (flags_at[rank] is this rank's own)
    size_t flags_parity_words;       // distance between the two parity halves of a flag array
    const uint64_t* calls;           // calls completed on this rank, in the high word; this call's epoch is one more
    uint32_t* failed;                // set by the first wait of this rank that times out
    PeerError* error;                // host-mapped
    uint64_t timeout_ns;
  };

  static constexpr bool kHasSender = true;
  static constexpr bool kHasWatcher = true;

  __device__ PushReduceEpilogue(const Params& params, int consumer, ChunkBuffers buffers)
      : p_(params), consumer_(consumer), slabs_(consumer, buffers), handoff_(buffers.handoff),
        parity_(call_epoch(params) & 1) {}

  // The sender thread: stores the slabs the consumers stage, step by step, each into its owner's
  // receive slot (or this rank's output), and raises the flags of the pushed ones once landed.
  template <class Config>
  __device__ static void send(const Params& p, const TileSchedule& schedule, SharedStorage<Config>& smem, int cta,
                              int num_ctas) {
    static_assert(Config::kCluster == 1, "every step of a CTA stages its slabs (no duplicate steps of a pair)");
    constexpr uint32_t kAllSlabs = (1u << Config::kConsumers) - 1;
    const uint32_t epoch = call_epoch(p);
    const int num_tiles = schedule.num_tiles();
    for (int wave = 0, step = cta, s = 0; has_work<Config>(step, num_tiles);
         step = step_of<Config>(cta, num_ctas, ++wave), ++s) {
      // The pushed slabs first: an own slab waits for its peers' partials, and in a band of two
      // segments the partner's partial of it waits for this rank's push of the partner's slab.
      // Without bands a step's slabs are all pushed or all own: one batch, and no schedule to walk
      // (walking it cost the fused call 0.5%).
      const uint32_t own = schedule.segments_per_tile == 1 ? 0 : own_slabs<Config>(p, schedule.tile(step));
      uint32_t slabs = kAllSlabs & ~own;
      // One call site: the stores are compiled once.
#pragma unroll 1
      for (int batch = 0; batch < 2; ++batch, slabs = own) send_slabs(p, smem, slabs, s, epoch);
    }
  }

  // The watcher thread: for each own tile of this CTA, in order, waits (bounded) for the peers'
  // flags of the tile and fences, then tells the producer, and the consumers through the count of
  // own tiles seen; at most one own tile ahead of the producer. After a timeout it tells them too.
  template <class Config>
  __device__ static void watch(const Params& p, const TileSchedule& schedule, SharedStorage<Config>& smem, int cta,
                               int num_ctas) {
    const uint32_t epoch = call_epoch(p);
    uint32_t own_tiles = 0;
    for_each_work<Config>(schedule, cta, num_ctas, [&](const Work& work) {
      if (reduced_slabs<Config>(p, work.tile) == 0) return;
      if (own_tiles > 0) ptx::mbarrier_wait(&smem.extra_taken, (own_tiles - 1) & 1);
      // A timeout is recorded in p.failed, which the producer reads.
      if (wait_for_partials<Config>(p, work.tile, epoch)) ptx::fence_acquire_sys();  // flags seen -> partials
      ptx::mbarrier_arrive(&smem.extra_ready);
      ++own_tiles;
      ptx::store_release_cta(&smem.partials_seen, own_tiles);  // the consumers' pre-sums
    });
  }

  // Producer thread, after an own tile's K stages: once the watcher has seen the peers' flags of the
  // tile, loads their partials into extra stages of the ring, in the order of partial_piece().
  template <class Config>
  __device__ static void produce_extra_stages(const Params& p, const Tile& tile, SharedStorage<Config>& smem,
                                              StageCursor& ring, uint32_t& own_phase) {
    const uint32_t reduced = reduced_slabs<Config>(p, tile);
    if (reduced == 0) return;
    const uint32_t epoch = call_epoch(p);  // a load from global memory: before the wait, not after
    ptx::mbarrier_wait(&smem.extra_ready, own_phase);  // the watcher's acquire, passed on at CTA scope
    ptx::mbarrier_arrive(&smem.extra_taken);
    own_phase ^= 1;
    const bool arrived = *reinterpret_cast<volatile uint32_t*>(p.failed) == 0;
    if (arrived) ptx::fence_proxy_async_global();  // the partials, for the TMA loads (async proxy)
    // The reduced slabs' count as a constant: the piece order's arithmetic, on this one thread per
    // 8 KB piece, then folds into shifts. At run time it took about 80 instructions a piece instead
    // of 15, and the proxy measured 1.249 against 1.215 (bench/results/2026-11-29-h200-a88161a/bisect/).
    if (__popc(reduced) == Config::kConsumers) {
      stream_partials<Config, Config::kConsumers>(p, tile, reduced, epoch, arrived, smem, ring);
    } else {
      stream_partials<Config, 1>(p, tile, reduced, epoch, arrived, smem, ring);
    }
  }

  // Producer thread: the TMA loads of an own tile's partials (kSlabs reduced slabs), in the order
  // of partial_piece(); after a failed call only empty stages, so that the consumers finish.
  template <class Config, int kSlabs>
  __device__ static void stream_partials(const Params& p, const Tile& tile, uint32_t reduced, uint32_t epoch,
                                         bool arrived, SharedStorage<Config>& smem, StageCursor& ring) {
    const int num_pieces = partial_pieces<Config>(p, reduced);
    for (int first = 0; first < num_pieces; first += Config::kPiecesPerStage) {
      const int stage = ring.stage;
      ptx::mbarrier_wait(&smem.empty[stage], ring.phase ^ 1);
      uint64_t* full = &smem.full[stage];
      const int count = min(Config::kPiecesPerStage, num_pieces - first);
      if (!arrived) {
        ptx::mbarrier_arrive(full);  // the call has failed: only let the consumers finish
      } else {
        ptx::mbarrier_arrive_expect_tx(full, count * Config::kPieceBytes);
        for (int q = 0; q < count; ++q) {
          const PartialPiece piece = partial_piece<Config, kSlabs>(p, tile, reduced, first + q);
          ptx::tma_load_4d(stage_piece(smem, stage, q), &p.recv_at[p.rank], full, piece.col, piece.row, piece.source,
                           epoch & 1);
        }
      }
      ring.advance<Config>();
    }
  }

  // Consumers, before a tile's K stages: an own slab's pre-summed chunks start (begin_tile), and go
  // on a pass per K block (during_k_block) once the watcher has seen the tile's partials and the
  // sender has read the previous slab out of the chunk buffers.
  template <class Config>
  __device__ void begin_tile(const Work& work, Slab<Config> slab, SharedStorage<Config>&) {
    using Shape = PresumShape<Config>;
    const uint32_t reduced = reduced_slabs<Config>(p_, work.tile);
    presum_.active = (reduced >> consumer_) & 1;
    presum_.own_tile = own_tiles_;
    own_tiles_ += reduced != 0;
    if (!presum_.active) return;
    const Tile& tile = work.tile;
    const int t = threadIdx.x % 128;
    const int segment_row = tile.segment_row_of(slab.row);
    const int col = tile.col_begin + slab.col + 8 * (t % Shape::kLanesPerRow);
    presum_.lane_row = t / Shape::kLanesPerRow;
    // Rows past the segment and columns past n are not loaded (their sums are zero, never stored).
    presum_.rows = col < p_.n ? p_.rows_per_rank - segment_row : 0;
    presum_.first = p_.recv + parity_ * p_.recv_parity_elems + size_t(segment_row) * p_.n + col;
    presum_.next = 0;
    presum_.k_blocks = 0;
    presum_.loaded = false;
    presum_.ready = false;
  }

  // Consumers, after issuing a K block's WGMMAs: adds the pass loaded at the previous K block and
  // loads the next, so that its loads are in flight while the tensor cores work.
  template <class Config>
  __device__ void during_k_block(SharedStorage<Config>& smem) {
    // Every other K block: a pass's loads get two K blocks' time to land.
    if (!presum_.active || (presum_.k_blocks++ & 1)) return;
    if (presum_.loaded) presum_accumulate<Config>(smem);
    if (presum_.next < PresumShape<Config>::kPasses && (presum_.ready || (presum_.ready = presum_may_start(smem)))) {
      presum_load<Config>();
    }
  }

  // Consumers, after a tile's K stages: a slab of this rank's rows takes its pre-summed partials
  // and its peers' partials from the tile's extra stages, then is stored; a pushed slab is staged for the sender first, and only
  // then passes the extra stages the tile may have for the other slab (its owner may be waiting for
  // this slab to reduce that same tile, in a band of two segments).
  template <class Config>
  __device__ void end_tile(const Work& work, Slab<Config> slab, float (&acc)[Config::kAccPerThread],
                           SharedStorage<Config>& smem, StageCursor& ring) {
    const uint32_t reduced = reduced_slabs<Config>(p_, work.tile);
    const bool reduces = (reduced >> consumer_) & 1;
    if (reduces) {
      finish_presum<Config>(smem);
      add_presums<Config>(acc, smem);
      add_partials<Config>(reduced, acc, smem, ring);
      slabs_.sync();  // every thread has read the sums before the slab is staged over them
    }
    store<Config>(work.tile, slab, acc);  // one call: the store's code is large
    if (reduced != 0 && !reduces) pass_extra_stages<Config>(extra_stages<Config>(p_, reduced), smem, ring);
  }

  // The sender raises the last flags; nothing is left to the consumers.
  __device__ void finish() {}

 private:
  // Where one piece of an own slab's partials comes from: a 64 x 64 chunk of a source's slab.
  struct PartialPiece {
    int source;
    int row;  // in the owner's segment
    int col;
  };

  // This call's epoch: one more than the calls this rank has completed.
  __device__ static uint32_t call_epoch(const Params& p) {
    return epoch_of(*reinterpret_cast<const volatile uint64_t*>(p.calls));
  }

  // The slabs of a tile that hold this rank's rows (a bit per consumer): stored here, not pushed.
  template <class Config>
  __device__ static uint32_t own_slabs(const Params& p, const Tile& tile) {
    uint32_t slabs = 0;
    for (int c = 0; c < Config::kConsumers; ++c) {
      if (tile.owner_of(Slab<Config>::of_consumer(c).row) == p.rank) slabs |= 1u << c;
    }
    return slabs;
  }

  // The own slabs that take the peers' partials through extra stages: none without peers.
  template <class Config>
  __device__ static uint32_t reduced_slabs(const Params& p, const Tile& tile) {
    return p.world_size > 1 ? own_slabs<Config>(p, tile) : 0;
  }

  // Pieces of partials a tile takes through the ring: every streamed chunk of each reduced slab from
  // each peer (a chunk past the segment or past n is zero-filled by the TMA and never stored).
  template <class Config>
  __device__ static int partial_pieces(const Params& p, uint32_t reduced) {
    return (p.world_size - 1) * __popc(reduced) * PresumShape<Config>::kStreamedChunks;
  }

  template <class Config>
  __device__ static int extra_stages(const Params& p, uint32_t reduced) {
    return (partial_pieces<Config>(p, reduced) + Config::kPiecesPerStage - 1) / Config::kPiecesPerStage;
  }

  // Piece i = (j * streamed chunks + chunk) * S + place, S the reduced slabs: peer j (in rank order,
  // skipping this rank) first, then the streamed chunk, then the slab, so with two reduced slabs a
  // warpgroup takes every other piece.
  template <class Config, int kSlabs>
  __device__ static PartialPiece partial_piece(const Params& p, const Tile& tile, uint32_t reduced, int i) {
    using Shape = PresumShape<Config>;
    const int consumer = kSlabs == Config::kConsumers ? i % kSlabs : __ffs(reduced) - 1;
    const Slab<Config> slab = Slab<Config>::of_consumer(consumer);
    const int chunk = Shape::kChunks + (i / kSlabs) % Shape::kStreamedChunks;
    const int j = i / (kSlabs * Shape::kStreamedChunks);
    return {j < p.rank ? j : j + 1, tile.segment_row_of(slab.row), tile.col_begin + slab.col + chunk * kChunkCols};
  }

  // Adds this warpgroup's pieces of the tile's streamed chunks as the producer streams them in, releasing
  // each extra stage once read. The pieces come source by source, so every element gets its
  // partials in rank order.
  template <class Config>
  __device__ void add_partials(uint32_t reduced, float (&acc)[Config::kAccPerThread], SharedStorage<Config>& smem,
                               StageCursor& ring) {
    static_assert(Config::kConsumers <= Config::kPiecesPerStage, "a stage holds a piece of every reduced slab");
    const int num_slabs = __popc(reduced);
    const int num_stages = extra_stages<Config>(p_, reduced);
    int held = 0;  // the extra stage this warpgroup has waited for and not yet released
    // This warpgroup's next piece, counted in the held stage: every num_slabs-th from its place.
    int in_stage = __popc(reduced & ((1u << consumer_) - 1));
    ptx::mbarrier_wait(&smem.full[ring.stage], ring.phase);
    const int num_sources = p_.world_size - 1;
    for (int j = 0; j < num_sources; ++j) {
#pragma unroll
      for (int c = PresumShape<Config>::kChunks; c < Config::kChunksPerSlab; ++c) {
        if (in_stage >= Config::kPiecesPerStage) {
          release_extra_stage(smem, ring);
          ++held;
          in_stage -= Config::kPiecesPerStage;
          ptx::mbarrier_wait(&smem.full[ring.stage], ring.phase);
        }
        add_chunk_bf16(stage_piece(smem, ring.stage, in_stage), acc + c * 32);
        in_stage += num_slabs;
      }
    }
    release_extra_stage(smem, ring);
    // The stages left may hold only the other warpgroup's pieces; each is released by both.
    pass_extra_stages<Config>(num_stages - held - 1, smem, ring);
  }

  // The pre-sum may start once the watcher has seen the tile's partials and the sender has read the
  // previous slab out of the chunk buffers.
  template <class Config>
  __device__ bool presum_may_start(SharedStorage<Config>& smem) const {
    return ptx::load_acquire_cta(&smem.partials_seen) > uint32_t(presum_.own_tile) &&
           (slabs_staged_ == 0 || ptx::mbarrier_test(&handoff_->sent, (slabs_staged_ - 1) & 1));
  }

  // Loads this thread's 16 bytes of the next pass from every peer, in rank order.
  template <class Config>
  __device__ void presum_load() {
    const int row = presum_.next * PresumShape<Config>::kRowsPerPass + presum_.lane_row;
    const bool valid = row < presum_.rows;
    const __nv_bfloat16* at = presum_.first + size_t(row) * p_.n;
    const size_t source_stride = size_t(p_.rows_per_rank) * p_.n;
#pragma unroll
    for (int j = 0; j < kMaxWorldSize - 1; ++j) {
      const int source = j < p_.rank ? j : j + 1;
      if (valid && j < p_.world_size - 1) presum_data_[j] = ptx::load_l2_v4(at + source * source_stride);
    }
    ++presum_.next;
    presum_.loaded = true;
  }

  // Sums the loaded pass in FP32, in rank order, into the chunk buffers.
  template <class Config>
  __device__ void presum_accumulate(SharedStorage<Config>& smem) {
    using Shape = PresumShape<Config>;
    const int row = (presum_.next - 1) * Shape::kRowsPerPass + presum_.lane_row;
    float sum[8] = {};
    if (row < presum_.rows) {
#pragma unroll
      for (int j = 0; j < kMaxWorldSize - 1; ++j) {
        if (j >= p_.world_size - 1) break;
        const uint32_t words[4] = {presum_data_[j].x, presum_data_[j].y, presum_data_[j].z, presum_data_[j].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          sum[2 * i] += __uint_as_float(words[i] << 16);
          sum[2 * i + 1] += __uint_as_float(words[i] & 0xffff0000u);
        }
      }
    }
    float* sums = presum_sums(smem);
    const int col = 8 * (threadIdx.x % 128 % Shape::kLanesPerRow);
    *reinterpret_cast<float4*>(sums + Shape::index(row, col)) = make_float4(sum[0], sum[1], sum[2], sum[3]);
    *reinterpret_cast<float4*>(sums + Shape::index(row, col + 4)) = make_float4(sum[4], sum[5], sum[6], sum[7]);
    presum_.loaded = false;
  }

  // The passes left after the K stages (all of them if the partials came late), then every
  // thread's sums are in the buffers.
  template <class Config>
  __device__ void finish_presum(SharedStorage<Config>& smem) {
    if (presum_.loaded) presum_accumulate<Config>(smem);
    if (presum_.next < PresumShape<Config>::kPasses) {
      // Bounded: the watcher tells after a timeout too, and the sender never waits for a peer.
      while (!presum_may_start(smem)) {
      }
      while (presum_.next < PresumShape<Config>::kPasses) {
        presum_load<Config>();
        presum_accumulate<Config>(smem);
      }
    }
    slabs_.sync();
  }

  // Adds the pre-summed chunks' sums to the accumulators (layout in tile_store.cuh).
  template <class Config>
  __device__ void add_presums(float (&acc)[Config::kAccPerThread], SharedStorage<Config>& smem) {
    using Shape = PresumShape<Config>;
    const float* sums = presum_sums(smem);
    const int lane = threadIdx.x % 32;
    const int warp = (threadIdx.x / 32) % 4;
#pragma unroll
    for (int i = 0; i < Shape::kChunks * 32; i += 2) {
      const int row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);
      const int col = 8 * (i / 4) + 2 * (lane % 4);
      const float2 sum = *reinterpret_cast<const float2*>(sums + Shape::index(row, col));
      acc[i] += sum.x;
      acc[i + 1] += sum.y;
    }
  }

  template <class Config>
  __device__ float* presum_sums(SharedStorage<Config>& smem) const {
    return reinterpret_cast<float*>(smem.chunks[consumer_]);
  }

  // Stages the slab and hands it to the sender: a pushed slab's flag, an own slab none.
  template <class Config>
  __device__ void store(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread]) {
    const int owner = tile.owner_of(slab.row);
    const int segment_row = tile.segment_row_of(slab.row);
    const int col_begin = tile.col_begin + slab.col;
    // A slab past the band's rows or the last column holds nothing: neither pushed nor awaited.
    const bool empty = tile.row_begin + slab.row >= tile.row_end || col_begin >= tile.col_end;
    const int num_chunks = empty ? 0 : chunks_before<Config>(col_begin, tile.col_end);
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

  // Sender thread: stores the given slabs of a step (a bit per consumer) as one bulk group, hands
  // their chunk buffers back once read, and raises the flags of the pushed ones once landed.
  template <class Config>
  __device__ static void send_slabs(const Params& p, SharedStorage<Config>& smem, uint32_t slabs, int step,
                                    uint32_t epoch) {
    if (slabs == 0) return;
    uint32_t* flags[Config::kConsumers] = {};
    bool any_flag = false;
    for (int c = 0; c < Config::kConsumers; ++c) {
      if (!(slabs & (1u << c))) continue;
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
    for (int c = 0; c < Config::kConsumers; ++c) {
      if (slabs & (1u << c)) ptx::mbarrier_arrive(&smem.handoff[c].sent);
    }
    if (!any_flag) return;
    ptx::bulk_wait_group<0>();
    ptx::fence_proxy_async_global();
    for (int c = 0; c < Config::kConsumers; ++c) {
      if (flags[c] != nullptr) ptx::store_release_sys(flags[c], epoch);
    }
  }

  // Watcher thread: waits, boundedly, for every flag of the tile's reduced slabs (each peer, each slab).
  // The flags are polled with relaxed loads, several in flight at once; the caller fences after.
  template <class Config>
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

  // Every thread of the warpgroup has read the stage (generic proxy) before the producer's next TMA
  // load (async proxy) may overwrite it.
  template <class Config>
  __device__ void release_extra_stage(SharedStorage<Config>& smem, StageCursor& ring) {
    ptx::fence_proxy_async_shared();
    slabs_.sync();
    release_stage(smem, ring.stage);
    ring.advance<Config>();
  }

  // Consumers: waits for and releases `count` extra stages without reading them (they hold the other
  // slab's pieces).
  template <class Config>
  __device__ void pass_extra_stages(int count, SharedStorage<Config>& smem, StageCursor& ring) {
    for (int i = 0; i < count; ++i) {
      ptx::mbarrier_wait(&smem.full[ring.stage], ring.phase);
      release_extra_stage(smem, ring);
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

  // This warpgroup's pre-sum of its current own slab (see begin_tile).
  struct Presum {
    bool active = false;  // the tile has an own slab of this warpgroup
    bool ready = false;   // its partials have arrived and the chunk buffers are free
    bool loaded = false;  // presum_data_ holds pass next - 1
    int next = 0;         // the next pass to load
    int k_blocks = 0;     // K blocks of the tile so far
    int own_tile = 0;     // the tile's place among this CTA's own tiles (the watcher's count)
    int lane_row = 0;     // this thread's row in a pass
    int rows = 0;         // rows of the segment from the slab's first on (0: columns past n)
    const __nv_bfloat16* first = nullptr;  // source 0's partial at this thread's column, row 0 of the slab
  };

  const Params& p_;
  int consumer_;
  SlabStore slabs_;
  SlabHandoff* handoff_;
  int parity_;
  int slabs_staged_ = 0;
  int own_tiles_ = 0;  // tiles with own slabs begun so far (either warpgroup's)
  Presum presum_;
  uint4 presum_data_[kMaxWorldSize - 1];
};

}  // namespace tpfuse::kernels
