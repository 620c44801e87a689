// The fused all-gather + GEMM's public entry points, one rank per device (ops/ag_gemm/op.cuh).
#include "ops/ag_gemm/op.cuh"
#include "tpfuse/all_gather.h"

namespace tpfuse {

Status all_gather_gemm(Communicator* comm, const AllGatherProblem& problem, const void* x, const void* w,
                       const void* bias, void* y, void* gathered_x, cudaStream_t stream,
                       const ConfigOverrides& overrides) {
  return all_gather_gemm(comm, problem, x, w, InputScales{}, bias, y, gathered_x, stream, overrides);
}

Status all_gather_gemm(Communicator* comm, const AllGatherProblem& problem, const void* x, const void* w,
                       const InputScales& scales, const void* bias, void* y, void* gathered_x, cudaStream_t stream,
                       const ConfigOverrides& overrides) {
  return launch_op_on_one_rank<AllGatherOp>(comm, problem, {&x, &w, &bias, &y, &gathered_x, &scales}, &stream,
                                            overrides);
}

Status all_gather_gemm_local(Communicator* comm, const AllGatherProblem& problem, const void* const* x,
                             const void* const* w, const void* const* bias, void* const* y,
                             void* const* gathered_x, const cudaStream_t* streams,
                             const ConfigOverrides& overrides) {
  return all_gather_gemm_local(comm, problem, x, w, nullptr, bias, y, gathered_x, streams, overrides);
}

Status all_gather_gemm_local(Communicator* comm, const AllGatherProblem& problem, const void* const* x,
                             const void* const* w, const InputScales* scales, const void* const* bias,
                             void* const* y, void* const* gathered_x, const cudaStream_t* streams,
                             const ConfigOverrides& overrides) {
  return launch_op_on_local_ranks<AllGatherOp>(comm, problem, {x, w, bias, y, gathered_x, scales}, streams,
                                               overrides);
}

}  // namespace tpfuse
