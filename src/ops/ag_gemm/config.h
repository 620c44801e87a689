// The all-gather + GEMM's config: the GEMM variant and grid for its output cut into P bands of m/P
// rows, or bands of two or all blocks where a block has 64 rows or fewer (gemm/config.h), with split K
// where the tiles fill few SMs. A pure function of the problem, the device and the overrides
// (block_n, split_k, group_rows, shared_tiles and idle_copiers apply; the reduce-scatter's own_lag and
// partial_rounds do not).
#pragma once

#include <string>

#include "core/device_info.h"
#include "gemm/config.h"
#include "ops/ag_gemm/schedule.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

struct AllGatherConfig {
  GemmConfig gemm;
  int sources_per_band = 1;  // G: blocks of X a band holds (ops/ag_gemm/schedule.h)
  int idle_copiers = -1;     // overrides.idle_copiers (ops/ag_gemm/workspace.h: copy_plan)
  std::string to_string() const {
    return gemm.to_string() + ", sources_per_band " + std::to_string(sources_per_band) +
           (idle_copiers != -1 ? ", idle_copiers " + std::to_string(idle_copiers) : "");
  }
};

Status select_all_gather_config(const AllGatherProblem& problem, const DeviceInfo& device,
                                const ConfigOverrides& overrides, AllGatherConfig* config);

// Rank `rank`'s schedule under `config`.
AllGatherShape all_gather_shape(const AllGatherProblem& problem, const AllGatherConfig& config, int rank);

}  // namespace tpfuse
