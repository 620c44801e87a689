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

  int64_t tiles(int block_m, int block_n) const {
    return bands * ((rows_per_band + block_m - 1) / block_m) * ((n + block_n - 1) / block_n);
  }
};

struct GemmConfig {
  int variant = 0;       // index into kGemmVariants
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
Status select_gemm_config(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides,
                          const SmemByVariant& smem, GemmConfig* config);

// Row tiles per raster group when the CTAs at work at one time hold tiles of `segments_in_flight`
// row segments (1 for the plain GEMM, P for the reduce-scatter's rounds), or overrides.group_rows.
int group_rows_for(int segments_in_flight, const ConfigOverrides& overrides);

// The plain GEMM's config: the whole m x n output as one band.
Status select_plain_gemm_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                                GemmConfig* config);

}  // namespace tpfuse
