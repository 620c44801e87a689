// ConfigOverrides: the tunables of the config choice, for experiments. Pure C++.
#pragma once

#include <string>

#include "tpfuse/status.h"

namespace tpfuse {

// A field left at its default keeps the config's own choice. The benchmark sets these from its
// flags and the tests from their parameters, so that variants compare within one process.
struct ConfigOverrides {
  int block_n = 0;          // tile width: 128, 192 or 256 for 128-row tiles, 128 or 256 for 64-row ones (64 and
                            // 192 too in the plain GEMM and the reduce-scatter's register epilogue; the other
                            // height keeps its own choice); 0: the config's
  int group_rows = 0;       // row tiles per raster group; 0: the config's choice
  // gemm, all_gather_gemm, and gemm_reduce_scatter where its tiles are shared (shared_tiles below):
  int split_k = 0;          // 0: the config's choice, 1: never split K, S >= 2: each tile's K loop in S splits
  // gemm only, at m <= 64: the kernel that computes C^T = W^T A^T (W on the WGMMA's 64-row side, A's
  // rows on its narrow one); 1 wherever m <= 64, 0 never, -1: the config's (a forced block_n or
  // split_k means the tiled kernel)
  int swap_ab = -1;
  // gemm_reduce_scatter only:
  int own_lag = -1;         // rounds from a peer's tile to the own tile of the same rows; -1: the config's
  int partial_rounds = -1;  // at most this many rounds of an own tile's partials in its K loop; -1: the config's
  // gemm_reduce_scatter and all_gather_gemm: tiles of several ranks' rows where a rank's rows are shorter
  // than a slab (the all-gather also at 64 rows: bands of two blocks); 1 yes, 0 no; -1: the config's
  int shared_tiles = -1;
  // gemm_reduce_scatter with shared tiles: their slabs pushed and reduced from the consumers' registers
  // (1: at any rows a rank), or staged and sent by TMA (0); -1: the config's (registers where m <= 64)
  int register_epilogue = -1;
  // all_gather_gemm only: where a call leaves CTAs without a tile, they alone copy X_r to the peers;
  // 1 whenever there is one, 0 never (every CTA copies beside its tiles), -1: the config's
  int idle_copiers = -1;

  std::string to_string() const;  // the fields that are set, e.g. "own_lag=0"; "none" when none is
};

// Checks the ranges; the message names the bad field and its value.
Status validate(const ConfigOverrides& overrides);

}  // namespace tpfuse
