#include "gemm/config.h"

#include <algorithm>
#include <sstream>

#include "gemm/shared_storage.h"

namespace tpfuse {

namespace {

// Row tiles the CTAs of one wave share, all segments together: 32 measured best against 8 and 16
// for the plain GEMM (docs/EXPERIMENTS.md).
constexpr int kGroupRowsPerWave = 32;

// Relative time of a tile shape: the waves of tiles over the SMs times a tile's cost, which grows
// with its columns plus a fixed part (pipeline fill and epilogue) worth about 32 columns.
double relative_time(const TileGrid& grid, const DeviceInfo& device, int block_m, int block_n) {
  const int64_t waves = (grid.tiles(block_m, block_n) + device.num_sms - 1) / device.num_sms;
  constexpr double kFixedCols = 32;
  return double(waves) * (block_m / 128.0) * (block_n + kFixedCols);
}

}  // namespace

std::string GemmConfig::to_string() const {
  const GemmVariant& v = tile();
  std::ostringstream os;
  os << "variant " << variant << ": tile " << v.block_m << "x" << v.block_n << "x" << kBlockK << ", stages "
     << v.stages << ", staged chunks " << (v.staged_chunks > 0 ? std::to_string(v.staged_chunks) : std::string("all"))
     << ", threads " << kThreads << ", ctas " << num_ctas << ", group_rows " << group_rows << ", smem "
     << smem_bytes << " B";
  return os.str();
}

Status select_gemm_config(const TileGrid& grid, const DeviceInfo& device, const ConfigOverrides& overrides,
                          const SmemByVariant& smem, GemmConfig* config) {
  if (config == nullptr) return Status::InvalidArgument("config must not be null");
  if (device.cc_major != 9) {
    return Status::Unsupported("tpfuse's kernels need a Hopper GPU (compute capability 9.0); this one is " +
                               std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor));
  }
  TPFUSE_RETURN_IF_ERROR(validate(overrides));
  // The tile this output wants. A band of at most 64 rows would waste most of a 128-row tile: then
  // 64-row tiles, the two consumers splitting the columns instead of the rows.
  const int block_m = grid.rows_per_band <= 64 ? 64 : 128;
  int block_n = 256;
  if (block_m == 128) {
    if (overrides.block_n != 0) {
      block_n = overrides.block_n;
    } else if (relative_time(grid, device, 128, 192) < relative_time(grid, device, 128, 256)) {
      block_n = 192;  // 256-wide tiles would leave SMs idle in the last wave (M = 512, N = 6144)
    }
  }
  // A single wave of 128 x 256 tiles: no tile's epilogue overlaps another's mainloop anyway, and a
  // fourth stage shortens the one mainloop more than staging the epilogue in batches lengthens it;
  // with more waves the batches cost more than the stage gains (docs/EXPERIMENTS.md).
  const bool want_batches = block_m == 128 && block_n == 256 && grid.tiles(128, 256) <= device.num_sms;

  // The best variant that fits: that tile and staging, else that tile, else any; deeper first.
  int best = -1, best_rank = -1;
  for (int i = 0; i < kNumGemmVariants; ++i) {
    if (smem[i] > size_t(device.max_smem_per_block)) continue;
    const GemmVariant& v = kGemmVariants[i];
    const bool same_tile = v.block_m == block_m && v.block_n == block_n;
    const bool same_staging = (v.staged_chunks > 0) == want_batches;
    const int rank = (4 * same_tile + 2 * same_staging) * 16 + v.stages;
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
  GemmConfig c;
  c.variant = best;
  c.num_ctas = device.num_sms;
  c.smem_bytes = smem[best];
  c.group_rows = group_rows_for(1, overrides);
  *config = c;
  return Status::Ok();
}

int group_rows_for(int segments_in_flight, const ConfigOverrides& overrides) {
  if (overrides.group_rows > 0) return overrides.group_rows;
  // The CTAs at work at one time hold about ceil(CTAs / S) consecutive tiles of each of the S
  // segments: groups of 32 / S row tiles make them together the 32-row group that measured best.
  return std::max(1, kGroupRowsPerWave / std::max(1, segments_in_flight));
}

Status select_plain_gemm_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                                GemmConfig* config) {
  static constexpr SmemByVariant kSmem = smem_bytes_by_variant<NoOpSync>();
  TileGrid grid;
  grid.rows_per_band = problem.m;
  grid.n = problem.n;
  return select_gemm_config(grid, device, overrides, kSmem, config);
}

}  // namespace tpfuse
