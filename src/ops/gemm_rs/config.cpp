#include "ops/gemm_rs/config.h"

#include <algorithm>
#include <sstream>

#include "gemm/shared_storage.h"
#include "ops/gemm_rs/partial_rounds.h"
#include "ops/gemm_rs/shared_storage.h"

namespace tpfuse {

namespace {

// Shared tiles move their slabs from the consumers' registers where the band of all segments is
// one slab of rows (m <= 64: at most 8 rows a segment at P = 8, 16 at P = 4, 32 at P = 2); on
// taller bands the staged epilogue measured faster (docs/EXPERIMENTS.md).
constexpr int64_t kMaxRegisterEpilogueM = kSlabRows;

// Own tiles stay last where a tile is this deep: its pushes are few next to its multiply, and the
// lag only costs balance (docs/EXPERIMENTS.md).
constexpr int64_t kMaxLaggedK = 4096;

// Rounds of an own tile's peer partials that config `c` adds during the K loop: a round per peer,
// as many as the K loop holds. None where
//  - a band has several segments: the partners compute the shared tile at the same step and push
//    this rank's rows of it only after their K loops, so a round waiting for them there would deadlock;
//  - the epilogue stages a slab in batches: a round is a whole slab in the chunk buffers;
//  - own tiles come last at P = 2, where they are half the tiles: there the rounds measured slower;
//  - the inputs are scaled (E4M3): a partial must be scaled before its peers' are added to it, and
//    it is scaled once its K loop is done.
int partial_rounds_of(const Problem& problem, const GemmRsConfig& c) {
  const TileSchedule schedule(schedule_shape(problem, c, 0));
  const bool own_last = c.own_lag >= schedule.tiles_per_band();
  if (problem.world_size == 1 || c.segments_per_tile != 1 || c.gemm.tile().staged_chunks > 0 ||
      (own_last && problem.world_size < 4) || problem.dtype != DType::kBF16) {
    return 0;
  }
  const int num_k_blocks = int(k_blocks_of(problem.k_per_rank, problem.dtype));
  return partial_rounds_that_fit(num_k_blocks, kConsumers, problem.world_size - 1);
}

// The reduce-scatter's tile traits. Its epilogue hands whole tiles on (no split tail; K split only
// in shared tiles, at the model's cost): the fused ops' variants, and with the register epilogue
// also the 64-row tiles of one consumer, as the plain GEMM. 128 x 128 tiles at M <= kSmallBandRows,
// where they make one wave that wider ones leave part-idle (measured there only), and in one band
// of shared tiles of 129 .. kSmallBandRows rows where the model gives 64-row ones. Only 64-row tiles
// where a 128-row one could hold rows of two sequences (slab_tiles: its A would be two boxes).
class GemmRsTiles final : public TileTraits {
 public:
  GemmRsTiles(bool register_epilogue, bool slab_tiles)
      : register_epilogue_(register_epilogue), slab_tiles_(slab_tiles) {}

  const SmemByVariant& smem() const override { return gemm_rs_smem_bytes(); }
  bool takes(const GemmVariant& v) const override {
    return register_epilogue_ ? register_epilogue_takes(v) : fused_ops_take(v);
  }
  std::vector<TileShape> candidates(const TileGrid& grid) const override {
    std::vector<TileShape> tiles;
    const std::vector<int> heights = slab_tiles_ ? std::vector<int>{kSlabRows} : tile_heights(grid, kSmallBandRows);
    for (const int height : heights) {
      add_wide_tiles(height, &tiles);
      if (height == 128 && grid.bands * grid.rows_per_band <= kSmallBandRows) tiles.push_back({128, 128});
      if (height == 64 && register_epilogue_) add_one_consumer_tiles(&tiles);
    }
    return tiles;
  }
  Candidate runs_as(const Candidate& c, const TileChoice& choice) const override {
    return one_wave_of_128x128(c, choice);
  }
  // A step pushes or reduces its tile too, so a 192-wide one costs nearer the 1.5x of its columns
  // than the plain GEMM's (measured over M = 2048-32768 at P = 8, docs/EXPERIMENTS.md).
  double promoted_192_step_time() const override { return 1.42; }

