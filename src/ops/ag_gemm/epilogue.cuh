// The all-gather + GEMM's epilogue policy (gemm/mainloop.cuh): where a tile's A rows come from, the
// copier thread that pushes this rank's block of X to its peers, and the plain store of Y's tiles.
//
// Who sends which block when: every copier CTA's copier thread (of the producer warpgroup; every CTA,
// or where a call leaves CTAs without a tile, those) takes pieces of X_r (contiguous parts of a row
// block, ops/ag_gemm/workspace.h), a piece every `copiers`, in order,
// loads each into a ring of shared-memory stages by bulk copies and stores it from there into the
// gathered buffer of ranks r+1, r+2, ..., r+P-1 (and of this rank, when the caller wants the
// gathered X or a band of more than two blocks reads it there); then it counts the piece in at each
// of them, and the piece that completes its row block raises that row block's flag there. All CTAs
// copy at once from the start of the call, so the pieces land in the first part of the own band's
// time. Meanwhile the producer multiplies its own band from X_r itself (in a band of two 64-row
// blocks a tile's halves come from their blocks, the own one from X_r); before the first K stage of
// a tile of another band it waits (bounded) for the flags of the row blocks the tile's rows span,
// then loads them from its own gathered buffer. The consumers store Y's tiles as the plain GEMM
// does, into a map of P/G layers (bands) of G * m/P rows, so that a tile's store is clipped at its
// band's last row. With several sequences (ops/sequence_rows.h) the schedule, the copies and the
// waits are the same: only Y's store puts a band's rows at its shard of each sequence.
//
//   P = 4, rank 0:  copiers  pieces of X_0 -> ranks 1, 2, 3 (and 0)     from the start
//                   tiles    band 0 (X_0, local)  band 3 (waits on rank 3's pieces)  band 2  band 1
//
// NOTE (memory ordering, per piece): the copier waits for its bulk stores to complete (not only to
// have read shared memory), fences async -> generic proxy and at system scope (release), then counts
// in with relaxed atomics at system scope; the last piece of a row block fences again (acquire: every
// other piece's release, read through the counter) and raises the flag with a release store. The
// producer polls the flags with relaxed system-scope loads, fences (acquire at system scope), then
// fences generic -> async proxy before its TMA loads.
//
// Reuse across calls is the reduce-scatter's argument (docs/DESIGN.md, Epochs and reuse): call e
// writes parity e mod 2, and a peer reaches call e+2 only after this rank has started e+1, when its
// reads of call e are done. A row block's counter is back at 0 once its last piece has counted in.
#pragma once

#include <cstdint>

#include "comm/device.cuh"
#include "comm/peer_error.h"
#include "gemm/mainloop.cuh"
#include "gemm/slab_store.cuh"
#include "gemm/split_k_epilogue.cuh"
#include "ops/ag_gemm/shared_storage.h"
#include "ops/ag_gemm/workspace.h"
#include "ops/sequence_rows.h"
#include "tpfuse/problem.h"

