// The reduce-scatter's protocol as every role of its epilogues sees it (the staged epilogue's
// consumers, sender, watcher and reducer, ops/gemm_rs/epilogue.cuh, and the register epilogue,
// ops/gemm_rs/shared_tiles.cuh): the parameters, where a slab lands and which flag says it has,
// whose rows a tile's slabs hold, and the pieces an own slab's partials are loaded in. Receive
// buffer of each rank (symmetric, on its own GPU), double-buffered by call parity; each parity half
// has a fixed base (sized for the largest problem), the rest is laid out for this call:
//   recv[parity][source rank][rows_per_rank][n]          BF16
//   flags[parity][source rank][tile in band][slab]       u32 epoch values
// A rank's calls alternate parity, so the pushes of call e+1 never land on the data of call e. A
// peer can only reach call e+2 (same parity as e) after this rank has started call e+1, i.e. after
// it has finished consuming call e: its own rows in e+1 need this rank's pushes of e+1.
#pragma once

#include "comm/peer_error.h"
#include "gemm/mainloop.cuh"
#include "ops/gemm_rs/push_timeline.h"
#include "ops/sequence_rows.h"
#include "tpfuse/problem.h"

namespace tpfuse::kernels {

struct PushReduceParams {
  int rank;
  int world_size;
  int rows_per_rank;
  int n;
  int col_tiles;
  int tiles_per_band;
  CUtensorMap recv_at[kMaxWorldSize];  // each owner's receive buffer, 4D: (column, row, source, parity)
  CUtensorMap out;                 // rows_per_rank x n, this rank's output
  const uint16_t* bias;            // n entries (BF16) added to this rank's rows before their rounding; null: none
  SequenceRows sequences;          // where a segment's rows lie in A (ops/sequence_rows.h)
  int box_rows;                    // rows of those maps' boxes: a chunk's 64, or a segment's with shared tiles
  uint16_t* recv[kMaxWorldSize];   // the receive buffers as addressed from this GPU (shared_tiles.cuh)
  size_t recv_parity_elems;        // distance between their two parity halves
  uint16_t* out_rows;              // the output (shared_tiles.cuh)
  uint32_t* flags_at[kMaxWorldSize];   // each owner's flag array (flags_at[rank] is this rank's own)
  size_t flags_parity_words;       // distance between the two parity halves of a flag array
  const uint64_t* calls;           // calls completed on this rank, in the high word; this call's epoch is one more
  uint32_t* failed;                // set by the first wait of this rank that times out
  PeerError* error;                // host-mapped
  uint64_t timeout_ns;
  int partial_rounds;              // rounds of an own slab's partials added during its K loop
  int num_k_blocks;                // a tile's K blocks (the mainloop's)
  float* split_partials;           // split K (shared tiles only): this rank's FP32 partials (gemm/split_k.h)
  uint32_t* splits_done;           // and their counters, 0 between calls
  PushTimeline* timeline;          // the benchmark's record of the pushes; null: none
};

// Index of (source, tile, slab) in an owner's flag array: the same in every owner's.
template <class Config>
__device__ __forceinline__ int flag_index(const PushReduceParams& p, int source, const Tile& tile, int slab) {
  const int row_tile = tile.segment_row / Config::kBlockM;  // constants: no division on the hot paths
  const int col_tile = tile.col_begin / Config::kBlockN;
  const int tile_idx = row_tile * p.col_tiles + col_tile;
  return (source * p.tiles_per_band + tile_idx) * 2 + slab;
}

// Distance in an owner's flag array between two sources' flags of the same (tile, slab).
__device__ __forceinline__ size_t flag_source_stride(const PushReduceParams& p) { return size_t(p.tiles_per_band) * 2; }

// Flag `index` of an owner's flag array, in the given parity half.
__device__ __forceinline__ uint32_t* flag_at(const PushReduceParams& p, int owner, int index, int parity) {
  return p.flags_at[owner] + parity * p.flags_parity_words + index;
}

// Raises a flag for this call: its epoch, stored relaxed at system scope.
// NOTE: after the raiser's release fence at system scope, which orders the data the flag signals
// before it; a rank that sees the epoch fences (acquire at system scope) before it reads that data.
__device__ __forceinline__ void raise_flag(uint32_t* flag, uint32_t epoch) { ptx::store_relaxed_sys(flag, epoch); }

// The owners of a slab's rows, first .. last; with shared tiles a slab past the tile's rows has the
// owner of the tile's last row (and no rows: neither pushed nor awaited).
struct SlabOwners {
  int first;
  int last;
};

// Where one piece of an own slab's partials comes from: a 64 x 64 chunk of a source's slab.
struct PartialPiece {
  int source;
  int row;  // in this rank's segment: negative where it starts inside the slab (shared tiles)
  int col;
};

// Where a box of an owner's rows sits: a slab whose first row lands at `row` of the owner's segment
// (negative: the segment starts -row rows into the slab) is the box at that row of the segment
// from chunk row 0, or at segment row 0 from chunk row -row (a TMA store may not start at a
// negative row; with shared tiles the box is the segment's rows, inside the slab).
struct BoxPlace {
  int chunk_row;
  int segment_row;
};
__device__ __forceinline__ BoxPlace place_box(int row) { return row >= 0 ? BoxPlace{0, row} : BoxPlace{-row, 0}; }

// Where a tile's slabs go and where an own slab's partials come from, for the tiles of a Config.
// kSharedTiles: the tiles of several owners' rows (one band of all segments,
// ops/gemm_rs/schedule.h); the other keeps every slab to one owner, without its arithmetic.
template <class Config, bool kSharedTiles>
struct PushReduceLayout {
  // A slab's hand-offs: its chunks staged kStagedChunks at a time (the same count for every slab,
  // empty ones too, so that the sender knows it).
  static constexpr int kHandoffsPerSlab = (Config::kChunksPerSlab + Config::kStagedChunks - 1) / Config::kStagedChunks;

