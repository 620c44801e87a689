// The order of the tiles inside a band of rows, and the plain GEMM's schedule. Pure C++ that the
// kernels also compile.
//
// Tiles go in groups of `group_rows` row tiles, column-major inside a group, so that the CTAs at
// work at one time share A rows and W columns in L2:
//
//   group_rows = 2, band of 4 x 3 tiles:        0  2  4
//                                               1  3  5
//                                               6  8 10
//                                               7  9 11
#pragma once

#include "core/fast_division.h"
#include "core/host_device.h"
#include "gemm/tile.h"

namespace tpfuse {

class RasterOrder {
 public:
  RasterOrder() = default;

  // row_tiles, col_tiles >= 0; group_rows >= 1. On the host: the divisors are prepared here.
  RasterOrder(int row_tiles, int col_tiles, int group_rows)
      : group_rows_(group_rows),
        last_group_(row_tiles > 0 ? (row_tiles - 1) / group_rows : 0),
        by_group_tiles_(group_rows * col_tiles > 1 ? group_rows * col_tiles : 1),
        by_group_rows_(group_rows),
        by_last_group_rows_(row_tiles - last_group_ * group_rows > 1 ? row_tiles - last_group_ * group_rows : 1) {}

  // The row and column tile of tile `t` of the band.
  TPFUSE_HOST_DEVICE void locate(int t, int* row_tile, int* col_tile) const {
    const int group = by_group_tiles_.div(t);
    const int t_in_group = t - group * by_group_tiles_.divisor();
    const FastDivision& by_rows_in_group = group == last_group_ ? by_last_group_rows_ : by_group_rows_;
    *col_tile = by_rows_in_group.div(t_in_group);
    *row_tile = group * group_rows_ + (t_in_group - *col_tile * by_rows_in_group.divisor());
  }

 private:
  int group_rows_ = 1;
  int last_group_ = 0;  // the last group of row tiles, which may hold fewer than group_rows
  FastDivision by_group_tiles_;  // group_rows * col_tiles
  FastDivision by_group_rows_;
  FastDivision by_last_group_rows_;
};

// The plain GEMM's schedule: the m x n output as one band in raster order, tile t at step t.
class GemmSchedule {
 public:
  GemmSchedule() = default;

  GemmSchedule(int m, int n, int block_m, int block_n, int group_rows)
      : m_(m), n_(n), block_m_(block_m), block_n_(block_n), row_tiles_((m + block_m - 1) / block_m),
        col_tiles_((n + block_n - 1) / block_n), order_(row_tiles_, col_tiles_, group_rows) {}

  TPFUSE_HOST_DEVICE int num_tiles() const { return row_tiles_ * col_tiles_; }

  // 0 <= step < num_tiles().
  TPFUSE_HOST_DEVICE Tile tile(int step) const {
    int row_tile = 0, col_tile = 0;
    order_.locate(step, &row_tile, &col_tile);
    Tile tile;
    tile.owner_rank = 0;
    tile.row_begin = row_tile * block_m_;
    tile.segment_row = tile.row_begin;
    tile.row_end = tile.row_begin + block_m_ < m_ ? tile.row_begin + block_m_ : m_;
    tile.col_begin = col_tile * block_n_;
    tile.col_end = tile.col_begin + block_n_ < n_ ? tile.col_begin + block_n_ : n_;
    tile.rows_per_owner = block_m_;
    return tile;
  }

 private:
  int m_ = 0;
  int n_ = 0;
  int block_m_ = 128;
  int block_n_ = 256;
  int row_tiles_ = 0;
  int col_tiles_ = 0;
  RasterOrder order_;
};

}  // namespace tpfuse
