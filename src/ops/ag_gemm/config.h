// The all-gather + GEMM's config: the GEMM variant and grid for its output cut into P bands of m/P
// rows (gemm/config.h), with split K where the tiles fill few SMs. A pure function of the problem,
// the device and the overrides (block_n, split_k and group_rows apply; the reduce-scatter's own_lag,
// partial_rounds and shared_tiles do not).
#pragma once

#include <string>

#include "core/device_info.h"
#include "gemm/config.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

struct AllGatherConfig {
  GemmConfig gemm;
  std::string to_string() const { return gemm.to_string(); }
};

Status select_all_gather_config(const AllGatherProblem& problem, const DeviceInfo& device,
                                const ConfigOverrides& overrides, AllGatherConfig* config);

}  // namespace tpfuse
