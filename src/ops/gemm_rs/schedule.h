// The reduce-scatter's per-rank tile schedule: which output tile a rank computes at each step, and
// who owns it.
//
// Pure C++ that the kernels also compile (TPFUSE_HOST_DEVICE), so the order tested on the CPU is the
// order the GPU runs.
//
// The partial product C_r (m x n) is cut into P row segments, one per owner rank; segment d holds the
// rows [d*m/P, (d+1)*m/P) that rank d keeps after the reduce-scatter. Tiles are cut from bands of
// rows, S segments each (segments_per_tile):
//   S = 1   a band is one segment;
//   S = 2   two adjacent segments (owners 2b and 2b+1) whose 64 rows each make one 128-row tile, a
//           64-row slab per owner (M=512 at P=8: one wave of full tiles instead of two of half tiles);
//   S = P   one band of all segments, where a segment is shorter than a 64-row slab (decode-sized
//           M): a tile then holds several owners' rows, and W is read once whatever P, not once a
//           segment. A slab may hold rows of several owners, and a segment may span two slabs.
// A tile never crosses a band: the last row tile of a band is clipped to it. Every band has the same
// T tiles, numbered in the raster order below.
//
// Rank r walks its tiles in rounds over the B = P / segments_per_tile bands. Round j holds tile j
// of every other band, rotated so that rank r starts with the band after its own (offset 0) and
// ends with the one before it (offset B-2), then the own band's tile j - L (offset B-1), where
// L = own_lag rounds; the own band's tiles that no round holds come last:
//
//   P = 4, rank 1, T = 4, L = 2, one segment a band (owner:tile)
//   round 0: 2:0 3:0 0:0   round 1: 2:1 3:1 0:1   round 2: 2:2 3:2 0:2 1:0   round 3: 2:3 3:3 0:3 1:1
//   tail:    1:2 1:3
//
// At every step the ranks of one band send to one band and every band receives from one (the same
// offset on every rank), so every link is busy, and every owner receives from its peers all the
// time. A rank's own tile j needs the peers' partials of it, computed in their round j; it comes L
// rounds later: at least L * (B-1) + 1 steps later inside the rounds, at least max(L, 1) steps in
// the tail; later rounds hold B steps each, so further inside the rounds the lead grows to about
// L * B steps. The own tiles, each longer than a peer's tile by its reduction, are then spread over
// the whole call instead of filling its last 1/B, and the pushes go on to its end. With L >= T
// (kOwnTilesLast) every own tile comes last. The config picks L (ops/gemm_rs/config.cpp).
//
// One band may also split each tile's K loop over num_splits consecutive steps (split j of tile t is
// step t * num_splits + j, as in gemm/split_k.h): decode-sized M, whose tiles fill few SMs. One split
// of a tile adds all the FP32 partials in split order and only it pushes and reduces: the last
// (ops/gemm_rs/epilogue.cuh), or the one that finishes last (ops/gemm_rs/shared_tiles.cuh).
//
// NOTE: in a band of several segments, the band's other ranks compute their shared tiles at the
// same steps as r: each must push its partners' rows of such a tile before it waits for the
// partials of its own rows, or they wait for each other. With one band (S = P) every rank computes
// every tile at the same step, and the rounds above are a single band's tiles in raster order.
//
// Inside a band, tiles go in raster order (gemm/raster.h), so that the CTAs working at the same
// time share A rows and W columns in L2.
#pragma once

#include "core/fast_division.h"
#include "core/host_device.h"
#include "gemm/raster.h"
#include "gemm/split_k.h"
#include "gemm/tile.h"

namespace tpfuse {

// An own_lag so large that every own tile comes after every foreign one.
constexpr int kOwnTilesLast = 1 << 30;

// What defines a rank's schedule: the problem's sizes and the config's choices.
struct ScheduleShape {
  int world_size = 1;
  int rank = 0;
  int m = 0;
  int n = 0;
  int block_m = 128;
  int block_n = 256;
  int group_rows = 8;
  int own_lag = kOwnTilesLast;  // rounds between a peer tile and the own tile of the same rows (see above); >= 0
  // Segments a band holds: 1; 2 (needs an even world_size and rows_per_rank() * 2 == block_m); or
  // world_size (one band: tiles of several owners' rows).
  int segments_per_tile = 1;
  // Steps a tile's K loop is split in (one band only: segments_per_tile == world_size).
  int num_splits = 1;

  TPFUSE_HOST_DEVICE int rows_per_rank() const { return m / world_size; }
};

// A rank's schedule: its shape, with the counts and divisors of the per-step arithmetic prepared
// once on the host (the kernels map steps to tiles on single threads, fast_division.h).
class TileSchedule {
 public:
  TileSchedule() = default;