namespace tpfuse::kernels {

class AllGatherEpilogue : public EpilogueBase {
 public:
  struct Params {
    int rank;
    int world_size;
    int rows_per_rank;
    int k;
    CopyPlan copy;                       // X_r's pieces (ops/ag_gemm/workspace.h)
    int sources_per_band;                // G (ops/ag_gemm/schedule.h)
    bool copy_own;                       // also copy X_r into this rank's gathered buffer
    CUtensorMap y;                       // Y: 4D (column, row in a band's shard, band, sequence), box 64 x 64
    SequenceRows sequences;              // a band's rows by sequence (ops/sequence_rows.h)
    const uint16_t* bias;                // n_per_rank entries (BF16) added before Y's rounding; null: none
    CUtensorMap own_x;                   // X_r: 4D (k, row, 1, 1), box 64 x block_m
    CUtensorMap gathered;                // this rank's gathered buffer: 4D (k, row in band, band, parity)
    // Bands of two 64-row blocks: a tile's halves from their blocks, the own one from X_r itself.
    bool halves_by_block;
    CUtensorMap own_x_half;              // X_r, box 64 x 64
    CUtensorMap gathered_half;           // 4D (k, row in block, source, parity), box 64 x 64
    const uint8_t* x;                    // X_r, rows_per_rank x k elements of the problem's dtype
    // Rowwise and blockwise E4M3: X_r's row scales (FP32, rows_per_rank x scales_per_row: one a row, or
    // one a row and 128 of K), gathered with the rows into every gathered buffer's scales,
    // [source][row][scales_per_row] FP32 from scales_offset bytes into a parity half. Null otherwise
    // (tensorwise: this rank's scale, MainloopParams' a_scale, serves every row).
    const float* x_scales;
    size_t scales_offset;
    // Every row block's scales 16-byte aligned in X_r's scales and in the gathered buffers (and a whole
    // number of 16 bytes): they go through the copier's ring as the rows do; else a float at a time.
    bool scales_by_bulk;
    uint8_t* gathered_at[kMaxWorldSize];  // each rank's gathered buffer (parity 0), as this rank addresses it
    size_t parity_elems;                 // distance between the parity halves of a gathered buffer (elements)
    uint32_t* flags_at[kMaxWorldSize];   // each rank's flags, [parity][source][row block]
    size_t flags_parity_words;
    uint32_t* counts_at[kMaxWorldSize];  // each rank's counts, [parity][source][row block]
    size_t counts_parity_words;
    const uint64_t* calls;               // calls completed on this rank, in the high word
    uint32_t* failed;                    // set by the first wait of this rank that times out
    PeerError* error;                    // host-mapped
    uint64_t timeout_ns;
    float* split_partials;               // split K: this rank's FP32 partials (gemm/split_k.h)
    uint32_t* splits_done;               // and their counters, 0 between calls
    int scales_per_row;                  // x_scales' (above)
  };

  static constexpr bool kHasCopier = true;
  static constexpr bool kLayeredA = true;
  static constexpr bool kAFromPeers = true;

  template <class Storage>
  __device__ AllGatherEpilogue(const Params& params, int consumer, Storage& smem)
      : p_(params), consumer_(consumer), slabs_(consumer, smem.chunks[consumer]) {
    if (p_.x_scales != nullptr) {
      const size_t parity_bytes = p_.parity_elems * sizeof(typename Storage::Element);
      gathered_scales_ = reinterpret_cast<const float*>(p_.gathered_at[p_.rank] +
                                                        size_t(comm::call_epoch(p_.calls) & 1) * parity_bytes +
                                                        p_.scales_offset);
    }
  }

  // E4M3 inputs, consumers: a tile's first row as the gathered X counts its rows ([source][row]),
  // and row `row`'s scale (blockwise: where its scales start, read at each K block through L2). A peer's
  // rows' scales are read where they landed (through L2: this SM may hold an older copy of the line),
  // after the K loop, or blockwise after the wait for a stage of the rows (the producer waited for the
  // rows, and their scales, before loading them); this rank's from X_r's.
  __device__ int scale_row(const Tile& tile) const { return tile.owner_rank * p_.rows_per_rank + tile.segment_row; }
  template <class Mainloop>
  __device__ float a_scale(const Mainloop& m, int row) const {
    if (p_.x_scales == nullptr) return __ldg(m.a_scale);
    if (row >= p_.world_size * p_.rows_per_rank) return 0.0f;  // past the last source's rows: never stored
    const int source = row / p_.rows_per_rank;
    return source == p_.rank ? __ldg(p_.x_scales + (row - source * p_.rows_per_rank)) : __ldcg(gathered_scales_ + row);
  }
  // (Blockwise, where a row's scales start: nullptr past the last source's rows.)
  template <class Mainloop>
  __device__ const float* a_block_scales(const Mainloop&, int row) const {
    if (row >= p_.world_size * p_.rows_per_rank) return nullptr;
    const int source = row / p_.rows_per_rank;
    return source == p_.rank ? p_.x_scales + size_t(row - source * p_.rows_per_rank) * p_.scales_per_row
                             : gathered_scales_ + size_t(row) * p_.scales_per_row;
  }
  template <class Mainloop>
  __device__ float a_block_scale(const Mainloop&, const float* scales, int k_block) const {
    return scales == nullptr ? 0.0f : __ldcg(scales + k_block);
  }