 private:
  bool register_epilogue_;
  bool slab_tiles_;
};

}  // namespace

const SmemByVariant& gemm_rs_smem_bytes() {
  static constexpr SmemByVariant kSmem = smem_bytes_by_variant<PushReduceSync>();
  return kSmem;
}

std::string GemmRsConfig::to_string() const {
  std::ostringstream os;
  os << gemm.to_string() << ", segments/tile " << segments_per_tile
     << (shared_tiles ? (register_epilogue ? " (shared tiles, register epilogue)" : " (shared tiles)") : "")
     << ", own_lag "
     << (own_lag >= kOwnTilesLast ? std::string("last") : std::to_string(own_lag)) << ", partial rounds "
     << partial_rounds;
  return os.str();
}

ScheduleShape schedule_shape(const Problem& problem, const GemmRsConfig& c, int rank) {
  ScheduleShape shape;
  shape.world_size = problem.world_size;
  shape.rank = rank;
  shape.m = int(problem.m);
  shape.n = int(problem.n);
  shape.block_m = c.gemm.tile().block_m;
  shape.block_n = c.gemm.tile().block_n;
  shape.group_rows = c.gemm.group_rows;
  shape.own_lag = c.own_lag;
  shape.segments_per_tile = c.segments_per_tile;
  shape.num_splits = c.shared_tiles ? c.gemm.split_k : 1;
  return shape;
}

Status select_gemm_rs_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                             GemmRsConfig* config) {
  if (config == nullptr) return Status::InvalidArgument("config must not be null");
  GemmRsConfig c;
  // Segments shorter than a slab (decode-sized M) whose rows divide it: one band of all segments, its
  // tiles holding several owners' rows, so that W is read once, not once a segment (schedule.h). The
  // epilogue moves a segment's rows as one TMA box inside a slab (ops/gemm_rs/epilogue.cuh).
  // Segments of 64 rows (M = 512 at P = 8): 128-row tiles over two ranks' segments, one slab each,
  // take one wave where 64-row tiles take two. With P = 2 the only band would be the own one, every
  // tile half reduced and half pushed at the same step on both ranks.
  const bool share_tiles = problem.world_size > 1 && problem.rows_per_rank() < kSlabRows &&
                           kSlabRows % problem.rows_per_rank() == 0 && overrides.shared_tiles != 0;
  const bool pair_segments = problem.rows_per_rank() == 64 && problem.world_size >= 4;
  // Several sequences (tpfuse/problem.h) whose shards are not whole 128-row tiles: a tile loads its
  // rows of A as one box, so it must not run into the next shard (ops/gemm_rs/epilogue.cuh, a_load).
  const bool slab_tiles =
      problem.batch > 1 && problem.world_size > 1 && (problem.rows_per_rank() / problem.batch) % 128 != 0;
  // Shared tiles pushed and reduced from the consumers' registers (shared_tiles.cuh), which may take
  // the one-consumer 64-row tiles as the plain GEMM does.
  bool register_epilogue = share_tiles && problem.m <= kMaxRegisterEpilogueM;
  if (overrides.register_epilogue >= 0) register_epilogue = share_tiles && overrides.register_epilogue == 1;
  const int first_choice = share_tiles ? problem.world_size : pair_segments ? 2 : 1;
  for (c.segments_per_tile = first_choice;; c.segments_per_tile = 1) {
    TileGrid grid;
    grid.bands = problem.world_size / c.segments_per_tile;
    grid.rows_per_band = problem.rows_per_rank() * c.segments_per_tile;
    grid.n = problem.n;
    grid.dtype = problem.dtype;
    grid.accumulation = problem.accumulation;
    grid.scaling = problem.scaling;
    // Shared tiles may split K as the plain GEMM does (their tiles fill few SMs); the others take
    // whole tiles.
    if (share_tiles) {
      const int64_t num_k_blocks = k_blocks_of(problem.k_per_rank, problem.dtype);
      TPFUSE_RETURN_IF_ERROR(select_split_k_gemm_config(grid, int(num_k_blocks), device, overrides,
                                                        GemmRsTiles(register_epilogue, false), &c.gemm));
    } else {
      TPFUSE_RETURN_IF_ERROR(select_gemm_config(grid, device, overrides,
                                                GemmRsTiles(/*register_epilogue=*/false, slab_tiles), &c.gemm));
    }
    // A band of two segments needs 128-row tiles; a device that fits none takes bands of one.
    if (share_tiles || c.segments_per_tile == 1 || c.gemm.tile().block_m == 128) break;
  }
  // Where no 64-row tile fits the device's shared memory, or none is compiled for the inputs' dtype,
  // the choice is another tile: refused, not run wrong.
  if (slab_tiles && c.gemm.tile().block_m != kSlabRows) {
    return Status::Unsupported("a shard of " + std::to_string(problem.rows_per_rank() / problem.batch) +
                               " rows a sequence needs 64-row tiles, and none of " + to_string(problem.dtype) +
                               " inputs is compiled or fits this device's shared memory");
  }
  c.shared_tiles = share_tiles;
  c.register_epilogue = register_epilogue;
  // The CTAs at work at one time hold tiles of every segment (the schedule's rounds).
  c.gemm.group_rows = group_rows_for(problem.world_size, overrides);

  // Own tiles interleaved about two waves of steps behind the peers' tiles of the same rows (a
  // round holds a tile of each of the B bands, so L rounds are about L * B steps; schedule.h): the
  // pushes then keep the links busy for the whole call, not only until the own tiles start. Own
  // tiles stay last where a tile is deep (kMaxLaggedK), and where a band has fewer than 2L tiles
  // (interleaved into so few waves, some CTAs would take two own tiles where others take none); at
  // P = 2, where own tiles are half of the tiles and last they leave the links idle for half the
  // call, fewer than L tiles. The measurements are in docs/EXPERIMENTS.md.
  c.own_lag = kOwnTilesLast;
  const TileSchedule last(schedule_shape(problem, c, 0));
  const int lag = (2 * c.gemm.num_ctas + last.num_bands() - 1) / last.num_bands();
  const int min_tiles_per_band = problem.world_size == 2 ? lag : 2 * lag;
  if (problem.k_per_rank <= kMaxLaggedK && last.tiles_per_band() >= min_tiles_per_band) c.own_lag = lag;
  if (overrides.own_lag >= 0) c.own_lag = overrides.own_lag;

  c.partial_rounds = partial_rounds_of(problem, c);
  if (overrides.partial_rounds >= 0) c.partial_rounds = std::min(c.partial_rounds, overrides.partial_rounds);
  *config = c;
  return Status::Ok();
}

}  // namespace tpfuse
