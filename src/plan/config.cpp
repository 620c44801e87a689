#include "plan/config.h"

#include <algorithm>
#include <sstream>

#include "plan/partial_rounds.h"
#include "plan/schedule.h"

namespace tpfuse {

size_t GemmConfig::smem_bytes() const {
  const size_t bf16 = 2;
  const size_t stage = size_t(block_m + block_n) * block_k * bf16;
  // The epilogue stages a whole tile in BF16, or each consumer staged_chunks 64 x 64 chunks.
  const size_t epilogue = staged_chunks > 0 ? size_t(consumer_warpgroups) * staged_chunks * 64 * 64 * bf16
                                            : size_t(block_m) * block_n * bf16;
  // The ring's barriers and each stage's note of its step's tile (32 bytes); each consumer's
  // hand-off to the fused op's sender (40 bytes) and its two barriers of partial rounds; the
  // watcher's two barriers.
  const size_t barriers = size_t(stages) * (2 * 8 + 32) + size_t(consumer_warpgroups) * (40 + 2 * 8) + 2 * 8;
  // The storage is 1024-byte aligned (swizzled TMA tiles need it), and the launch adds 1024 bytes of
  // slack to align the dynamic shared memory base.
  const size_t storage = (size_t(stages) * stage + epilogue + barriers + 1023) / 1024 * 1024;
  return storage + 1024;
}

std::string GemmConfig::to_string() const {
  std::ostringstream os;
  os << "tile " << block_m << "x" << block_n << "x" << block_k << ", stages " << stages
     << ", consumer warpgroups " << consumer_warpgroups << ", threads " << threads()
     << ", group_rows " << group_rows << ", own_lag " << own_lag << ", segments/tile " << segments_per_tile
     << ", cluster " << cluster_size << ", ctas " << num_ctas << ", staged chunks "
     << (staged_chunks > 0 ? std::to_string(staged_chunks) : std::string("all")) << ", partial rounds "
     << partial_rounds << ", smem " << smem_bytes() << " B";
  return os.str();
}

namespace {

// Row tiles the CTAs of one wave share (all segments together): 32 measured best against 8 and 16
// for the plain GEMM (bench/results/2026-11-29-h200-6b0d11c).
constexpr int kGroupRowsPerWave = 32;

// The tiles the schedule cuts a rank's partial into (plan/schedule.h), for counting them (the
// entry points validate a problem, so its sizes fit an int, before they choose its config).
TileSchedule tile_grid(const Problem& problem, int block_m, int block_n, int segments_per_tile) {
  ScheduleShape shape;
  shape.world_size = problem.world_size;
  shape.m = int(problem.m);
  shape.n = int(problem.n);
  shape.block_m = block_m;
  shape.block_n = block_n;
  shape.segments_per_tile = segments_per_tile;
  return TileSchedule(shape);
}

// Relative time of a config: the waves of tiles over the SMs times a tile's cost, which grows with
// its columns plus a fixed part (pipeline fill and epilogue) worth about 32 columns.
double relative_time(const Problem& problem, const DeviceInfo& device, int block_m, int block_n,
                     int segments_per_tile) {
  const int64_t tiles = tile_grid(problem, block_m, block_n, segments_per_tile).num_tiles();
  const int64_t waves = (tiles + device.num_sms - 1) / device.num_sms;
  constexpr double kFixedCols = 32;
  return double(waves) * (block_m / 128.0) * (block_n + kFixedCols);
}

}  // namespace

int partial_rounds_of(const Problem& problem, const GemmConfig& c) {
  // None where
  //  - a band has two segments: the partner computes the shared tile at the same step and pushes
  //    this rank's slab of it only after its K loop, so a round waiting for it there would deadlock;
  //  - the epilogue stages a slab in batches: a round is a whole slab in the chunk buffers;
  //  - own tiles come last (all at the end of the call) at P = 2, where they are half the tiles:
  //    there the rounds measured slower (M = 2048: fused/GEMM 1.20-1.21 against 1.17-1.18), where
  //    at P = 4 and 8 they measured 2-4 points faster (M = 2048: 1.23 against 1.26 at P = 8, 1.20
  //    against 1.23 at P = 4; bench/results/2026-11-29-h200-e8ae53a/own_last/).
  const bool own_last = c.own_lag >= tile_grid(problem, c.block_m, c.block_n, c.segments_per_tile).tiles_per_band();
  if (problem.world_size == 1 || c.segments_per_tile != 1 || c.staged_chunks > 0 ||
      (own_last && problem.world_size < 4)) {
    return 0;
  }
  const int num_k_blocks = int((problem.k_per_rank + c.block_k - 1) / c.block_k);
  return partial_rounds_that_fit(num_k_blocks, c.consumer_warpgroups, problem.world_size - 1);
}

Status select_gemm_config(const Problem& problem, const DeviceInfo& device, GemmConfig* config) {
  if (config == nullptr) return Status::InvalidArgument("config must not be null");
  if (device.cc_major != 9) {
    return Status::Unsupported("tpfuse's kernels need a Hopper GPU (compute capability 9.0); this one is " +
                               std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor));
  }
  GemmConfig c;
  if (problem.rows_per_rank() == 64 && problem.world_size >= 4) {
    // Segments of 64 rows (M=512 at P=8): 128-row tiles over two ranks' segments, one slab each,
    // take one wave where 64-row tiles take two (plan/schedule.h). With P = 2 the only band would
    // be the own one, every tile half reduced and half pushed at the same step on both ranks.
    c.segments_per_tile = 2;
  } else if (problem.rows_per_rank() <= 64) {
    // A segment of under 64 rows would waste most of a 128-row tile: 64-row tiles, the two
    // consumer warpgroups splitting the columns instead of the rows.
    c.block_m = 64;
  }
  if (c.block_m == 128 && relative_time(problem, device, 128, 192, c.segments_per_tile) <
                              relative_time(problem, device, 128, 256, c.segments_per_tile)) {
    // Narrower tiles where 256-wide ones would leave SMs idle in the last wave (M=512, N=6144).
    c.block_n = 192;
  }
  c.num_ctas = device.num_sms;
  // The CTAs at work at one time hold about ceil(CTAs / P) consecutive tiles of each of the P
  // segments (schedule rounds): groups of 32 / P row tiles make them together the 32-row group
  // that measured best for one rank, sharing A rows and W columns in L2.
  c.group_rows = std::max(1, kGroupRowsPerWave / problem.world_size);
  // Own tiles interleaved about two waves of steps behind the peers' tiles of the same rows (a
  // round holds a tile of each of the B bands, so L rounds are about L * B steps; plan/schedule.h):
  // the pushes then keep the links busy for the whole call, not only until the own tiles start.
  // On two GPUs, the sweep's per-rank shapes of P = 8: speedup 1.42-1.43 against 1.35 for own
  // tiles last, 1.33 for one wave, 1.25 for half a wave
  // (bench/results/2026-11-29-h200x2-a88161a/own_lag/).
  // Own tiles stay last
  //  - where a tile is deep (K per rank > 4096) and its pushes are few next to its multiply: there
  //    the lag only costs balance (llama down_proj at P = 2, K/P = 14336: speedup 0.957-1.015
  //    against 0.993-1.026);
  //  - where a band has fewer than 2L tiles: interleaved into so few waves, some CTAs take two own
  //    tiles where others take none (one GPU, o_proj at M = 2048, P = 8: 1.38-1.52 against 1.26-1.36,
  //    bench/results/2026-11-29-h200-a88161a/own_lag/); at P = 2 fewer than L tiles. There own
  //    tiles are half of the tiles, and last they leave the links idle for half the call: on two
  //    GPUs at M = 2048 (256 tiles a band, L = 132) T_fused measured 2-6% lower interleaved on three
  //    of the four per-rank shapes of P = 8 and 1% higher on one, speedup 1.449-1.456 against
  //    1.411-1.412 (bench/results/2026-11-29-h200x2-c35637d/own_lag_m2048/).
  const TileSchedule grid = tile_grid(problem, c.block_m, c.block_n, c.segments_per_tile);
  const int bands = grid.num_bands();
  const int lag = (2 * c.num_ctas + bands - 1) / bands;
  constexpr int64_t kMaxLaggedK = 4096;
  const int min_tiles_per_band = problem.world_size == 2 ? lag : 2 * lag;
  c.own_lag = problem.k_per_rank <= kMaxLaggedK && grid.tiles_per_band() >= min_tiles_per_band ? lag : kOwnTilesLast;
  // A single wave of 128 x 256 tiles (M = 512, N = 8192): no tile's epilogue overlaps another's
  // mainloop anyway, and a fourth stage shortens the one mainloop more than staging the epilogue 2
  // chunks at a time lengthens it: the plain GEMM's cuBLAS/ours 1.020 / 1.007 against 0.995 / 0.951
  // at llama o_proj M = 512 (K x N / N x K). With more waves it cost 1-4%
  // (bench/results/2026-11-29-h200-ee59bda/stage4/).
  if (c.block_m == 128 && c.block_n == 256 && (grid.num_tiles() <= c.num_ctas || problem.world_size > 1)) c.staged_chunks = 2;  // probe: 4 stages for the fused op
  TPFUSE_RETURN_IF_ERROR(fit_stages(device, &c));
  c.partial_rounds = partial_rounds_of(problem, c);
  *config = c;
  return Status::Ok();
}

Status fit_stages(const DeviceInfo& device, GemmConfig* config) {
  // As many pipeline stages as fit beside the epilogue's staging (3 for 128 x 256 tiles, 4 otherwise).
  constexpr int kMaxStages = 4;
  config->stages = kMaxStages;
  while (config->stages > 2 && config->smem_bytes() > size_t(device.max_smem_per_block)) --config->stages;
  if (config->smem_bytes() > size_t(device.max_smem_per_block)) {
    return Status::Unsupported("the GEMM tiles need " + std::to_string(config->smem_bytes()) +
                               " bytes of shared memory; the device allows " +
                               std::to_string(device.max_smem_per_block));
  }
  return Status::Ok();
}

}  // namespace tpfuse
