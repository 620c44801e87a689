// The fused GEMM + reduce-scatter of the row-parallel linear layer.
#pragma once

#include <cuda_runtime_api.h>

#include "tpfuse/communicator.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// This process's rank of `comm` (communicator_create): out = sum over ranks of a_r @ w_r, rows
// [rank * m/P, (rank+1) * m/P), BF16, rows_per_rank x n. problem.world_size must be the
// communicator's size. Calls on one communicator must be stream-ordered on each rank.
Status gemm_reduce_scatter(Communicator* comm, const Problem& problem, const void* a, const void* w, void* out,
                           cudaStream_t stream, const ConfigOverrides& overrides = {});

// Every rank of a local communicator (communicator_create_local) at once: a[r], w[r], out[r] on
// rank r's device, work on streams[r]. One rank per device: where two ranks share a device the call
// returns kUnsupported and launches nothing (ranks emulated on one GPU are the testing library's, so
// the library carries no kernels for them).
Status gemm_reduce_scatter_local(Communicator* comm, const Problem& problem, const void* const* a,
                                 const void* const* w, void* const* out, const cudaStream_t* streams,
                                 const ConfigOverrides& overrides = {});

}  // namespace tpfuse