  // Producer thread, before a tile's K stages: its own band from X_r; a peer's band once the pieces
  // its rows span have landed (after a failed call, at once: the consumers must still finish).
  template <class Config, class Mainloop>
  __device__ static ALoad a_load(const Params& p, const Mainloop&, const Tile& tile) {
    static_assert(Config::kBlockM <= 2 * kCopyRows, "a tile spans at most two row blocks of a block");
    if (p.sources_per_band == 1 && tile.owner_rank == p.rank) return {&p.own_x, tile.segment_row, 0, 0, Config::kABytes};
    const uint32_t epoch = comm::call_epoch(p.calls);
    if (wait_for_rows(p, tile, epoch)) {
      ptx::fence_acquire_sys();         // flags seen -> the pieces
      ptx::fence_proxy_async_global();  // the pieces, for the TMA loads (async proxy)
    }
    const int parity = int(epoch & 1);
    if (p.halves_by_block) {
      const auto half = [&](int source) -> ALoad {
        return source == p.rank ? ALoad{&p.own_x_half, 0, 0, 0, Config::kABytes}
                                : ALoad{&p.gathered_half, 0, source, parity, Config::kABytes};
      };
      ALoad a = half(tile.owner_rank);
      const ALoad lower = half(tile.owner_rank + 1);
      a.lower_map = lower.map;
      a.lower_layer = lower.layer;
      a.lower_parity = lower.parity;
      return a;
    }
    return {&p.gathered, tile.segment_row, tile.owner_rank / p.sources_per_band, parity, Config::kABytes};
  }

  // The copier's staging ring.
  template <class Config>
  __device__ static void init(StorageOf<Config>& smem) {
    for (int s = 0; s < kCopyStages; ++s) ptx::mbarrier_init(&smem.op.full[s], 1);
  }

  // The copier thread of CTA `cta`: pushes its pieces of X_r (p.copy says which CTAs copy) to every
  // peer (and to this rank's own gathered buffer when asked). Each stage of a piece is loaded once
  // and stored to every destination; loads run ahead of the stores. A CTA that copies beside tiles
  // has the op's small ring; one without a step (p.copy's idle copiers) has no use for the
  // mainloop's stages and makes a deeper ring there, to move its larger share sooner.
  template <class Config>
  __device__ static void copy(const Params& p, StorageOf<Config>& smem, int cta, int /*num_ctas*/) {
    const int destinations = p.copy_own ? p.world_size : p.world_size - 1;
    if (destinations == 0) return;  // one rank, no gathered X wanted: nothing to move
    if (cta < p.copy.first_copier) return;
    if (p.copy.first_copier == 0) {
      copy_pieces<typename Config::Element, kCopyStages, kCopyStageBytes, 2>(p, smem.op.buffer[0], smem.op.full, cta,
                                                                             destinations);
      return;
    }
    static_assert(sizeof(IdleCopyStages) <= sizeof(smem.a) + sizeof(smem.w), "the deep ring fits in the stages");
    IdleCopyStages& ring = *reinterpret_cast<IdleCopyStages*>(&smem.a[0][0]);
    for (int s = 0; s < kIdleCopyStages; ++s) ptx::mbarrier_init(&ring.full[s], 1);
    ptx::fence_barrier_init();
    copy_pieces<typename Config::Element, kIdleCopyStages, kIdleCopyStageBytes, kIdleCopyAhead>(
        p, ring.buffer[0], ring.full, cta, destinations);
  }

  // Consumers: the step's slice of K, for split K's workspace (nothing to add during the K loop, no
  // extra stages).
  template <class Config>
  __device__ void begin_tile(const Tile&, const KSlice& k_slice) {
    k_slice_ = k_slice;
  }

