#include "gemm/config.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <sstream>

#include "gemm/shared_storage.h"
#include "gemm/split_k.h"

namespace tpfuse {

namespace {

// Row tiles the CTAs of one wave share, all segments together: 32 measured best against 8 and 16
// for the plain GEMM (docs/EXPERIMENTS.md).
constexpr int kGroupRowsPerWave = 32;

// The config's own splits of K: each at least this many K blocks (a split's fixed costs, its
// pipeline's fill and its partial's round trip, weigh against a few K blocks: splits of 3-4 K
// blocks measured slower than none, of 6 and more faster; docs/EXPERIMENTS.md), at most this many
// splits (the last split adds all S partials).
constexpr int kMinKBlocksPerSplit = 10;
constexpr int kMaxSplits = 8;
// What splitting in S costs a step beyond its K blocks, in K blocks: its partial's round trip
// through the workspace, written and counted in (kSplitCostKBlocks), and the last split's reads of
// the S - 1 others (kSplitReadKBlocks each). A 64 x 256 slab's FP32 partial is 64 KB against 40 KB
// of operands a K block. At S = 2 the sum is 5 (M = 256, N = 6144, K = 2048 measured faster whole
// on 64 x 256 tiles than in two splits on 128 x 192); the reads make more splits dearer (at M = 512,
// N = 1024-1280, K = 6144-8192 128 x 192 tiles in 4-5 splits measured faster than 128 x 256 in 6-8;
// docs/EXPERIMENTS.md).
constexpr double kSplitCostKBlocks = 3;
constexpr double kSplitReadKBlocks = 2;
// Splits of 128-row tiles, measured where the epilogue stores the tiles: about this many K blocks
// more a step (a wave of 128 x 256 steps writes 17 MB of FP32 partials at once; at M = 2048 and 1024,
// N = 1024, K = 6144 splits in 2 and 4 cost 14 and 19.5 K blocks against the 5 and 9 above, and
// 128 x 128 tiles whole or in 2 splits measured 0.84x the time of 128 x 256 in 2 or 4:
// docs/EXPERIMENTS.md).
constexpr double kSplit128RowKBlocks = 10;
// Promoted E4M3 (no 128 x 256 variant): a 128 x 192 step's time over a 128 x 128 one's, under the
// 1.5x of its columns (more WGMMA work between two promotions; measured, docs/EXPERIMENTS.md).
constexpr double kPromoted192TileTime = 1.3;

// Relative time of a tile shape whose K loop of num_k_blocks is cut into `splits`: the waves of
// steps over the SMs times a step's cost, which grows with its columns plus a fixed part (pipeline
// fill and epilogue) worth about 32 columns, and with its K blocks plus, split, the partials' cost
// (the model's and the op's surcharge).
double relative_time(const TileGrid& grid, const DeviceInfo& device, int block_m, int block_n, int num_k_blocks,
                     int splits, const TileTraits& op) {
  const int64_t steps = grid.tiles(block_m, block_n) * splits;
  const int64_t waves = (steps + device.num_sms - 1) / device.num_sms;
  constexpr double kFixedCols = 32;
  double split_cost = 0;
  if (splits > 1) {
    split_cost = kSplitCostKBlocks + kSplitReadKBlocks * (splits - 1) + op.split_surcharge(block_m);
  }
  const double k_blocks = (num_k_blocks + splits - 1) / splits + split_cost;
  return double(waves) * (block_m / 128.0) * (block_n + kFixedCols) * k_blocks;
}

// The same where only the tiles past the last full wave are cut into `splits` (one wave of them
// after the full waves of whole tiles). Such a tail measured dearer than the model of split steps
// gives, by about kTailSplitKBlocks more for each further split (docs/EXPERIMENTS.md).
constexpr double kTailSplitKBlocks = 2.5;
double tail_split_time(const TileGrid& grid, const DeviceInfo& device, int block_m, int block_n, int num_k_blocks,
                       int splits) {
  const int64_t full_waves = grid.tiles(block_m, block_n) / device.num_sms;
  constexpr double kFixedCols = 32;
  const double tail_k_blocks = (num_k_blocks + splits - 1) / splits + kSplitCostKBlocks +
                               (kSplitReadKBlocks + kTailSplitKBlocks) * (splits - 1);
  return (block_m / 128.0) * (block_n + kFixedCols) * (double(full_waves) * num_k_blocks + tail_k_blocks);
}

// Whether tiles of block_m x block_n may cut K in `splits`: at most one wave of steps (the
// workspace holds a step per SM), a K block at least per split (and the schedule's 32-bit arithmetic).
bool can_split(const TileGrid& grid, const DeviceInfo& device, int block_m, int block_n, int num_k_blocks,
               int splits) {
  return splits == 1 || (grid.tiles(block_m, block_n) * splits <= device.num_sms && splits <= num_k_blocks &&
                         int64_t(splits) * num_k_blocks < (int64_t(1) << 31));
}

// The splits for tiles of block_m x block_n: overrides.split_k's, or the fastest the config allows
// (fewest where they tie); 1 where num_k_blocks is 0 (K never split). 0 where the forced ones cannot.
int splits_for(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides, int block_m,
               int block_n, int num_k_blocks, const TileTraits& op) {
  if (num_k_blocks == 0) return 1;
  if (overrides.split_k != 0) {
    return can_split(grid, device, block_m, block_n, num_k_blocks, overrides.split_k) ? overrides.split_k : 0;
  }
  int best = 1;
  for (int splits = 2; splits <= kMaxSplits && splits * kMinKBlocksPerSplit <= num_k_blocks; ++splits) {
    if (!can_split(grid, device, block_m, block_n, num_k_blocks, splits)) break;  // more tiles' steps than SMs
    if (relative_time(grid, device, block_m, block_n, num_k_blocks, splits, op) <
        relative_time(grid, device, block_m, block_n, num_k_blocks, best, op)) {
      best = splits;
    }
  }
  return best;
}

// The splits of the tail past the last full wave of tiles of block_m x block_n that the model
// gives, where they beat whole tiles (1 where none does, where there is no such tail or where the
// splits are forced): at most one wave of the tail's steps, each split at least a few K blocks.
// 128-row tiles only: a split tail of 64 x 64 tiles (one consumer adding the partials alone)
// measured 1.22-1.29x the time of whole 64 x 128 ones (M = 512, N = 1280, K = 2048).
int tail_splits_for(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides, int block_m,
                    int block_n, int num_k_blocks, const TileTraits& op) {
  const int64_t tiles = grid.tiles(block_m, block_n);
  const int64_t tail = tiles % device.num_sms;
  if (overrides.split_k != 0 || block_m != 128 || tiles < device.num_sms || tail == 0) return 1;
  int best = 1;
  double best_time = relative_time(grid, device, block_m, block_n, num_k_blocks, 1, op);
  for (int splits = 2; splits <= kMaxSplits && splits * kMinKBlocksPerSplit <= num_k_blocks; ++splits) {
    if (tail * splits > device.num_sms || int64_t(splits) * num_k_blocks >= (int64_t(1) << 31)) break;
    const double t = tail_split_time(grid, device, block_m, block_n, num_k_blocks, splits);
    if (t < best_time) {
      best = splits;
      best_time = t;
    }
  }
  return best;
}

Status forced_splits_do_not_fit(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides,
                                int block_m, int block_n, int num_k_blocks) {
  return Status::InvalidArgument(
      "overrides.split_k = " + std::to_string(overrides.split_k) + " does not fit: " +
      std::to_string(grid.tiles(block_m, block_n)) + " tiles of " + std::to_string(block_m) + "x" +
      std::to_string(block_n) + " in that many splits are more steps than the device's " +
      std::to_string(device.num_sms) + " SMs, or than the " + std::to_string(num_k_blocks) + " K blocks");
}

// Whether `a` beats `b`, the best so far (ties go to the earlier). A split tail beats the others
// only by kTailMargin, and loses to them otherwise: the model's waves are coarse, and a close call
// keeps the tiles that measured well.
constexpr double kTailMargin = 0.95;
bool beats(const Candidate& a, const Candidate& b) {
  if (a.split_tail == b.split_tail) return a.time < b.time;
  if (a.split_tail) return a.time < kTailMargin * b.time;
  return !(b.time < kTailMargin * a.time);
}

// Whether some variant `op` takes is `block_n` wide.
bool takes_width(const TileTraits& op, int block_n) {
  for (const GemmVariant& v : kGemmVariants) {
    if (op.takes(v) && v.block_n == block_n) return true;
  }
  return false;
}

// Calls fn(candidate) for each of `tiles` that `op` may run, in their order, whole or split by the
// model (a forced width applies to the heights that list it): as the op runs it (its runs_as), and
// where the op may split a tail and the tile is whole, also with only the tiles of a last wave that
// leaves SMs idle split.
template <class Fn>
void for_each_candidate(const TileChoice& choice, const TileTraits& op, const std::vector<TileShape>& tiles,
                        Fn&& fn) {
  const TileGrid& grid = choice.grid;
  const DeviceInfo& device = choice.device;
  const ConfigOverrides& overrides = choice.overrides;
  const int num_k_blocks = choice.num_k_blocks;
  const auto listed = [&](int height, int width) {
    return std::any_of(tiles.begin(), tiles.end(),
                       [&](const TileShape& t) { return t.block_m == height && (width == 0 || t.block_n == width); });
  };
  const bool small_band = listed(128, /*any width*/ 0) && listed(64, 0);  // both heights: one small band
  for (const TileShape& t : tiles) {
    if (overrides.block_n != 0 && listed(t.block_m, overrides.block_n) && t.block_n != overrides.block_n) continue;
    const bool whole_only = t.whole_k && overrides.split_k == 0;
    const int s = whole_only ? 1 : splits_for(grid, device, overrides, t.block_m, t.block_n, num_k_blocks, op);
    if (s == 0) continue;
    const Candidate c{t.block_m, t.block_n, s, false,
                      relative_time(grid, device, t.block_m, t.block_n, std::max(num_k_blocks, 1), s, op)};
    fn(overrides.block_n == 0 && c.block_m == 64 && small_band ? op.runs_as(c, choice) : c);
    if (s == 1 && !whole_only && num_k_blocks > 0 && op.splits_tail()) {
      const int ts = tail_splits_for(grid, device, overrides, t.block_m, t.block_n, num_k_blocks, op);
      if (ts > 1) {
        fn(Candidate{t.block_m, t.block_n, ts, true,
                     tail_split_time(grid, device, t.block_m, t.block_n, num_k_blocks, ts)});
      }
    }
  }
}

// Among the variants at `block_m` rows that run here (`runs_here(i)`: compiled for the inputs, fitting
// the device), the width whose waves of steps take least time, a step's time by its width
// (the op's promoted_192_step_time for 192); ties to the wider. `wanted_n` where there is none.
template <class RunsHere>
int fastest_width_by_waves(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides,
                           int block_m, int wanted_n, int num_k_blocks, const TileTraits& op, RunsHere&& runs_here) {
  int best_n = wanted_n;
  double best_time = -1;
  for (int i = 0; i < kNumGemmVariants; ++i) {
    const GemmVariant& v = kGemmVariants[i];
    if (!runs_here(i) || v.block_m != block_m) continue;
    const int splits = splits_for(grid, device, overrides, v.block_m, v.block_n, num_k_blocks, op);
    if (splits == 0) continue;
    const int64_t steps = grid.tiles(v.block_m, v.block_n) * splits;
    const int64_t waves = (steps + device.num_sms - 1) / device.num_sms;
    const double step_time = (v.block_n == 192 ? op.promoted_192_step_time() : v.block_n / 128.0) / splits;
    const double time = double(waves) * step_time;
    if (best_time < 0 || time < best_time || (time == best_time && v.block_n > best_n)) {
      best_n = v.block_n;
      best_time = time;
    }
  }
  return best_n;
}

// The common choice: the best of the op's candidates by the model, then its variant.
Status select_config(const TileChoice& choice, const TileTraits& op, GemmConfig* config) {
  const TileGrid& grid = choice.grid;
  const DeviceInfo& device = choice.device;
  const ConfigOverrides& overrides = choice.overrides;
  const int num_k_blocks = choice.num_k_blocks;
  if (config == nullptr) return Status::InvalidArgument("config must not be null");
  if (device.cc_major != 9) {
    return Status::Unsupported("tpfuse's kernels need a Hopper GPU (compute capability 9.0); this one is " +
                               std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor));
  }
  TPFUSE_RETURN_IF_ERROR(validate(overrides));
  if (overrides.block_n == 64 && !takes_width(op, 64)) {
    return Status::InvalidArgument("overrides.block_n = 64: 64-wide tiles are the plain GEMM's and the register "
                                   "epilogue's only (the fused ops take 128, 192 or 256)");
  }
  // The tile this output wants: the best candidate by the model.
  const std::vector<TileShape> tiles = op.candidates(grid);
  Candidate wanted;
  for_each_candidate(choice, op, tiles, [&](const Candidate& c) {
    if (wanted.splits == 0 || beats(c, wanted)) wanted = c;
  });
  if (wanted.splits == 0) {
    return forced_splits_do_not_fit(grid, device, overrides, tiles.front().block_m, 256, num_k_blocks);
  }
  const int block_m = wanted.block_m, block_n = wanted.block_n;
  int splits = wanted.splits;
  bool split_tail = wanted.split_tail;
  // A single wave of 128 x 256 tiles (or of their splits): no tile's epilogue overlaps another's
  // mainloop anyway, and a fourth stage shortens the one mainloop more than staging the epilogue in
  // batches lengthens it; with more waves the batches cost more than the stage gains
  // (docs/EXPERIMENTS.md).
  const bool want_batches =
      block_m == 128 && block_n == 256 && !split_tail && grid.tiles(128, 256) * splits <= device.num_sms;

