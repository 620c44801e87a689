// The reduce-scatter's layout of a rank's workspace, one parity half (comm/communicator.h), sized
// for the largest problem the communicator serves:
//   data:   recv[source rank][rows_per_rank][n]     BF16: each peer's partial of this rank's rows
//   flags:  [source rank][tile of a band][slab]     u32 epoch values: that partial has landed
//   data, after recv: parked[own tile][slab]        FP32: own tiles parked for the reducer CTAs
//   counts: [own tile][slab]                         1 once parked, 0 again once a reducer has seen it
//                                                    (ops/gemm_rs/reducer.cuh)
// A call lays its own problem out in them (rows_per_rank and n of the call, tiles of its config).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "comm/workspace_size.h"
#include "tpfuse/communicator.h"
#include "gemm/variants.h"
#include "ops/gemm_rs/shared_storage.h"

namespace tpfuse {

// Where the parked own tiles start in a parity half's data: after the call's receive buffer.
inline size_t parked_offset(int world_size, int64_t rows_per_rank, int64_t n) {
  constexpr size_t kAlign = 256;
  const size_t recv = size_t(world_size) * size_t(rows_per_rank) * size_t(n) * element_bytes(DType::kBF16);
  return (recv + kAlign - 1) / kAlign * kAlign;
}

// Flags are sized for the most tiles any variant the op takes cuts a band into: a band is a segment,
// or all of them where segments are shorter than a slab (ops/gemm_rs/schedule.h).
inline WorkspaceSize gemm_rs_workspace(const CommunicatorOptions& options, int world_size) {
  int min_block_m = kGemmVariants[0].block_m, min_block_n = kGemmVariants[0].block_n;
  int max_block_m = 0, max_block_n = 0;
  for (const GemmVariant& v : kGemmVariants) {
    if (!PushReduceSync::takes(v)) continue;
    min_block_m = std::min(min_block_m, v.block_m);
    min_block_n = std::min(min_block_n, v.block_n);
    max_block_m = std::max(max_block_m, v.block_m);
    max_block_n = std::max(max_block_n, v.block_n);
  }
  const int64_t rows = options.max_m / world_size;
  const int64_t band_rows = std::max(rows, std::min(options.max_m, int64_t(kSlabRows) * world_size));
  const size_t tiles =
      size_t((band_rows + min_block_m - 1) / min_block_m) * size_t((options.max_n + min_block_n - 1) / min_block_n);
  constexpr size_t kSlabsPerTile = kConsumers;
  WorkspaceSize size;
  // The partials are the GEMM's outputs: BF16 whatever the inputs.
  // The parked own tiles are whole tiles: at most a tile more than the rows and columns.
  size.data_bytes = parked_offset(world_size, rows, options.max_n) +
                    size_t(rows + max_block_m) * size_t(options.max_n + max_block_n) * sizeof(float);
  size.flag_words = size_t(world_size) * tiles * kSlabsPerTile;
  size.count_words = tiles * kSlabsPerTile;
  return size;
}

}  // namespace tpfuse
