// The reduce-scatter op's config: the GEMM variant and grid for its tile grid (gemm/config.h), and
// its own choices: bands of two segments, the own tiles' lag, the partial rounds. A pure function of
// the problem, the device and the overrides, testable on a CPU.
#pragma once

#include <string>

#include "core/device_info.h"
#include "gemm/config.h"
#include "ops/gemm_rs/schedule.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

struct GemmRsConfig {
  GemmConfig gemm;
  int segments_per_tile = 1;     // 2: 128-row tiles over two ranks' 64-row segments; P: one band (schedule.h)
  bool shared_tiles = false;     // one band of segments shorter than a slab: tiles of several owners' rows
  bool register_epilogue = false;  // shared tiles pushed and reduced from registers (ops/gemm_rs/shared_tiles.cuh)
  int own_lag = kOwnTilesLast;   // rounds from a peer's tile to the own tile of the same rows (schedule.h)
  int partial_rounds = 0;        // rounds of an own tile's peer partials added during its K loop (partial_rounds.h)

  std::string to_string() const;
};

// Dynamic shared memory of the op's kernel, for each GEMM variant.
const SmemByVariant& gemm_rs_smem_bytes();

Status select_gemm_rs_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                             GemmRsConfig* config);

// The schedule of `rank` under config `c`.
ScheduleShape schedule_shape(const Problem& problem, const GemmRsConfig& c, int rank);

}  // namespace tpfuse