  // The best variant that fits: that tile and staging, else that tile, else any; deeper first. Where
  // no variant for these inputs has that tile (promoted E4M3 has no 128 x 256), the width whose waves
  // take least time (a partial last wave takes a whole step's time), else the nearest.
  const SmemByVariant& smem = op.smem();
  const auto compiled = [&](const GemmVariant& v) {
    return op.takes(v) && serves(v, grid.dtype, grid.accumulation, grid.scaling);
  };
  const auto runs_here = [&](int i) {
    return compiled(kGemmVariants[i]) && smem[i] <= size_t(device.max_smem_per_block);
  };
  const bool tile_compiled = std::any_of(std::begin(kGemmVariants), std::end(kGemmVariants), [&](const GemmVariant& v) {
    return compiled(v) && v.block_m == block_m && v.block_n == block_n;
  });
  // A forced width keeps the nearest one.
  const int run_n = tile_compiled || overrides.block_n != 0
                        ? block_n
                        : fastest_width_by_waves(grid, device, overrides, block_m, block_n, num_k_blocks, op, runs_here);
  int best = -1, best_rank = -1;
  for (int i = 0; i < kNumGemmVariants; ++i) {
    const GemmVariant& v = kGemmVariants[i];
    if (!runs_here(i)) continue;
    const bool same_tile = v.block_m == block_m && v.block_n == run_n;
    const bool same_staging = (v.staged_chunks > 0) == want_batches;
    const int width_closeness = tile_compiled ? 0 : 511 - std::abs(v.block_n - run_n);  // in 0..511
    const int rank = ((4 * same_tile + 2 * same_staging) * 512 + width_closeness) * 16 + v.stages;
    if (rank > best_rank) {
      best = i;
      best_rank = rank;
    }
  }
  if (best < 0) {
    const size_t least = *std::min_element(smem.begin(), smem.end());
    return Status::Unsupported("the GEMM tiles need at least " + std::to_string(least) +
                               " bytes of shared memory; the device allows " +
                               std::to_string(device.max_smem_per_block));
  }
  // Another tile than wanted (the device's shared memory): its own splits.
  const GemmVariant& chosen = kGemmVariants[best];
  if (chosen.block_m != block_m || chosen.block_n != block_n) {
    split_tail = false;
    splits = splits_for(grid, device, overrides, chosen.block_m, chosen.block_n, num_k_blocks, op);
    if (splits == 0) {
      return forced_splits_do_not_fit(grid, device, overrides, chosen.block_m, chosen.block_n, num_k_blocks);
    }
  }
  GemmConfig c;
  c.variant = best;
  c.split_k = splits;
  c.whole_tiles = split_tail ? split_plan(grid.tiles(block_m, block_n), splits, true, device.num_sms).whole_tiles : 0;
  c.num_ctas = device.num_sms;
  c.smem_bytes = smem[best];
  c.group_rows = group_rows_for(1, overrides);
  *config = c;
  return Status::Ok();
}

}  // namespace

