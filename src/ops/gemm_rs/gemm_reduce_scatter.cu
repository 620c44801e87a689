// The fused GEMM + reduce-scatter's public entry points, one rank per device (ops/gemm_rs/op.cuh).
#include "ops/gemm_rs/op.cuh"
#include "tpfuse/reduce_scatter.h"

namespace tpfuse {

Status gemm_reduce_scatter(Communicator* comm, const Problem& problem, const void* a, const void* w, const void* bias,
                           void* out, cudaStream_t stream, const ConfigOverrides& overrides) {
  return gemm_reduce_scatter(comm, problem, a, w, InputScales{}, bias, out, stream, overrides);
}

Status gemm_reduce_scatter(Communicator* comm, const Problem& problem, const void* a, const void* w,
                           const InputScales& scales, const void* bias, void* out, cudaStream_t stream,
                           const ConfigOverrides& overrides) {
  return launch_op_on_one_rank<GemmRsOp>(comm, problem, {&a, &w, &bias, &out, &scales}, &stream, overrides);
}

Status gemm_reduce_scatter_local(Communicator* comm, const Problem& problem, const void* const* a,
                                 const void* const* w, const void* const* bias, void* const* out,
                                 const cudaStream_t* streams, const ConfigOverrides& overrides) {
  return gemm_reduce_scatter_local(comm, problem, a, w, nullptr, bias, out, streams, overrides);
}

Status gemm_reduce_scatter_local(Communicator* comm, const Problem& problem, const void* const* a,
                                 const void* const* w, const InputScales* scales, const void* const* bias,
                                 void* const* out, const cudaStream_t* streams, const ConfigOverrides& overrides) {
  return launch_op_on_local_ranks<GemmRsOp>(comm, problem, {a, w, bias, out, scales}, streams, overrides);
}

}  // namespace tpfuse
