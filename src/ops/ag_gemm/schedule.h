// The all-gather + GEMM's per-rank tile schedule: which output tile a rank computes at each step.
// Pure C++ that the kernels also compile, so the order tested on the CPU is the order the GPU runs.
//
// Y_r (m x n_per_rank) is cut into bands of G consecutive blocks of m/P rows (block s holding the
// rows of X_s, the block of X that rank s holds): G = 1 in general, G = 2 where a block has 64 rows
// (128-row tiles over two blocks, as the reduce-scatter's bands of two segments), G = P where a
// block has fewer (one band). Rank r computes its own band (the one holding block r) first, then
// the bands before it, r-1, r-2, ... (mod P/G); inside a band the tiles go in raster order
// (gemm/raster.h):
//
//   P = 4, G = 1, B = a band's tiles   steps 0..B-1   B..2B-1   2B..3B-1   3B..4B-1
//   rank 0                             band 0         band 3    band 2     band 1
//   rank 1                             band 1         band 0    band 3     band 2
//
// Every rank pushes its block to all its peers from the start of the call, piece by piece
// (ops/ag_gemm/epilogue.cuh), so the peers' blocks land while the own band is multiplied (with
// G > 1 the own band also waits for its partners' blocks, and for the rank's own block in its own
// gathered buffer). A tile never spans two bands; its owner_rank is the band's first block's rank.
// Where every band is one row of tiles and all steps fit in one wave of the rank's CTAs, every tile
// starts at once and the band order decides nothing about waiting, only which CTAs sit side by side:
// there the steps go down the bands (in the same order) for each column of tiles, so that the CTAs
// reading the same columns of W are neighbours, as in the plain GEMM's raster (measured faster at
// M = 512, P = 8: docs/EXPERIMENTS.md):
//
//   P = 4, one wave, rank 1    steps 0  1  2  3  4  5  6  7 ...
//                              band  1  0  3  2  1  0  3  2
//                              col   0  0  0  0  1  1  1  1
// Where the tiles fill few SMs, each tile's K loop may be split over num_splits consecutive steps, as
// the plain GEMM's (gemm/split_k.h): the band order is the tiles', each tile's splits side by side;
// where only the tiles past the last full wave would leave SMs idle, those alone (the last bands'
// tiles).
#pragma once

#include "core/fast_division.h"
#include "core/host_device.h"
#include "gemm/raster.h"
#include "gemm/split_k.h"
#include "gemm/tile.h"

namespace tpfuse {

struct AllGatherShape {
  int world_size = 1;
  int rank = 0;
  int m = 0;  // divisible by world_size
  int n = 0;  // n_per_rank
  int block_m = 128;
  int block_n = 256;
  int group_rows = 1;
  int num_splits = 1;        // of each tile's K loop (gemm/split_k.h)
  int whole_tiles = 0;       // the tiles before it whole, the rest in num_splits (gemm/split_k.h)
  int sources_per_band = 1;  // G: blocks of X a band holds (1, 2 or world_size; divides world_size)
  int num_ctas = 0;          // the rank's CTAs (0: unknown, the bands one after another)
};

class AllGatherSchedule {
 public:
  AllGatherSchedule() = default;

  // On the host: the divisors are prepared here.
  explicit AllGatherSchedule(const AllGatherShape& shape)
      : bands_(shape.world_size / shape.sources_per_band), own_band_(shape.rank / shape.sources_per_band),
        sources_per_band_(shape.sources_per_band), rows_per_band_(shape.m / bands_), n_(shape.n),
        block_m_(shape.block_m), block_n_(shape.block_n), splits_(shape.num_splits, shape.whole_tiles) {
    const int row_tiles = (rows_per_band_ + block_m_ - 1) / block_m_;
    const int col_tiles = (n_ + block_n_ - 1) / block_n_;
    tiles_per_band_ = row_tiles * col_tiles;
    by_tiles_per_band_ = FastDivision(tiles_per_band_ > 1 ? tiles_per_band_ : 1);
    by_bands_ = FastDivision(bands_);
    order_ = RasterOrder(row_tiles, col_tiles, shape.group_rows);
    bands_interleaved_ = row_tiles == 1 && bands_ > 1 && num_tiles() <= shape.num_ctas;
  }

  // Steps, as the mainloop counts them: a tile each, or num_splits each (the split ones).
  TPFUSE_HOST_DEVICE int num_tiles() const { return splits_.num_steps(bands_ * tiles_per_band_); }
  TPFUSE_HOST_DEVICE int num_bands() const { return bands_; }
  TPFUSE_HOST_DEVICE int tiles_per_band() const { return tiles_per_band_; }
  TPFUSE_HOST_DEVICE int num_splits() const { return splits_.num_splits(); }
  TPFUSE_HOST_DEVICE int whole_tiles() const { return splits_.whole_tiles(); }
  // Whether the steps go down the bands for each column of tiles (one wave of one-row bands).
  TPFUSE_HOST_DEVICE bool bands_interleaved() const { return bands_interleaved_; }
  TPFUSE_HOST_DEVICE KSlice k_slice(int step, int num_k_blocks) const { return splits_.k_slice(step, num_k_blocks); }

  // The band a rank computes `offset`-th: its own, then the ones before it.
  TPFUSE_HOST_DEVICE int band_at_offset(int offset) const {
    const int band = own_band_ - offset;
    return band < 0 ? band + bands_ : band;
  }

  // 0 <= step < num_tiles().
  TPFUSE_HOST_DEVICE Tile tile(int step) const {
    step = splits_.tile_of(step);
    int offset = 0, row_tile = 0, col_tile = 0;
    if (bands_interleaved_) {
      col_tile = by_bands_.div(step);
      offset = step - col_tile * bands_;
    } else {
      offset = by_tiles_per_band_.div(step);
      order_.locate(step - offset * tiles_per_band_, &row_tile, &col_tile);
    }
    const int band = band_at_offset(offset);
    const int band_begin = band * rows_per_band_;
    Tile tile;
    tile.owner_rank = band * sources_per_band_;
    tile.segment_row = row_tile * block_m_;  // in the band
    tile.row_begin = band_begin + tile.segment_row;
    tile.row_end = tile.row_begin + block_m_ < band_begin + rows_per_band_ ? tile.row_begin + block_m_
                                                                           : band_begin + rows_per_band_;
    tile.col_begin = col_tile * block_n_;
    tile.col_end = tile.col_begin + block_n_ < n_ ? tile.col_begin + block_n_ : n_;
    tile.rows_per_owner = block_m_;
    return tile;
  }

 private:
  int bands_ = 1;
  int own_band_ = 0;
  int sources_per_band_ = 1;
  int rows_per_band_ = 0;
  int n_ = 0;
  int block_m_ = 128;
  int block_n_ = 256;
  int tiles_per_band_ = 0;
  FastDivision by_tiles_per_band_;
  FastDivision by_bands_;
  RasterOrder order_;
  bool bands_interleaved_ = false;
  KSplits splits_;
};

// The mainloop's view of a step's K blocks (gemm/split_k.h).
TPFUSE_HOST_DEVICE KSlice k_slice_of(const AllGatherSchedule& schedule, int step, int num_k_blocks) {
  return schedule.k_slice(step, num_k_blocks);
}

}  // namespace tpfuse
