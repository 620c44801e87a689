// The reduce-scatter's layout of a rank's workspace, one parity half (comm/communicator.h), sized
// for the largest problem the communicator serves:
//   data:   recv[source rank][rows_per_rank][n]     BF16: each peer's partial of this rank's rows
//   flags:  [source rank][tile of a band][slab]     u32 epoch values: that partial has landed
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

// Flags are sized for the most tiles any variant the op takes cuts a band into: a band is a segment,
// or all of them where segments are shorter than a slab (ops/gemm_rs/schedule.h).
inline WorkspaceSize gemm_rs_workspace(const CommunicatorOptions& options, int world_size) {
  int min_block_m = kGemmVariants[0].block_m, min_block_n = kGemmVariants[0].block_n;
  for (const GemmVariant& v : kGemmVariants) {
    if (!PushReduceSync::takes(v)) continue;
    min_block_m = std::min(min_block_m, v.block_m);
    min_block_n = std::min(min_block_n, v.block_n);
  }
  const int64_t rows = options.max_m / world_size;
  const int64_t band_rows = std::max(rows, std::min(options.max_m, int64_t(kSlabRows) * world_size));
  const size_t tiles =
      size_t((band_rows + min_block_m - 1) / min_block_m) * size_t((options.max_n + min_block_n - 1) / min_block_n);
  constexpr size_t kSlabsPerTile = kConsumers;
  WorkspaceSize size;
  // The partials are the GEMM's outputs: kOutputDType whatever the inputs.
  size.data_bytes = size_t(world_size) * size_t(rows) * size_t(options.max_n) * element_bytes(kOutputDType);
  size.flag_words = size_t(world_size) * tiles * kSlabsPerTile;
  return size;
}

}  // namespace tpfuse
