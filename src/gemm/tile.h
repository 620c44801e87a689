// A tile of an output, and the steps a CTA of a persistent grid takes. Pure C++ that the kernels
// also compile.
#pragma once

#include "core/host_device.h"

namespace tpfuse {

// One output tile: rows [row_begin, row_end) (clipped to its band), columns [col_begin, col_end)
// (clipped to n). An op's schedule says whose rows they are: owner_rank owns the tile's first rows,
// segment_row is row_begin counted from the start of the band, and in a band of several segments
// rows_per_owner is a segment's rows (ops/gemm_rs/schedule.h: with two segments the tile's rows from
// rows_per_owner on belong to owner_rank + 1; with all of them, a tile may hold several owners').
// A band of one segment has rows_per_owner = the tile's height. The plain GEMM's tiles have one
// owner, rank 0, whose segment is the whole output.
struct Tile {
  int owner_rank;
  int row_begin;
  int row_end;
  int segment_row;
  int col_begin;
  int col_end;
  int rows_per_owner;

  // The owner of the tile's rows from `tile_row` on, and where they land in its segment, for a tile
  // of one or two owners (for a tile_row at the start of a slab: a slab never spans two owners). No
  // division: the kernels ask per piece of partials, on one thread.
  TPFUSE_HOST_DEVICE int owner_of(int tile_row) const { return tile_row < rows_per_owner ? owner_rank : owner_rank + 1; }
  TPFUSE_HOST_DEVICE int segment_row_of(int tile_row) const {
    return tile_row < rows_per_owner ? segment_row + tile_row : tile_row - rows_per_owner;
  }

  // The owner of tile row `tile_row` in a band of all segments (a division).
  TPFUSE_HOST_DEVICE int owner_of_row(int tile_row) const { return owner_rank + (segment_row + tile_row) / rows_per_owner; }
  // Where tile row `tile_row` would land in the segment of `owner`, one of the band's: negative or
  // past the segment where the row is another owner's.
  TPFUSE_HOST_DEVICE int segment_row_for(int tile_row, int owner) const {
    return segment_row + tile_row - (owner - owner_rank) * rows_per_owner;
  }
};

// The part of its tile's K loop that a step multiplies: K blocks [k_block_begin, k_block_begin +
// num_k_blocks), split `split` of the `num_splits` the tile's K loop is cut into; tile_index is the
// tile's place in its schedule. A schedule that splits K gives each of a tile's steps a slice
// (gemm/split_k.h); the others give every step all of K, split 0 of 1, tile_index = the step.
struct KSlice {
  int tile_index;
  int split;
  int num_splits;
  int k_block_begin;
  int num_k_blocks;
};

// The steps that CTA `cta` of a persistent grid of `num_ctas` takes, one a wave: wave k holds steps
// k * num_ctas .. (k+1) * num_ctas - 1, and CTA b takes the one at place (b + k) % num_ctas. Moving
// on by a place each wave, every CTA takes every place in turn: a CTA that kept its place (steps b,
// b + num_ctas, ...) would meet the same offsets of a schedule's rounds every wave (with 132 CTAs
// and P = 2 or 4 the same CTAs would take every own tile of the reduce-scatter). Walked without a
// division, an add and a compare a wave: the kernels' single threads take every step.
class CtaSteps {
 public:
  // 0 <= cta < num_ctas.
  TPFUSE_HOST_DEVICE CtaSteps(int cta, int num_ctas) : num_ctas_(num_ctas), step_(cta), place_(cta) {}

  TPFUSE_HOST_DEVICE int step() const { return step_; }

  // On to the next wave's step.
  TPFUSE_HOST_DEVICE void next() {
    const int next_wave = step_ - place_ + num_ctas_;
    if (++place_ == num_ctas_) place_ = 0;
    step_ = next_wave + place_;
  }

 private:
  int num_ctas_;
  int step_;
  int place_;  // in the wave: (cta + wave) mod num_ctas
};

}  // namespace tpfuse
