#include "ops/ag_gemm/config.h"

#include "gemm/shared_storage.h"
#include "ops/ag_gemm/shared_storage.h"

namespace tpfuse {
namespace {

// The all-gather's tile traits: its epilogue stores its tiles as the plain GEMM's does
// (StoredTileTraits), on the fused ops' variants and their 128 x 128 tiles on any band.
class AllGatherTiles final : public StoredTileTraits {
 public:
  // The kernel's shared memory is the plain GEMM's and the copier's staging ring (its waits are on
  // flags in global memory).
  const SmemByVariant& smem() const override {
    static constexpr SmemByVariant kSmem = smem_bytes_by_variant<CopyStages>();
    return kSmem;
  }
  bool takes(const GemmVariant& v) const override { return storing_ops_take(v); }
  std::vector<TileShape> candidates(const TileGrid& grid) const override {
    std::vector<TileShape> tiles;
    for (const int height : tile_heights(grid, kSmallBandRows)) {
      add_wide_tiles(height, &tiles);
      if (height == 128) tiles.push_back({128, 128});
    }
    return tiles;
  }
};

}  // namespace

Status select_all_gather_config(const AllGatherProblem& problem, const DeviceInfo& device,
                                const ConfigOverrides& overrides, AllGatherConfig* config) {
  if (config == nullptr) return Status::InvalidArgument("config must not be null");
  // The GEMM variant and splits for bands of G blocks. Where the tiles fill few SMs, their K loops
  // may be split, as the plain GEMM's; the CTAs at work at one time are in one band (or two), the
  // bands one after another (in one wave of one-row bands, side by side: schedule.h). Where they take
  // more than a wave, the last wave's tiles alone may be split (the last bands' tiles).
  const int64_t rows = problem.rows_per_rank();
  const int p = problem.world_size;
  const int64_t num_k_blocks = k_blocks_of(problem.k, problem.dtype);
  const auto with_bands_of = [&](int sources_per_band, AllGatherConfig* c) -> Status {
    c->sources_per_band = sources_per_band;
    TileGrid grid;
    grid.bands = p / sources_per_band;
    grid.rows_per_band = rows * sources_per_band;
    grid.n = problem.n_per_rank;
    grid.dtype = problem.dtype;
    grid.accumulation = problem.accumulation;
    grid.scaling = problem.scaling;
    TPFUSE_RETURN_IF_ERROR(
        select_split_k_gemm_config(grid, int(num_k_blocks), device, overrides, AllGatherTiles(), &c->gemm));
    c->gemm.group_rows = group_rows_for(1, overrides);
    return Status::Ok();
  };
  AllGatherConfig one;
  const Status one_status = with_bands_of(1, &one);
  // Blocks of 64 rows: bands of two, 128-row tiles (W read half as often as by 64-row tiles of one
  // block), where those tiles, 192 wide, make half a wave or more: with fewer, 64-row tiles of one
  // block with their own splits of K measured faster (docs/EXPERIMENTS.md). Not where bands of one
  // block make one wave: their steps then go down the bands as the plain GEMM's raster
  // (ops/ag_gemm/schedule.h), which measured faster than bands of two; except where those would be
  // 64 x 256 tiles and bands of two take 128 x 128 ones (a quarter fewer bytes a step, as the plain
  // GEMM's one band of 512 rows; measured faster, docs/EXPERIMENTS.md). With P = 2 a band of two
  // would leave no tile to multiply before a peer's block has landed. Blocks of fewer rows: one band
  // of all blocks, so that a tile's rows are not mostly past its block's end. A tile waits for every
  // peer's block it holds.
  int sources_per_band = 1;
  AllGatherConfig two;  // bands of two, where the choice below needed them already
  bool two_chosen = false;
  if (overrides.shared_tiles != 0 && p > 1) {
    TileGrid pairs;
    pairs.bands = p / 2;
    pairs.rows_per_band = 2 * rows;
    pairs.n = problem.n_per_rank;
    pairs.dtype = problem.dtype;
    pairs.accumulation = problem.accumulation;
    pairs.scaling = problem.scaling;
    const bool one_wave = one_status.ok() && AllGatherSchedule(all_gather_shape(problem, one, 0)).bands_interleaved();
    if (rows < kSlabRows) {
      sources_per_band = p;
    } else if (rows == kSlabRows && p >= 4 && p % 2 == 0) {
      const bool wide_pairs = 2 * pairs.tiles(128, 192) >= device.num_sms && !one_wave;
      const bool one_wide = one_status.ok() && one.gemm.tile().block_m == 64 && one.gemm.tile().block_n == 256;
      const bool two_narrow = one_wide && with_bands_of(2, &two).ok() && two.gemm.tile().block_m == 128 &&
                              two.gemm.tile().block_n == 128;
      if (overrides.shared_tiles == 1 || wide_pairs || two_narrow) sources_per_band = 2;
      two_chosen = two_narrow;
    }
  }
  AllGatherConfig c = one;
  if (sources_per_band == 1) {
    TPFUSE_RETURN_IF_ERROR(one_status);
  } else if (two_chosen) {
    c = two;
  } else {
    TPFUSE_RETURN_IF_ERROR(with_bands_of(sources_per_band, &c));
  }
  c.idle_copiers = overrides.idle_copiers;
  *config = c;
  return Status::Ok();
}

AllGatherShape all_gather_shape(const AllGatherProblem& problem, const AllGatherConfig& config, int rank) {
  AllGatherShape shape;
  shape.world_size = problem.world_size;
  shape.rank = rank;
  shape.m = int(problem.m);
  shape.n = int(problem.n_per_rank);
  shape.block_m = config.gemm.tile().block_m;
  shape.block_n = config.gemm.tile().block_n;
  shape.group_rows = config.gemm.group_rows;
  shape.num_splits = config.gemm.split_k;
  shape.whole_tiles = config.gemm.whole_tiles;
  shape.sources_per_band = config.sources_per_band;
  shape.num_ctas = config.gemm.num_ctas;
  return shape;
}

}  // namespace tpfuse
