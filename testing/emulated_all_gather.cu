// The all-gather + GEMM's launch for the tests and the benchmark (testing/emulated_ranks.h): its kernels
// for emulated ranks are compiled here, and those for one rank once more: the library's entry points
// take no subset of the ranks.
#include "ops/ag_gemm/op.cuh"
#include "testing/emulated_ranks.cuh"
#include "testing/emulated_ranks.h"

namespace tpfuse {

Status launch_all_gather(Communicator* comm, const AllGatherProblem& problem, const std::vector<int>& local_ranks,
                         const void* const* x, const void* const* w, const void* const* bias, void* const* y,
                         void* const* gathered_x, const cudaStream_t* streams, const ConfigOverrides& overrides,
                         const InputScales* scales) {
  return launch_op<AllGatherOp, EmulatedRanks>(comm, problem, local_ranks, {x, w, bias, y, gathered_x, scales},
                                               streams, overrides);
}

}  // namespace tpfuse