std::string GemmConfig::to_string() const {
  const GemmVariant& v = tile();
  std::ostringstream os;
  os << "variant " << variant << ": tile " << v.block_m << "x" << v.block_n << "x" << block_k_of(v.dtype) << ", stages "
     << v.stages << ", staged chunks " << (v.staged_chunks > 0 ? std::to_string(v.staged_chunks) : std::string("all"))
     << ", split_k " << split_k << (whole_tiles > 0 ? " from tile " + std::to_string(whole_tiles) : std::string())
     << ", threads " << threads_of(v) << ", ctas " << num_ctas << ", group_rows "
     << group_rows << ", smem " << smem_bytes << " B";
  return os.str();
}

double TileTraits::promoted_192_step_time() const { return kPromoted192TileTime; }

double StoredTileTraits::split_surcharge(int block_m) const { return block_m == 128 ? kSplit128RowKBlocks : 0; }

std::vector<int> tile_heights(const TileGrid& grid, int64_t small_band_rows) {
  if (grid.rows_per_band <= 64) return {64};
  if (grid.bands == 1 && grid.rows_per_band <= small_band_rows) return {128, 64};
  return {128};
}

void add_wide_tiles(int height, std::vector<TileShape>* tiles) {
  tiles->push_back({height, 256});
  tiles->push_back({height, height == 128 ? 192 : 128});
}

