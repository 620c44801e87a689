// The fused ops launched for any of a local communicator's ranks, as the tests and the benchmark's
// proxy drive them: a subset of the ranks (the others never run: a missing peer, or a solo rank whose
// peers' data is preset, testing/solo_rank.h), and ranks that share a device emulated on it, all of
// them in one cooperative launch. Ranks on devices of their own run as the library runs them. The
// library itself runs one rank per device and refuses ranks that share one (ops/launch.cuh).
#pragma once

#include <vector>

#include "comm/communicator.h"
#include "ops/gemm_rs/push_timeline.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"

namespace tpfuse {

// The reduce-scatter for the local ranks listed in `local_ranks` (indices into comm->ranks), with
// their operands (bias may be null, or any of its entries); emulated ranks share the first of their
// streams. Its receive buffer is the
// communicator's parity_data (comm/communicator.h), laid out as ops/gemm_rs/workspace.h says.
// `timeline` (the benchmark's, ops/gemm_rs/push_timeline.h) records every launched rank's pushes, by
// kernels compiled to record them (ranks on devices of their own only: emulated ranks are refused);
// null: none, by the library's kernels. `scales`: E4M3 inputs' (tpfuse/problem.h), indexed as the
// operands; null for BF16.
Status launch_gemm_rs(Communicator* comm, const Problem& problem, const std::vector<int>& local_ranks,
                      const void* const* a, const void* const* w, const void* const* bias, void* const* out,
                      const cudaStream_t* streams, const ConfigOverrides& overrides = {},
                      PushTimeline* timeline = nullptr, const InputScales* scales = nullptr);

// The all-gather + GEMM for the local ranks listed in `local_ranks`, as launch_gemm_rs. Its gathered
// buffer is the communicator's parity_data, laid out as ops/ag_gemm/workspace.h says. bias and
// gathered_x may be null, or any of their entries. `scales`: E4M3 inputs', indexed as the operands;
// null for BF16.
Status launch_all_gather(Communicator* comm, const AllGatherProblem& problem, const std::vector<int>& local_ranks,
                         const void* const* x, const void* const* w, const void* const* bias, void* const* y,
                         void* const* gathered_x, const cudaStream_t* streams, const ConfigOverrides& overrides = {},
                         const InputScales* scales = nullptr);

}  // namespace tpfuse