  __device__ static SlabOwners slab_owners(const Tile& tile, int slab_row) {
    if constexpr (!kSharedTiles) {
      const int owner = tile.owner_of(slab_row);  // a slab never spans two owners
      return {owner, owner};
    }
    const int last_row = tile.row_end - tile.row_begin - 1;
    return {tile.owner_of_row(min(slab_row, last_row)), tile.owner_of_row(min(slab_row + kSlabRows - 1, last_row))};
  }

  // The slabs of a tile that hold this rank's rows (a bit per consumer): stored here.
  __device__ static uint32_t own_slabs(const PushReduceParams& p, const Tile& tile) {
    uint32_t slabs = 0;
    for (int c = 0; c < Config::kConsumers; ++c) {
      const SlabOwners owners = slab_owners(tile, Slab<Config>::of_consumer(c).row);
      if (owners.first <= p.rank && p.rank <= owners.last) slabs |= 1u << c;
    }
    return slabs;
  }

  // The slabs of a tile that hold other owners' rows: pushed to them.
  __device__ static uint32_t pushed_slabs(const PushReduceParams& p, const Tile& tile) {
    uint32_t slabs = 0;
    for (int c = 0; c < Config::kConsumers; ++c) {
      const SlabOwners owners = slab_owners(tile, Slab<Config>::of_consumer(c).row);
      if (owners.first != p.rank || owners.last != p.rank) slabs |= 1u << c;
    }
    return slabs;
  }

  // The own slabs that take the peers' partials through extra stages: none without peers.
  __device__ static uint32_t reduced_slabs(const PushReduceParams& p, const Tile& tile) {
    return p.world_size > 1 ? own_slabs(p, tile) : 0;
  }

  // A round is a whole slab of one peer in a consumer's chunk buffers: none where the epilogue stages
  // a slab in batches (the config gives those no rounds either).
  static constexpr bool kSlabFitsBuffers = Config::kStagedChunks == Config::kChunksPerSlab;

  // A tile takes rounds where every slab is reduced (the config gives rounds only where a tile's
  // slabs have one owner: ops/gemm_rs/config.cpp), so both consumers take the same rounds.
  __device__ static bool has_rounds(const PushReduceParams& p, uint32_t reduced) {
    return kSlabFitsBuffers && p.partial_rounds > 0 && reduced == (1u << Config::kConsumers) - 1;
  }

  // A reduced slab's pieces of partials: every chunk of it from each peer (a chunk past the segment
  // or past n is zero-filled by the TMA and never stored). The first round_pieces() come in rounds
  // during the K loop, the rest through the ring after it.
  __device__ static int round_pieces(const PushReduceParams& p, uint32_t reduced) {
    return has_rounds(p, reduced) ? p.partial_rounds * Config::kChunksPerSlab : 0;
  }

  __device__ static int streamed_pieces(const PushReduceParams& p, uint32_t reduced) {
    return __popc(reduced) * ((p.world_size - 1) * Config::kChunksPerSlab - round_pieces(p, reduced));
  }

  __device__ static int extra_stages(const PushReduceParams& p, uint32_t reduced) {
    return (streamed_pieces(p, reduced) + Config::kPiecesPerStage - 1) / Config::kPiecesPerStage;
  }

  // Piece q of consumer c's slab: q = j * chunks per slab + chunk, peer j in rank order (skipping
  // this rank) first, then the chunk.
  __device__ static PartialPiece slab_piece(const PushReduceParams& p, const Tile& tile, int consumer, int q) {
    const Slab<Config> slab = Slab<Config>::of_consumer(consumer);
    const int chunk = q % Config::kChunksPerSlab;
    const int j = q / Config::kChunksPerSlab;
    const int row = kSharedTiles ? tile.segment_row_for(slab.row, p.rank) : tile.segment_row_of(slab.row);
    return {j < p.rank ? j : j + 1, row, tile.col_begin + slab.col + chunk * kChunkCols};
  }

  // Piece i of a tile's S reduced slabs = slab piece q * S + place: with two reduced slabs a
  // warpgroup takes every other piece.
  template <int kSlabs>
  __device__ static PartialPiece partial_piece(const PushReduceParams& p, const Tile& tile, uint32_t reduced, int i) {
    const int consumer = kSlabs == Config::kConsumers ? i % kSlabs : __ffs(reduced) - 1;
    return slab_piece(p, tile, consumer, i / kSlabs);
  }

  // The bytes a piece of partials loads: a chunk, or with shared tiles a segment's rows of it.
  __device__ static uint32_t piece_bytes(const PushReduceParams& p) {
    if constexpr (kSharedTiles) return uint32_t(p.box_rows) * kChunkCols * 2;
    return 64 * kChunkCols * 2;
  }

  // Producer or watcher thread: the TMA load of one piece of partials into a chunk-sized buffer.
  __device__ static void load_piece(const PushReduceParams& p, const PartialPiece& piece, uint16_t* buffer,
                                    uint64_t* full, uint32_t epoch) {
    BoxPlace box{0, piece.row};
    if constexpr (kSharedTiles) box = place_box(piece.row);
    ptx::tma_load_4d(buffer + box.chunk_row * kChunkCols, &p.recv_at[p.rank], full, piece.col, box.segment_row,
                     piece.source, epoch & 1);
  }
};

}  // namespace tpfuse::kernels