  // The slab (plus the bias) goes to Y's band, at its shard of its sequence; split, by the split that
  // counts in last, with the sum of all splits' partials (gemm/split_k_epilogue.cuh).
  template <class Config>
  __device__ void end_tile(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread],
                           StorageOf<Config>&, StageCursor&) {
    const int row = tile.segment_row + slab.row;  // in the band
    const int col = tile.col_begin + slab.col;
    // A slab past the band's last row or past n has nothing to store (in any split: its counter
    // stays 0); rows past the band inside a slab are clipped by the layered map.
    if (tile.row_begin + slab.row >= tile.row_end || col >= tile.col_end) return;
    if (k_slice_.num_splits > 1) {
      const SplitPartials split(p_.split_partials, p_.splits_done, consumer_, k_slice_);
      if (!split.sum_if_last<Config>(acc, tile.row_end - (tile.row_begin + slab.row), slabs_)) return;
    }
    if (p_.bias != nullptr) add_bias(acc, p_.bias, col, tile.col_end);
    const int sequence = p_.sequences.sequence_of(row);  // a slab lies in one sequence's shard
    const int shard_row = row - sequence * p_.sequences.shard_rows();
    slabs_.store<Config::kChunksPerSlab, Config::kStagedChunks>(
        acc, chunks_before<Config>(col, tile.col_end), [&](int c, const void* buffer) {
          ptx::tma_store_4d(&p_.y, buffer, col + c * kChunkCols, shard_row, tile.owner_rank / p_.sources_per_band,
                            sequence);
        });
  }

  __device__ void finish() { slabs_.drain(); }

 private:
  // The pieces of copier `cta` (X's elements, of the Element's size), each with its row block's scales
  // where it is the block's first, through a ring of kStages buffers of kStageBytes (contiguous, from
  // `buffers`), loads kAhead stages ahead of the stores.
  template <class Element, int kStages, int kStageBytes, int kAhead>
  __device__ static void copy_pieces(const Params& p, uint8_t* buffers, uint64_t* full, int cta, int destinations) {
    constexpr int kElementBytes = int(sizeof(Element));
    const uint32_t epoch = comm::call_epoch(p.calls);
    const size_t parity_at = size_t(epoch & 1) * p.parity_elems * kElementBytes;  // this call's parity half
    // X_r's place in every gathered buffer: this call's parity, this rank's slot.
    const size_t slot = parity_at + size_t(p.rank) * p.rows_per_rank * p.k * kElementBytes;
    const int num_pieces = p.copy.row_blocks * p.copy.pieces_per_block;
    const StagedCopy<kStages, kStageBytes, kAhead> ring{p, buffers, full, destinations};
    uint32_t uses = 0;  // stages loaded so far: the ring position and its barriers' phase
    for (int piece = cta - p.copy.first_copier; piece < num_pieces; piece += p.copy.copiers) {
      const PieceRange range = piece_range(p.copy, p.rows_per_rank, p.k, piece);
      ring.move(reinterpret_cast<const uint8_t*>(p.x) + range.begin * kElementBytes, slot + range.begin * kElementBytes,
                uint32_t(range.end - range.begin) * kElementBytes, uses);
      // A row block's scales go with its first piece, before that piece counts in.
      if (p.x_scales != nullptr && piece % p.copy.pieces_per_block == 0) {
        const size_t per_row = size_t(p.scales_per_row);
        const size_t first = size_t(range.block) * kCopyRows * per_row;
        const size_t end = size_t(min((range.block + 1) * kCopyRows, p.rows_per_rank)) * per_row;
        const size_t at = parity_at + p.scales_offset + (size_t(p.rank) * p.rows_per_rank * per_row + first) * 4;
        if (p.scales_by_bulk) {
          ring.move(reinterpret_cast<const uint8_t*>(p.x_scales + first), at, uint32_t(end - first) * 4, uses);
        } else {
          push_scales(p, p.x_scales + first, at, end - first, destinations);
        }
      }
      // The piece has landed everywhere before it counts in (an empty piece counts in at once).
      ptx::bulk_wait_group<0>();
      ptx::fence_proxy_async_global();
      ptx::fence_release_sys();
      count_in(p, range.block, epoch, destinations);
    }
  }

