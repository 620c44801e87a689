// The all-gather + GEMM's layout of a rank's workspace, one parity half (comm/communicator.h), sized
// for the largest problem the communicator serves:
//   data:    gathered[source rank][rows_per_rank][k]   the problem's dtype: each rank's block of X
//   flags:   [source rank][row block]                  u32 epoch values: that row block has landed
//   counts:  [source rank][row block]                  u32: its pieces landed so far (0 between calls)
// A row block is kCopyRows rows of a block, all of k: contiguous in X_s and in the gathered buffer,
// so it is pushed in contiguous pieces (a CTA's each, the last ones clipped or empty) that the copier
// moves by bulk copies. Each piece counts itself in at its row block's counter in the destination; the
// piece that counts in last raises the row block's flag, so that a tile waits for one or two flags
// whatever the number of pieces. A call lays its own problem out in them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "comm/workspace_size.h"
#include "tpfuse/communicator.h"
#include "core/host_device.h"
#include "gemm/variants.h"

namespace tpfuse {

constexpr int kCopyRows = 64;
// A piece is at least this many bytes (below it, its count-in costs more than its copy).
constexpr int64_t kMinPieceBytes = 8192;

inline int64_t copy_row_blocks(int64_t rows_per_rank) { return (rows_per_rank + kCopyRows - 1) / kCopyRows; }

// What a copier CTA with no tile stores while a tile 256 wide multiplies one K block (its deep ring
// measured 40-50 GB/s, a K block 0.5-0.7 us; 64-row tiles' K blocks, bound by their loads, take
// about as long as 128-row ones). A copier slows its own CTA's tiles while it runs, so where a call
// leaves CTAs without a step (one partial wave), those copy alone if they finish in a step's time.
constexpr int64_t kIdleCopierBytesPerKBlock = 32 << 10;

// Which CTAs copy and how a block of rows_per_rank x k is cut into pieces: about one a copier CTA
// (each piece's fixed cost, its drain and count-in, is paid about once a CTA: two a CTA measured
// slower), at least kMinPieceBytes, at most a row block (the last row block's pieces may be fewer).
// Copier CTAs are first_copier .. first_copier + copiers - 1: all CTAs, or those past the call's
// steps where there are enough of them.
struct CopyPlan {
  int row_blocks = 0;
  int pieces_per_block = 0;  // every row block has as many (the last one's may be empty)
  int64_t piece_elems = 0;   // elements of X's dtype, whole 16-byte units: 16-byte aligned pieces
  int first_copier = 0;
  int copiers = 1;
};

// X's block is rows_per_rank x k elements of `dtype`. `steps`: the call's steps on these num_ctas
// CTAs (a CTA at or past it takes none); `step_k_blocks`: a step's K blocks, scaled to a tile 256
// wide; `destinations`: the gathered buffers every piece is stored into; `idle_copiers`
// (overrides.idle_copiers) 1: the CTAs without a step copy whenever there is one, 0: never, -1: where
// they finish in a step's time.
inline CopyPlan copy_plan(int64_t rows_per_rank, int64_t k, DType dtype, int num_ctas, int steps,
                          double step_k_blocks, int destinations, int idle_copiers = -1) {
  const int64_t x_element_bytes = element_bytes(dtype);
  const int64_t elements_per_16_bytes = 16 / x_element_bytes;
  CopyPlan plan;
  plan.copiers = num_ctas;
  const int idle = num_ctas - steps;
  const double idle_bytes = step_k_blocks * double(kIdleCopierBytesPerKBlock) * idle;
  const double bytes = double(rows_per_rank * k * x_element_bytes * destinations);
  const bool idle_copy = idle_copiers == 1 || (idle_copiers == -1 && bytes <= idle_bytes);
  if (idle > 0 && idle_copy) {
    plan.first_copier = steps;
    plan.copiers = idle;
  }
  const int64_t block_elems = std::min<int64_t>(rows_per_rank, kCopyRows) * k;
  const int64_t wanted = (rows_per_rank * k + int64_t(plan.copiers) - 1) / int64_t(plan.copiers);
  const int64_t piece = std::min(std::max(wanted, kMinPieceBytes / x_element_bytes), block_elems);
  plan.row_blocks = int(copy_row_blocks(rows_per_rank));
  plan.piece_elems = (piece + elements_per_16_bytes - 1) / elements_per_16_bytes * elements_per_16_bytes;
  plan.pieces_per_block = int((block_elems + plan.piece_elems - 1) / plan.piece_elems);
  return plan;
}

// Piece `piece` (0 <= piece < row_blocks * pieces_per_block) of a block of rows_per_rank x k: its
// row block and its elements [begin, end) of the block (begin == end: an empty piece, which only
// counts in).
struct PieceRange {
  int block;
  int64_t begin;
  int64_t end;
};

TPFUSE_HOST_DEVICE PieceRange piece_range(const CopyPlan& plan, int64_t rows_per_rank, int64_t k, int piece) {
  PieceRange r;
  r.block = piece / plan.pieces_per_block;
  const int64_t block_begin = int64_t(r.block) * kCopyRows * k;
  const int64_t block_end = (int64_t(r.block) + 1) * kCopyRows < rows_per_rank ? block_begin + kCopyRows * k
                                                                               : rows_per_rank * k;
  const int64_t begin = block_begin + int64_t(piece - r.block * plan.pieces_per_block) * plan.piece_elems;
  r.begin = begin < block_end ? begin : block_end;
  r.end = r.begin + plan.piece_elems < block_end ? r.begin + plan.piece_elems : block_end;
  return r;
}

inline WorkspaceSize all_gather_workspace(const CommunicatorOptions& options, int world_size) {
  const int64_t rows = options.max_m / world_size;
  WorkspaceSize size;
  // Blocks of X, the GEMM's input: as wide as the widest dtype a call may bring.
  size.data_bytes = size_t(world_size) * size_t(rows) * size_t(options.max_k) * max_input_element_bytes();
  size.flag_words = size_t(world_size) * size_t(copy_row_blocks(rows));
  size.count_words = size.flag_words;
  return size;
}

}  // namespace tpfuse