void add_one_consumer_tiles(std::vector<TileShape>* tiles) {
  tiles->push_back({64, 64});
  tiles->push_back({64, 192, /*whole_k=*/true});
}

Candidate one_wave_of_128x128(const Candidate& c, const TileChoice& choice) {
  const TileGrid& grid = choice.grid;
  if (c.block_n == 192 || c.splits != 1 || grid.rows_per_band <= 128 || grid.rows_per_band > kSmallBandRows ||
      grid.tiles(128, 128) > choice.device.num_sms) {
    return c;
  }
  Candidate r = c;
  r.block_m = 128;
  r.block_n = 128;
  return r;
}

Status select_gemm_config(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides,
                          const TileTraits& op, GemmConfig* config) {
  return select_config({grid, /*num_k_blocks=*/0, device, overrides}, op, config);
}

Status select_split_k_gemm_config(const TileGrid& grid, int num_k_blocks, const DeviceInfo& device,
                                  const ConfigOverrides& overrides, const TileTraits& op, GemmConfig* config) {
  return select_config({grid, std::max(num_k_blocks, 1), device, overrides}, op, config);
}

int group_rows_for(int segments_in_flight, const ConfigOverrides& overrides) {
  if (overrides.group_rows > 0) return overrides.group_rows;
  // The CTAs at work at one time hold about ceil(CTAs / S) consecutive tiles of each of the S
  // segments: groups of 32 / S row tiles make them together the 32-row group that measured best.
  return std::max(1, kGroupRowsPerWave / std::max(1, segments_in_flight));
}

