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
// A piece's columns: wide where a block has many rows (fewer flags to wait for), narrow where it has
// few, so that there are pieces for every copier warp (`copiers`) to push at once.
constexpr int kWideCopyCols = 1024;
constexpr int kNarrowCopyCols = 256;

inline int64_t copy_row_blocks(int64_t rows_per_rank) { return (rows_per_rank + kCopyRows - 1) / kCopyRows; }
inline int64_t copy_col_chunks(int64_t k, int copy_cols) { return (k + copy_cols - 1) / copy_cols; }
inline int copy_cols_for(int64_t rows_per_rank, int64_t k, int copiers) {
  return copy_row_blocks(rows_per_rank) * copy_col_chunks(k, kWideCopyCols) >= copiers ? kWideCopyCols : kNarrowCopyCols;
}

inline WorkspaceSize all_gather_workspace(const CommunicatorOptions& options, int world_size) {
  const int64_t rows = options.max_m / world_size;
  WorkspaceSize size;
  size.data_bytes = size_t(world_size) * size_t(rows) * size_t(options.max_k) * 2;
  size.flag_words = size_t(world_size) * size_t(copy_row_blocks(rows)) * size_t(copy_col_chunks(options.max_k, kNarrowCopyCols));
  return size;
}

}  // namespace tpfuse