  explicit TileSchedule(const ScheduleShape& shape) : shape_(shape) {
    bands_ = shape.world_size / shape.segments_per_tile;
    own_band_ = shape.rank / shape.segments_per_tile;
    rows_per_rank_ = shape.rows_per_rank();
    rows_per_band_ = rows_per_rank_ * shape.segments_per_tile;
    row_tiles_ = (rows_per_band_ + shape.block_m - 1) / shape.block_m;
    col_tiles_ = (shape.n + shape.block_n - 1) / shape.block_n;
    tiles_per_band_ = row_tiles_ * col_tiles_;
    lag_ = max_int(0, min_int(shape.own_lag, tiles_per_band_));
    first_own_step_ = lag_ * (bands_ - 1);  // rounds 0 .. lag-1 hold B-1 tiles each, later rounds B
    tail_ = first_own_step_ + (tiles_per_band_ - lag_) * bands_;
    by_peer_bands_ = FastDivision(max_int(1, bands_ - 1));
    by_bands_ = FastDivision(bands_);
    order_ = RasterOrder(row_tiles_, col_tiles_, shape.group_rows);
    splits_ = KSplits(shape.num_splits);
  }

  TPFUSE_HOST_DEVICE const ScheduleShape& shape() const { return shape_; }
  TPFUSE_HOST_DEVICE int num_bands() const { return bands_; }
  TPFUSE_HOST_DEVICE int rows_per_band() const { return rows_per_band_; }
  TPFUSE_HOST_DEVICE int row_tiles_per_band() const { return row_tiles_; }
  TPFUSE_HOST_DEVICE int col_tiles() const { return col_tiles_; }
  TPFUSE_HOST_DEVICE int tiles_per_band() const { return tiles_per_band_; }
  // Steps, as the mainloop counts them: a tile each, or num_splits each.
  TPFUSE_HOST_DEVICE int num_tiles() const { return bands_ * tiles_per_band_ * splits_.num_splits(); }
  TPFUSE_HOST_DEVICE int num_splits() const { return splits_.num_splits(); }

  // The part of its tile's K loop of num_k_blocks that `step` multiplies (all of it without splits).
  TPFUSE_HOST_DEVICE KSlice k_slice(int step, int num_k_blocks) const { return splits_.k_slice(step, num_k_blocks); }
  // Whether `step` is its tile's last split (every step without splits): the one that pushes and reduces.
  TPFUSE_HOST_DEVICE bool last_split(int step) const { return splits_.last_split(step); }

  // The band at `offset` of a round: the one after this rank's, ..., then its own (offset B-1).
  TPFUSE_HOST_DEVICE int band_at_offset(int offset) const {
    const int band = own_band_ + 1 + offset;  // < 2B
    return band >= bands_ ? band - bands_ : band;
  }

  // The band offset of `step` and its tile's index inside the band.
  TPFUSE_HOST_DEVICE void locate(int step, int* offset, int* index) const {
    const int own = bands_ - 1;
    if (own == 0) {
      *offset = 0;
      *index = step;
    } else if (step < first_own_step_) {
      *index = by_peer_bands_.div(step);
      *offset = step - *index * own;
    } else if (step < tail_) {
      const int k = step - first_own_step_;
      const int round = by_bands_.div(k);
      *offset = k - round * bands_;
      *index = *offset == own ? round : lag_ + round;
    } else {
      *offset = own;
      *index = tiles_per_band_ - lag_ + (step - tail_);
    }
  }

  // The tile this rank computes at `step`, 0 <= step < num_tiles().
  TPFUSE_HOST_DEVICE Tile tile(int step) const {
    step = splits_.tile_of(step);
    int offset = 0, t = 0;
    locate(step, &offset, &t);
    const int band = band_at_offset(offset);

    int row_tile = 0, col_tile = 0;
    order_.locate(t, &row_tile, &col_tile);

    const int band_begin = band * rows_per_band_;
    const int band_end = band_begin + rows_per_band_;
    Tile tile;
    tile.owner_rank = band * shape_.segments_per_tile;
    tile.segment_row = row_tile * shape_.block_m;
    tile.row_begin = band_begin + tile.segment_row;
    tile.row_end = min_int(tile.row_begin + shape_.block_m, band_end);
    tile.col_begin = col_tile * shape_.block_n;
    tile.col_end = min_int(tile.col_begin + shape_.block_n, shape_.n);
    tile.rows_per_owner = shape_.segments_per_tile == 1 ? shape_.block_m : rows_per_rank_;
    return tile;
  }

 private:
  TPFUSE_HOST_DEVICE static int min_int(int a, int b) { return a < b ? a : b; }
  TPFUSE_HOST_DEVICE static int max_int(int a, int b) { return a > b ? a : b; }

  ScheduleShape shape_;
  int bands_ = 1;
  int own_band_ = 0;
  int rows_per_rank_ = 0;
  int rows_per_band_ = 0;
  int row_tiles_ = 0;
  int col_tiles_ = 0;
  int tiles_per_band_ = 0;
  int lag_ = 0;             // own_lag, at most a band's tiles
  int first_own_step_ = 0;  // the first step of a round that holds an own tile
  int tail_ = 0;            // the first step after the rounds (own tiles only)
  FastDivision by_peer_bands_;
  FastDivision by_bands_;
  RasterOrder order_;
  KSplits splits_;
};

// The mainloop's view of a step's K blocks (gemm/split_k.h).
TPFUSE_HOST_DEVICE KSlice k_slice_of(const TileSchedule& schedule, int step, int num_k_blocks) {
  return schedule.k_slice(step, num_k_blocks);
}

}  // namespace tpfuse
