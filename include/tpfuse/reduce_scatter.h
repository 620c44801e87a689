// The fused GEMM + reduce-scatter of the row-parallel linear layer, and the communicator it runs on.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>

#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// The ranks' shared state: a symmetric workspace (receive buffers, flags) and the peers' addresses
// of it. Opaque.
struct Communicator;

struct CommunicatorOptions {
  int64_t max_m = 0;  // the largest problem.m any call will use (receive buffers are sized for it)
  int64_t max_n = 0;  // the largest problem.n
  // A wait for a peer's partial longer than this ends the call with kPeerTimeout. 0: the
  // TPFUSE_PEER_TIMEOUT_MS environment variable (milliseconds), else 10 seconds.
  double peer_timeout_s = 0;
};

// One process per GPU (as PyTorch and Megatron run): wraps the caller's NCCL communicator. Collective:
// every rank of `comm` calls it. Buffers are NCCL symmetric memory (ncclMemAlloc + window
// registration); where that is unavailable, CUDA IPC peer mappings exchanged through `comm`.
Status communicator_create(ncclComm_t comm, const CommunicatorOptions& options, Communicator** out);

// One process driving `num_ranks` local GPUs: rank r runs on devices[r]. A device may repeat: then
// its ranks are emulated on that one GPU (all ranks of one GPU in one cooperative launch), which
// checks the protocol but not NVLink.
Status communicator_create_local(const int* devices, int num_ranks, const CommunicatorOptions& options,
                                 Communicator** out);

Status communicator_destroy(Communicator* comm);

// kPeerTimeout (with which rank waited for which) if any call so far on this process's ranks timed
// out waiting for a peer, else Ok. Reflects the calls whose streams the caller has synchronized.
// After a timeout the communicator stays failed: destroy it.
Status communicator_status(const Communicator* comm);

// This process's rank of `comm` (communicator_create): out = sum over ranks of a_r @ w_r, rows
// [rank * m/P, (rank+1) * m/P), BF16, rows_per_rank x n. problem.world_size must be the
// communicator's size. Calls on one communicator must be stream-ordered on each rank.
Status gemm_reduce_scatter(Communicator* comm, const Problem& problem, const void* a, const void* w, void* out,
                           cudaStream_t stream, const ConfigOverrides& overrides = {});

// Every rank of a local communicator (communicator_create_local) at once: a[r], w[r], out[r] on
// rank r's device, work on streams[r].
Status gemm_reduce_scatter_local(Communicator* comm, const Problem& problem, const void* const* a,
                                 const void* const* w, void* const* out, const cudaStream_t* streams,
                                 const ConfigOverrides& overrides = {});

}  // namespace tpfuse
