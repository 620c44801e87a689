// The reduce-scatter's kernels that record their pushes (ops/gemm_rs/push_timeline.h), for the
// benchmark's push timeline: compiled here only, so that the library's kernels carry no trace of it,
// and in a file of their own, so that they compile beside the emulated ranks' (emulated_gemm_rs.cu).
#include "testing/recorded_gemm_rs.h"

#include "ops/gemm_rs/op.cuh"

namespace tpfuse {

Status launch_gemm_rs_recorded(Communicator* comm, const Problem& problem, const std::vector<int>& local_ranks,
                               const void* const* a, const void* const* w, const void* const* bias, void* const* out,
                               const cudaStream_t* streams, const ConfigOverrides& overrides, PushTimeline* timeline,
                               const InputScales* scales) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  if (timeline == nullptr) return Status::InvalidArgument("a recorded call needs a push timeline");
  // Emulated ranks' kernels (several ranks a launch) are not compiled to record.
  const std::string shared = shared_device(*comm, local_ranks);
  if (!shared.empty()) {
    return Status::InvalidArgument("the push timeline is recorded for ranks on devices of their own: " + shared);
  }
  return launch_op<GemmRsOp, OneRankPerDeviceOf<true>>(comm, problem, local_ranks,
                                                       {a, w, bias, out, scales, timeline}, streams, overrides);
}

}  // namespace tpfuse
