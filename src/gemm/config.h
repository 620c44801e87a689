// The GEMM's config choice: a pure function of how an op cuts its output into tiles and of the
// device, over the table of compiled variants (gemm/variants.h), so it is testable on a CPU and
// every choice prints itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device_info.h"
#include "gemm/variants.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// How an op cuts its output into tiles: `bands` bands of `rows_per_band` rows, n columns; a tile
// never crosses a band (the last row tile of a band is clipped to it).
struct TileGrid {
  int64_t bands = 1;
  int64_t rows_per_band = 0;
  int64_t n = 0;
  DType dtype = DType::kBF16;  // the inputs': only variants of it are taken

  int64_t tiles(int block_m, int block_n) const {
    return bands * ((rows_per_band + block_m - 1) / block_m) * ((n + block_n - 1) / block_n);
  }
};

struct GemmConfig {
  int variant = 0;       // index into kGemmVariants
  int split_k = 1;       // splits of each tile's K loop, a step each (gemm/split_k.h); 1: a step a tile
  int whole_tiles = 0;   // with split_k > 1: the tiles before this one whole, the rest (the tail past
                         // the last full wave of num_ctas) split; 0: every tile split
  int num_ctas = 0;      // persistent grid size (at most one CTA per SM)
  int group_rows = 32;   // raster group (gemm/raster.h): row tiles visited together for L2 reuse
  size_t smem_bytes = 0; // dynamic shared memory of a launch (the op's storage, gemm/shared_storage.h)

  const GemmVariant& tile() const { return kGemmVariants[variant]; }
  std::string to_string() const;
};

// Dynamic shared memory an op's kernel needs, for each variant (smem_bytes_by_variant<OpSync>()).
using SmemByVariant = std::array<size_t, kNumGemmVariants>;

// Picks the variant for an output cut as `grid`: 64-row tiles for bands of at most 64 rows, else
// 128-row tiles, 256 or 192 wide (whichever leaves fewer SMs idle in the last wave, or
// overrides.block_n), a fourth stage for a single wave of 128 x 256 tiles; the deepest compiled
// variant of that tile that fits the device's shared memory, else any that fits. Fails (never
// aborts) on a device that is not Hopper or where no variant fits. Sets every field but group_rows.
// Never splits K (split_k = 1): for an op whose epilogue takes whole tiles.
Status select_gemm_config(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides,
                          const SmemByVariant& smem, GemmConfig* config);

// The variants an op's kernel is compiled for (gemm/variants.h): the fused ops' (two consumers),
// those and the 64-row tiles of one consumer (register_epilogue_takes), those and 128 x 128 tiles
// (storing_ops_take: an op whose epilogue stores its tiles as the plain GEMM does, the all-gather),
// or all (the plain GEMM's). The last two store their tiles, and only they may take a split tail
// (gemm/split_k.h) and 128 x 128 tiles on any band, by a split model measured on them; the others
// hand their tiles on whole (the reduce-scatter's pushes).
enum class Variants { kFusedOps, kWithOneConsumer, kStoringOps, kAll };

// The same for an op that can split K (gemm/split_k.h) over num_k_blocks K blocks: where a tile's
// steps would leave SMs idle, each tile's K loop in S splits, a step each, at most one wave of
// steps in all (so at most device.num_sms steps: the split workspace's size), each split at least
// a few K blocks, the tile and S the fastest by the same model of waves (or overrides.split_k:
// 1 never splits, S >= 2 splits in S and fails where that is more steps than SMs or than K blocks),
// over `variants`. Where those store their tiles (kStoringOps, kAll) the 128-row tiles may also be
// 128 wide on any band, and with no forced splits, where the tiles take more than a wave and the
// last one leaves SMs idle, the tiles of that last wave alone may be split instead (whole_tiles >
// 0), by the same model.
Status select_split_k_gemm_config(const TileGrid& grid, int num_k_blocks, const DeviceInfo& device,
                                  const ConfigOverrides& overrides, const SmemByVariant& smem, Variants variants,
                                  GemmConfig* config);

// Row tiles per raster group when the CTAs at work at one time hold tiles of `segments_in_flight`
// row segments (1 for the plain GEMM, P for the reduce-scatter's rounds), or overrides.group_rows.
int group_rows_for(int segments_in_flight, const ConfigOverrides& overrides);

// The plain GEMM's kernel for m <= 64 (gemm/swap_ab.cuh): the rows of A a stage holds (m rounded up
// to 8, 16, 32 or 64), or 0 where the tiled kernel runs. The config's choice: at least half the
// SMs' worth of 64-column tiles, m <= 16 or (m <= 64) K of 48 blocks or more, neither block_n nor
// split_k forced; overrides.swap_ab 1 takes it wherever m <= 64, 0 never.
int swap_ab_rows(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides);

// The plain GEMM's config: the whole m x n output as one band, K split where that fills the SMs.
Status select_plain_gemm_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                                GemmConfig* config);

}  // namespace tpfuse