  // The copier's ring: moves bytes from this GPU into every destination's gathered buffer by bulk
  // copies, each stage loaded once and stored to every destination.
  template <int kStages, int kStageBytes, int kAhead>
  struct StagedCopy {
    static_assert(kAhead >= 1 && kAhead < kStages, "a stage is stored while later ones load");
    const Params& p;
    uint8_t* buffers;
    uint64_t* full;
    int destinations;

    // `bytes` from `src` to byte `at` of every destination's gathered buffer (16-byte aligned, a
    // whole number of 16 bytes); `uses` counts the ring's stages loaded so far.
    __device__ void move(const uint8_t* src, size_t at, uint32_t bytes, uint32_t& uses) const {
      // The bytes are read where they land, later (a peer's band, not this GPU's L2): they should not
      // evict this rank's operands from its L2.
      const uint64_t evict_first = ptx::l2_evict_first_policy();
      const int stages = int((bytes + kStageBytes - 1) / kStageBytes);
      for (int i = 0; i < stages + kAhead; ++i) {
        if (i < stages) {
          // Stage i's buffer was last read by the stores of stage i - kStages; of the store groups
          // committed since (up to stage i - kAhead - 1), kStages - kAhead - 1 may still be reading.
          ptx::bulk_wait_group_read<kStages - kAhead - 1>();
          const uint32_t s = (uses + i) % kStages;
          const uint32_t n = min(uint32_t(kStageBytes), bytes - uint32_t(i) * kStageBytes);
          ptx::mbarrier_arrive_expect_tx(&full[s], n);
          ptx::bulk_load(buffers + size_t(s) * kStageBytes, src + size_t(i) * kStageBytes, n, &full[s]);
        }
        const int c = i - kAhead;
        if (c < 0 || c >= stages) continue;
        const uint32_t s = (uses + c) % kStages;
        ptx::mbarrier_wait(&full[s], ((uses + c) / kStages) & 1);
        const uint32_t n = min(uint32_t(kStageBytes), bytes - uint32_t(c) * kStageBytes);
        for (int d = 1; d <= destinations; ++d) {
          ptx::bulk_store(p.gathered_at[destination(p, d)] + at + size_t(c) * kStageBytes,
                          buffers + size_t(s) * kStageBytes, n, evict_first);
        }
        ptx::bulk_commit_group();
      }
      uses += stages;
    }
  };

