// The fused GEMM + reduce-scatter of the row-parallel linear layer.
#pragma once

#include <cuda_runtime_api.h>

#include "tpfuse/communicator.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// This process's rank of `comm` (communicator_create): out = sum over ranks of a_r @ w_r, rows
// [rank * m/P, (rank+1) * m/P) (with problem.batch > 1, this rank's shard of every sequence:
// tpfuse/problem.h), plus bias, BF16, rows_per_rank x n. bias: null, or n BF16 entries added in FP32
// to the sum before its one rounding. problem.world_size must be the communicator's size. Calls on
// one communicator must be stream-ordered on each rank.
Status gemm_reduce_scatter(Communicator* comm, const Problem& problem, const void* a, const void* w, const void* bias,
                           void* out, cudaStream_t stream, const ConfigOverrides& overrides = {});

// The same with inputs of any dtype: E4M3 ones (problem.dtype) are scaled by this rank's `scales` as
// problem.scaling says, before the bias and the reduction (tpfuse/problem.h).
Status gemm_reduce_scatter(Communicator* comm, const Problem& problem, const void* a, const void* w,
                           const InputScales& scales, const void* bias, void* out, cudaStream_t stream,
                           const ConfigOverrides& overrides = {});

// Every rank of a local communicator (communicator_create_local) at once: a[r], w[r], bias[r], out[r]
// on rank r's device (bias may be null, or any of its entries), work on streams[r]. One rank per device: where two ranks share a device the call
// returns kUnsupported and launches nothing (ranks emulated on one GPU are the testing library's, so
// the library carries no kernels for them).
Status gemm_reduce_scatter_local(Communicator* comm, const Problem& problem, const void* const* a,
                                 const void* const* w, const void* const* bias, void* const* out,
                                 const cudaStream_t* streams, const ConfigOverrides& overrides = {});
// With inputs of any dtype: scales[r] are rank r's (null: BF16 inputs).
Status gemm_reduce_scatter_local(Communicator* comm, const Problem& problem, const void* const* a,
                                 const void* const* w, const InputScales* scales, const void* const* bias,
                                 void* const* out, const cudaStream_t* streams, const ConfigOverrides& overrides = {});

}  // namespace tpfuse
