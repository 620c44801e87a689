// The all-gather + GEMM's launch for a subset of a local communicator's ranks: an internal hook for
// the tests and the benchmark (the public entry points are in tpfuse/all_gather.h). Its gathered
// buffer is the communicator's parity_data (comm/communicator.h), laid out as ops/ag_gemm/workspace.h
// says; the solo-rank proxy fills it and presets the flags (testing/solo_rank.h).
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"

namespace tpfuse {

// Launches the op for the local ranks listed in `local_ranks` (indices into comm->ranks); ranks
// emulated on one device share one cooperative launch on the first of their streams. gathered_x may
// be null, or any of its entries.
Status launch_all_gather(Communicator* comm, const AllGatherProblem& problem, const std::vector<int>& local_ranks,
                         const void* const* x, const void* const* w, void* const* y, void* const* gathered_x,
                         const cudaStream_t* streams, const ConfigOverrides& overrides = {});

}  // namespace tpfuse
