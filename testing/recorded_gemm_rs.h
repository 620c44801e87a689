// The reduce-scatter's launch by the kernels that record their pushes (recorded_gemm_rs.cu), as
// launch_gemm_rs (testing/emulated_ranks.h) makes it for a call with a timeline.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "ops/gemm_rs/push_timeline.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"

namespace tpfuse {

// As launch_gemm_rs, with a timeline (not null) and the listed ranks each on a device of its own.
Status launch_gemm_rs_recorded(Communicator* comm, const Problem& problem, const std::vector<int>& local_ranks,
                               const void* const* a, const void* const* w, const void* const* bias, void* const* out,
                               const cudaStream_t* streams, const ConfigOverrides& overrides, PushTimeline* timeline,
                               const InputScales* scales);

}  // namespace tpfuse
