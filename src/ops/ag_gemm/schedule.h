// The all-gather + GEMM's per-rank tile schedule: which output tile a rank computes at each step.
// Pure C++ that the kernels also compile, so the order tested on the CPU is the order the GPU runs.
//
// Y_r (m x n_per_rank) is cut into P bands of m/P rows, band s holding the rows of X_s, the block of
// X that rank s holds. Rank r computes its own band first (X_r is local: no wait), then the bands of
// r-1, r-2, ... (mod P); inside a band the tiles go in raster order (gemm/raster.h):
//
//   P = 4, B = a band's tiles        steps 0..B-1   B..2B-1   2B..3B-1   3B..4B-1
//   rank 0                           band 0         band 3    band 2     band 1
//   rank 1                           band 1         band 0    band 3     band 2
//
// Every rank pushes its block to all its peers from the start of the call, piece by piece
// (ops/ag_gemm/epilogue.cuh), so the peers' blocks land while the own band is multiplied. A tile
// never spans two bands; its owner_rank is the band's rank, whose block of X it reads. Where the
// tiles fill few SMs, each tile's K loop may be split over num_splits consecutive steps, as the
// plain GEMM's (gemm/split_k.h): the band order is the tiles', each tile's splits side by side.
#pragma once

#include "core/fast_division.h"
#include "core/host_device.h"
#include "gemm/raster.h"
#include "gemm/split_k.h"
#include "gemm/tile.h"

namespace tpfuse {

class AllGatherSchedule {
 public:
  AllGatherSchedule() = default;

  // On the host: the divisors are prepared here. m divisible by world_size.
  AllGatherSchedule(int world_size, int rank, int m, int n, int block_m, int block_n, int group_rows,
                    int num_splits = 1)
      : world_size_(world_size), rank_(rank), rows_per_band_(m / world_size), n_(n), block_m_(block_m),
        block_n_(block_n), splits_(num_splits) {
    const int row_tiles = (rows_per_band_ + block_m - 1) / block_m;
    const int col_tiles = (n + block_n - 1) / block_n;
    tiles_per_band_ = row_tiles * col_tiles;
    by_tiles_per_band_ = FastDivision(tiles_per_band_ > 1 ? tiles_per_band_ : 1);
    order_ = RasterOrder(row_tiles, col_tiles, group_rows);
  }

  // Steps, as the mainloop counts them: a tile each, or num_splits each.
  TPFUSE_HOST_DEVICE int num_tiles() const { return world_size_ * tiles_per_band_ * splits_.num_splits(); }
  TPFUSE_HOST_DEVICE int tiles_per_band() const { return tiles_per_band_; }
  TPFUSE_HOST_DEVICE int num_splits() const { return splits_.num_splits(); }
  TPFUSE_HOST_DEVICE KSlice k_slice(int step, int num_k_blocks) const { return splits_.k_slice(step, num_k_blocks); }

  // The band a rank computes `offset`-th: its own, then r-1, r-2, ...
  TPFUSE_HOST_DEVICE int band_at_offset(int offset) const {
    const int band = rank_ - offset;
    return band < 0 ? band + world_size_ : band;
  }

  // 0 <= step < num_tiles().
  TPFUSE_HOST_DEVICE Tile tile(int step) const {
    step = splits_.tile_of(step);
    const int offset = by_tiles_per_band_.div(step);
    const int t = step - offset * tiles_per_band_;
    int row_tile = 0, col_tile = 0;
    order_.locate(t, &row_tile, &col_tile);
    const int band = band_at_offset(offset);
    const int band_begin = band * rows_per_band_;
    Tile tile;
    tile.owner_rank = band;
    tile.segment_row = row_tile * block_m_;
    tile.row_begin = band_begin + tile.segment_row;
    tile.row_end = tile.row_begin + block_m_ < band_begin + rows_per_band_ ? tile.row_begin + block_m_
                                                                           : band_begin + rows_per_band_;
    tile.col_begin = col_tile * block_n_;
    tile.col_end = tile.col_begin + block_n_ < n_ ? tile.col_begin + block_n_ : n_;
    tile.rows_per_owner = block_m_;
    return tile;
  }

 private:
  int world_size_ = 1;
  int rank_ = 0;
  int rows_per_band_ = 0;
  int n_ = 0;
  int block_m_ = 128;
  int block_n_ = 256;
  int tiles_per_band_ = 0;
  FastDivision by_tiles_per_band_;
  RasterOrder order_;
  KSplits splits_;
};

// The mainloop's view of a step's K blocks (gemm/split_k.h).
TPFUSE_HOST_DEVICE KSlice k_slice_of(const AllGatherSchedule& schedule, int step, int num_k_blocks) {
  return schedule.k_slice(step, num_k_blocks);
}

}  // namespace tpfuse
