// The reduce-scatter's launch for a subset of a local communicator's ranks: an internal hook for the
// tests and the benchmark (the public entry points are in tpfuse/reduce_scatter.h). Its receive
// buffer is the communicator's parity_data (comm/communicator.h), laid out as ops/gemm_rs/workspace.h
// says.
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "ops/gemm_rs/push_timeline.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"

namespace tpfuse {

// Launches the op for the local ranks listed in `local_ranks` (indices into comm->ranks), with
// their operands; ranks emulated on one device share one cooperative launch on the first of their
// streams. The public entry points call this with every local rank; tests use subsets. `timeline`
// (the benchmark's, ops/gemm_rs/push_timeline.h) records every launched rank's pushes; null: none.
Status launch_gemm_rs(Communicator* comm, const Problem& problem, const std::vector<int>& local_ranks,
                      const void* const* a, const void* const* w, void* const* out, const cudaStream_t* streams,
                      const ConfigOverrides& overrides = {}, PushTimeline* timeline = nullptr);

}  // namespace tpfuse
