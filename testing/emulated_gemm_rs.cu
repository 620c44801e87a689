// The reduce-scatter's launch for the tests and the benchmark (testing/emulated_ranks.h): its kernels
// for emulated ranks are compiled here, and those for one rank once more: the library's entry points
// take neither a subset of the ranks nor a timeline. A call with a timeline goes to the kernels that
// record their pushes (recorded_gemm_rs.cu).
#include "ops/gemm_rs/op.cuh"
#include "testing/emulated_ranks.cuh"
#include "testing/emulated_ranks.h"
#include "testing/recorded_gemm_rs.h"

namespace tpfuse {

Status launch_gemm_rs(Communicator* comm, const Problem& problem, const std::vector<int>& local_ranks,
                      const void* const* a, const void* const* w, const void* const* bias, void* const* out,
                      const cudaStream_t* streams, const ConfigOverrides& overrides, PushTimeline* timeline,
                      const InputScales* scales) {
  if (timeline != nullptr) {
    return launch_gemm_rs_recorded(comm, problem, local_ranks, a, w, bias, out, streams, overrides, timeline, scales);
  }
  return launch_op<GemmRsOp, EmulatedRanks>(comm, problem, local_ranks, {a, w, bias, out, scales}, streams, overrides);
}

}  // namespace tpfuse
