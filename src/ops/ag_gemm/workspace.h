// The all-gather + GEMM's layout of a rank's workspace, one parity half (comm/communicator.h), sized
// for the largest problem the communicator serves:
//   data:   gathered[source rank][rows_per_rank][k]        BF16: each rank's block of X
//   flags:  [source rank][row block][column chunk]         u32 epoch values: that piece has landed
// A block is pushed in pieces of kCopyRows x copy_cols (the last ones clipped), each with a flag, so
// that a tile's loads wait only for the rows they read. A call lays its own problem out in them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/communicator.h"

namespace tpfuse {

constexpr int kCopyRows = 64;
// A piece's columns: wide where a block has many rows (fewer flags for a tile to wait for: polling
// them costs the producer time), narrow where it has few, so that half the CTAs have a piece to
// push at once.
constexpr int kWideCopyCols = 1024;
constexpr int kNarrowCopyCols = 256;

inline int64_t copy_row_blocks(int64_t rows_per_rank) { return (rows_per_rank + kCopyRows - 1) / kCopyRows; }
inline int64_t copy_col_chunks(int64_t k, int copy_cols) { return (k + copy_cols - 1) / copy_cols; }
inline int copy_cols_for(int64_t rows_per_rank, int64_t k, int num_ctas) {
  return 2 * copy_row_blocks(rows_per_rank) * copy_col_chunks(k, kWideCopyCols) >= num_ctas ? kWideCopyCols
                                                                                           : kNarrowCopyCols;
}

// Copier warps a CTA runs (of its kCopierWarps, ops/ag_gemm/epilogue.cuh): one where a block has
// wide pieces to spare for every CTA (the copy then stretches over the multiply instead of taking the
// memory's bandwidth from it at the start), all where it has few.
inline int copiers_per_cta_for(int64_t rows_per_rank, int64_t k, int num_ctas, int max_per_cta) {
  return copy_row_blocks(rows_per_rank) * copy_col_chunks(k, kWideCopyCols) >= 2 * int64_t(num_ctas) ? 1 : max_per_cta;
}

inline WorkspaceSize all_gather_workspace(const CommunicatorOptions& options, int world_size) {
  const int64_t rows = options.max_m / world_size;
  WorkspaceSize size;
  size.data_bytes = size_t(world_size) * size_t(rows) * size_t(options.max_k) * 2;
  size.flag_words = size_t(world_size) * size_t(copy_row_blocks(rows)) * size_t(copy_col_chunks(options.max_k, kNarrowCopyCols));
  return size;
}

}  // namespace tpfuse