  // `count` scales from `scales` to byte `at` of every destination's gathered buffer, where they are
  // not aligned for the ring: a few loads in flight, then their stores.
  __device__ static void push_scales(const Params& p, const float* scales, size_t at, size_t count, int destinations) {
    constexpr int kInFlight = 8;
    for (size_t s = 0; s < count; s += kInFlight) {
      float scale[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) scale[i] = s + i < count ? __ldg(scales + s + i) : 0.0f;
      for (int d = 1; d <= destinations; ++d) {
        float* to = reinterpret_cast<float*>(p.gathered_at[destination(p, d)] + at) + s;
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) {
          if (s + i < count) to[i] = scale[i];
        }
      }
    }
  }

  // Rank r + d (mod P): a copier's d-th destination.
  __device__ static int destination(const Params& p, int d) {
    return p.rank + d < p.world_size ? p.rank + d : p.rank + d - p.world_size;
  }

  // Counts a piece of row block `block` in at each destination (the caller's release fence orders the
  // piece before); where it was the block's last, raises the block's flag there, after an acquire
  // fence (the other pieces' releases, read through the counter, before the flag's release). The
  // count-ins go out together, their results are looked at after.
  __device__ static void count_in(const Params& p, int block, uint32_t epoch, int destinations) {
    const size_t index = size_t(epoch & 1) * p.counts_parity_words + size_t(p.rank) * p.copy.row_blocks + block;
    uint32_t before[kMaxWorldSize];
#pragma unroll
    for (int d = 1; d <= kMaxWorldSize; ++d) {
      if (d <= destinations) {
        before[d - 1] = ptx::count_arrival_relaxed_sys(p.counts_at[destination(p, d)] + index, p.copy.pieces_per_block);
      }
    }
    const size_t flag = size_t(epoch & 1) * p.flags_parity_words + size_t(p.rank) * p.copy.row_blocks + block;
    bool acquired = false;
#pragma unroll
    for (int d = 1; d <= kMaxWorldSize; ++d) {
      if (d <= destinations && before[d - 1] == uint32_t(p.copy.pieces_per_block - 1)) {
        if (!acquired) ptx::fence_acquire_sys();
        acquired = true;
        ptx::store_release_sys(p.flags_at[destination(p, d)] + flag, epoch);
      }
    }
  }

  // Producer thread: waits, boundedly, for the flags of the row blocks the tile's rows span: in a band
  // of one block, one or two consecutive row blocks of it; in a band of several (64 rows or fewer
  // each: one row block), row block 0 of each block the rows reach, less this rank's where a tile's
  // halves load from their blocks. Either way an evenly spaced run of flags. Returns false if the
  // call failed (this wait timed out, or another one of this rank's).
  __device__ static bool wait_for_rows(const Params& p, const Tile& tile, uint32_t epoch) {
    const int first_row = tile.segment_row, last_row = tile.segment_row + (tile.row_end - tile.row_begin) - 1;
    int first = 0, num_flags = 0, stride = 0;  // into flags[source][row block]
    if (p.halves_by_block) {
      // Both blocks of the band, or the partner alone where one is this rank's (read from X_r).
      const bool own = tile.owner_rank == p.rank || tile.owner_rank + 1 == p.rank;
      first = (own ? (tile.owner_rank == p.rank ? p.rank + 1 : tile.owner_rank) : tile.owner_rank) * p.copy.row_blocks;
      num_flags = own ? 1 : 2;
      stride = p.copy.row_blocks;
    } else if (p.sources_per_band == 1) {
      first = tile.owner_rank * p.copy.row_blocks + first_row / kCopyRows;
      num_flags = last_row / kCopyRows - first_row / kCopyRows + 1;
      stride = 1;
    } else {
      const int first_source = first_row / p.rows_per_rank;
      first = (tile.owner_rank + first_source) * p.copy.row_blocks;
      num_flags = last_row / p.rows_per_rank - first_source + 1;
      stride = p.copy.row_blocks;
    }
    const uint32_t* flags = p.flags_at[p.rank] + size_t(epoch & 1) * p.flags_parity_words + first;
    const uint64_t deadline = comm::wait_deadline(p.timeout_ns);
    // Two in flight at a time: the producer warpgroup's registers hold no more.
    constexpr int kInFlight = 2;
    for (int batch = 0; batch < num_flags; batch += kInFlight) {
      uint32_t seen[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        if (batch + i < num_flags) seen[i] = ptx::load_relaxed_sys(flags + (batch + i) * stride);
      }
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        if (batch + i >= num_flags) continue;
        const bool arrived = comm::wait_bounded</*kEndsOnFailure=*/true, 100>(
            p, deadline, [&] { return comm::epoch_reached(seen[i], epoch); },
            [&] { seen[i] = ptx::load_relaxed_sys(flags + (batch + i) * stride); },
            [&] { return comm::Awaited{(first + (batch + i) * stride) / p.copy.row_blocks, tile.row_begin, 0}; });
        if (!arrived) return false;
      }
    }
    return true;
  }

  const Params& p_;
  int consumer_;
  SlabStore slabs_;
  KSlice k_slice_{};
  const float* gathered_scales_ = nullptr;  // this call's gathered scales in this rank's buffer (rowwise, blockwise)
};

}  // namespace tpfuse::kernels
