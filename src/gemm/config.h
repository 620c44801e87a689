// The GEMM's config choice: a pure function of how an op cuts its output into tiles and of the
// device, over the table of compiled variants (gemm/variants.h), so it is testable on a CPU and
// every choice prints itself.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

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
  Accumulation accumulation = Accumulation::kPromoted;  // E4M3 inputs': only variants of it are taken
  Scaling scaling = Scaling::kNone;                     // E4M3 inputs': blockwise only on its variants

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

// A tile an op may run: its shape, and whether its K loop stays whole where the splits are not
// forced (overrides.split_k).
struct TileShape {
  int block_m = 0;
  int block_n = 0;
  bool whole_k = false;
};

// A tile the choice weighs: its shape, its splits of K (split_tail: only the tiles past the last
// full wave are split), and its time by the model.
struct Candidate {
  int block_m = 0;
  int block_n = 0;
  int splits = 0;
  bool split_tail = false;
  double time = 0;
};

// What a choice is about: an output cut as `grid`, its K loop of num_k_blocks (0: never split), the
// device and the overrides.
struct TileChoice {
  const TileGrid& grid;
  int num_k_blocks;
  const DeviceInfo& device;
  const ConfigOverrides& overrides;
};

// An op's part in the choice of its GEMM config (its tile traits): the compiled variants its
// kernel takes and their shared memory, the tiles it may run, and its hooks into the model's costs.
// The choice weighs each candidate by one model of waves (gemm/config.cpp) through these. Each op's
// config defines its own; the plain GEMM's is in gemm/config.cpp.
class TileTraits {
 public:
  virtual ~TileTraits() = default;
  // The dynamic shared memory of its kernel, for each variant (smem_bytes_by_variant<OpSync>()).
  virtual const SmemByVariant& smem() const = 0;
  // Whether it runs variant v (one its kernel is compiled for, gemm/variants.h).
  virtual bool takes(const GemmVariant& v) const = 0;
  // The tiles it may run on `grid`, the taller first and each height's widest first (ties go to the
  // earlier); a forced width (overrides.block_n) applies to the heights that list it.
  virtual std::vector<TileShape> candidates(const TileGrid& grid) const = 0;
  // K blocks a split step of a block_m-row tile costs beyond the model's own (its epilogue's part).
  virtual double split_surcharge(int /*block_m*/) const { return 0; }
  // Whether the tiles past the last full wave alone may be split, the others whole.
  virtual bool splits_tail() const { return false; }
  // The tile a weighed 64-row candidate runs as where the output is one small band (both heights
  // among the candidates) and the width is not forced: another where it measured faster than the
  // model gives.
  virtual Candidate runs_as(const Candidate& c, const TileChoice& /*choice*/) const { return c; }
  // Promoted E4M3 (no 128 x 256 variant): a 128 x 192 step's time over a 128 x 128 one's, by which the
  // compiled width whose waves take least time is picked. The plain GEMM's by default.
  virtual double promoted_192_step_time() const;
};

// The hooks of an op whose epilogue stores its tiles as the plain GEMM's does (the plain GEMM, the
// all-gather): splits of 128-row tiles cost more than the model's, and a split tail may be taken.
class StoredTileTraits : public TileTraits {
 public:
  double split_surcharge(int block_m) const override;
  bool splits_tail() const override { return true; }
};

// One band of up to kSmallBandRows rows may take 64-row tiles too (small M: more CTAs on W).
constexpr int kSmallBandRows = 256;

// The tile heights an output may take: 64 for bands of at most 64 rows, which would waste most of
// a 128-row tile (the two consumers then split the columns instead of the rows); 128 and 64 for one
// band of at most `small_band_rows`; else 128.
std::vector<int> tile_heights(const TileGrid& grid, int64_t small_band_rows);

// Every op's widths of a height: 256, then 192 for 128-row tiles (where 256-wide ones would leave
// SMs idle in the last wave, M = 512, N = 6144, or where their splits of K fill the SMs better) and
// 128 for 64-row ones (twice the CTAs on W, where that beats splits of K).
void add_wide_tiles(int height, std::vector<TileShape>* tiles);

// The 64-row tiles of one consumer, for an epilogue that hands no slab on (the plain GEMM's, the
// reduce-scatter's from registers): 64 x 64 (four times the CTAs on W without splitting K) and
// 64 x 192 whole (split, its one consumer adds the partials alone: in 2 splits it measured 1.31x
// the time of 64 x 128 whole at M = 128, N = 6144, K = 2048).
void add_one_consumer_tiles(std::vector<TileShape>* tiles);

// A whole 64-row candidate on one band of 129 .. kSmallBandRows rows streaming W: 128 x 128 tiles in
// one wave instead, two row tiles, so that each CTA loads fewer bytes (a fifth fewer than 64 x 256
// at M = 256; measured faster at M = 192, 200 and 256); not for 64 x 192, which loads as few bytes
// a CTA on more CTAs. `c` elsewhere.
Candidate one_wave_of_128x128(const Candidate& c, const TileChoice& choice);

// Picks the variant for an output cut as `grid`, the best of `op`'s candidate tiles by the model:
// the fewest waves of the cheapest steps (or overrides.block_n's width), a fourth stage for a single
// wave of 128 x 256 tiles; the deepest compiled variant of that tile that fits the device's shared
// memory, else any that fits. Fails (never aborts) on a device that is not Hopper or where no
// variant fits. Sets every field but group_rows. Never splits K (split_k = 1): for an op whose
// epilogue takes whole tiles.
Status select_gemm_config(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides,
                          const TileTraits& op, GemmConfig* config);

// The same for an op that can split K (gemm/split_k.h) over num_k_blocks K blocks: where a tile's
// steps would leave SMs idle, each tile's K loop in S splits, a step each, at most one wave of
// steps in all (so at most device.num_sms steps: the split workspace's size), each split at least
// a few K blocks, the tile and S the fastest by the same model of waves (or overrides.split_k:
// 1 never splits, S >= 2 splits in S and fails where that is more steps than SMs or than K blocks).
// Where the op's hooks allow (splits_tail), with no forced splits, where the tiles take more than
// a wave and the last one leaves SMs idle, the tiles of that last wave alone may be split instead
// (whole_tiles > 0), by the same model.
Status select_split_k_gemm_config(const TileGrid& grid, int num_k_blocks, const DeviceInfo& device,
                                  const ConfigOverrides& overrides, const TileTraits& op, GemmConfig* config);

// Row tiles per raster group when the CTAs at work at one time hold tiles of `segments_in_flight`
// row segments (1 for the plain GEMM, P for the reduce-scatter's rounds), or overrides.group_rows.
int group_rows_for(int segments_in_flight, const ConfigOverrides& overrides);

// The inputs' dtype the plain GEMM's swap-AB kernel is compiled for.
constexpr DType kSwapAbDType = DType::kBF16;

// The plain GEMM's kernel for m <= 64 (gemm/swap_ab.cuh): the rows of A a stage holds (m rounded up
// to 8, 16, 32 or 64), or 0 where the tiled kernel runs. The config's choice: at least half the
// SMs' worth of 64-column tiles, m <= 16 or (m <= 64) K of 48 blocks or more, neither block_n nor
// split_k forced; overrides.swap_ab 1 takes it wherever m <= 64, 0 never; inputs of another dtype
// than kSwapAbDType never.
int swap_ab_rows(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides);

// The plain GEMM's config: the whole m x n output as one band, K split where that fills the SMs.
Status select_plain_gemm_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                                GemmConfig* config);

}  // namespace tpfuse