int swap_ab_rows(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides) {
  constexpr int kCols = 64;  // C's columns a tile
  // Where it measured faster than the tiled kernel (docs/EXPERIMENTS.md): up to 16 rows, and at any
  // m <= 64 a deep K (llama down_proj at K/P = 3584: 1.07-1.11x); at 32-64 rows and K of 12-32
  // blocks the tiled kernel's own choice was up to 10% faster.
  constexpr int kFewRows = 16;
  constexpr int64_t kDeepKBlocks = 48;
  if (problem.m > 64 || overrides.swap_ab == 0 || problem.dtype != kSwapAbDType) return 0;
  const bool tiles_forced = overrides.block_n != 0 || overrides.split_k != 0;
  const bool fills_sms = 2 * ((problem.n + kCols - 1) / kCols) >= device.num_sms;
  const int64_t k_blocks = k_blocks_of(problem.k_per_rank, problem.dtype);
  const bool faster = problem.m <= kFewRows || k_blocks >= kDeepKBlocks;
  if (overrides.swap_ab != 1 && (tiles_forced || !fills_sms || !faster)) return 0;
  for (const int rows : {8, 16, 32}) {
    if (problem.m <= rows) return rows;
  }
  return 64;
}

namespace {

// The plain GEMM's one band of up to this many rows gets 64-row tiles too: there 128-row tiles in
// splits of K left the column-parallel shapes at 0.63-0.83x cuBLAS's speed.
constexpr int kPlainGemmBandRows = 512;

// The plain GEMM's tile traits: every compiled variant, every tile of the table. Its epilogue stores
// its tiles (StoredTileTraits), on 128 x 128 tiles too on any band: whole or split, they measured
// faster where they make about a wave that 128 x 256 tiles make only in splits (M = 2048, N = 1024,
// K = 6144).
class PlainGemmTiles final : public StoredTileTraits {
 public:
  const SmemByVariant& smem() const override {
    static constexpr SmemByVariant kSmem = smem_bytes_by_variant<NoOpSync>();
    return kSmem;
  }
  bool takes(const GemmVariant&) const override { return true; }
  std::vector<TileShape> candidates(const TileGrid& grid) const override {
    std::vector<TileShape> tiles;
    for (const int height : tile_heights(grid, kPlainGemmBandRows)) {
      add_wide_tiles(height, &tiles);
      if (height == 128) tiles.push_back({128, 128});
      if (height == 64) add_one_consumer_tiles(&tiles);
    }
    return tiles;
  }
  // Up to kSmallBandRows rows, one wave of 128 x 128 tiles as the reduce-scatter's shared tiles
  // (one_wave_of_128x128). Above, given 64 x 256 tiles (whole or split), where 128-row tiles would
  // not hold more rows past the band than they do: 128 x 128 tiles with their own splits, which load
  // a quarter fewer bytes a step (measured faster on every such shape, docs/PERFORMANCE.md).
  Candidate runs_as(const Candidate& c, const TileChoice& choice) const override {
    const TileGrid& grid = choice.grid;
    if (grid.rows_per_band <= kSmallBandRows) return one_wave_of_128x128(c, choice);
    const int64_t last_rows = grid.rows_per_band % 128;
    if (c.block_n != 256 || (last_rows != 0 && last_rows <= 64)) return c;
    const int splits =
        splits_for(grid, choice.device, choice.overrides, 128, 128, choice.num_k_blocks, *this);
    return splits == 0 ? c : Candidate{128, 128, splits, false, c.time};
  }
};

}  // namespace

Status select_plain_gemm_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                                GemmConfig* config) {
  TileGrid grid;
  grid.rows_per_band = problem.m;
  grid.n = problem.n;
  grid.dtype = problem.dtype;
  grid.accumulation = problem.accumulation;
  grid.scaling = problem.scaling;
  const int64_t num_k_blocks = k_blocks_of(problem.k_per_rank, problem.dtype);
  return select_config({grid, std::max(int(num_k_blocks), 1), device, overrides}, PlainGemmTiles(), config);
}

}  // namespace tpfuse
