// The fused all-gather + GEMM of the column-parallel linear layer (sequence parallelism): rank r
// holds X_r (its m/P rows of the activations, k columns) and W_r (its n_per_rank output columns)
// and computes Y_r = AllGather_rows(X) @ W_r (m x n_per_rank), multiplying each peer's block of X as
// soon as it has arrived.
#pragma once

#include <cuda_runtime_api.h>

#include "tpfuse/communicator.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// This process's rank of `comm`: x (rows_per_rank x k, this rank's rows [rank * m/P, ...), or with
// problem.batch > 1 its shard of every sequence: tpfuse/problem.h), w as problem.weight_layout says,
// y = the gathered X @ w + bias (m x n_per_rank, BF16). bias: null, or n_per_rank BF16 entries added
// in FP32 before the one rounding. gathered_x, if not null, receives the gathered X (m x k, of X's
// dtype), as fused_all_gather_matmul's return_A. Calls on one communicator must be stream-ordered on
// each rank; the communicator needs options.max_k >= k.
Status all_gather_gemm(Communicator* comm, const AllGatherProblem& problem, const void* x, const void* w,
                       const void* bias, void* y, void* gathered_x, cudaStream_t stream,
                       const ConfigOverrides& overrides = {});

// The same with inputs of any dtype: E4M3 ones (problem.dtype) are scaled as problem.scaling says
// (tpfuse/problem.h): scales.a is X_r's (one value; rows_per_rank, or rows_per_rank x k/128 blockwise,
// gathered with the rows), scales.w W_r's.
Status all_gather_gemm(Communicator* comm, const AllGatherProblem& problem, const void* x, const void* w,
                       const InputScales& scales, const void* bias, void* y, void* gathered_x, cudaStream_t stream,
                       const ConfigOverrides& overrides = {});

// Every rank of a local communicator at once (x[r], w[r], bias[r], y[r], gathered_x[r] on rank r's
// device; bias and gathered_x may be null, or any of their entries). One rank per device, as gemm_reduce_scatter_local:
// where two ranks share a device the call returns kUnsupported.
Status all_gather_gemm_local(Communicator* comm, const AllGatherProblem& problem, const void* const* x,
                             const void* const* w, const void* const* bias, void* const* y,
                             void* const* gathered_x, const cudaStream_t* streams,
                             const ConfigOverrides& overrides = {});
// With inputs of any dtype: scales[r] are rank r's (null: BF16 inputs).
Status all_gather_gemm_local(Communicator* comm, const AllGatherProblem& problem, const void* const* x,
                             const void* const* w, const InputScales* scales, const void* const* bias,
                             void* const* y, void* const* gathered_x, const cudaStream_t* streams,
                             const ConfigOverrides& overrides = {});

}  // namespace tpfuse
