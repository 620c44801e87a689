// The communicator the fused ops run on: every rank's symmetric workspace (receive buffers, flags)
// and the peers' addresses of it, sized for the largest call of every op.
#pragma once

#include <nccl.h>

#include <cstdint>

#include "tpfuse/status.h"

namespace tpfuse {

// The ranks' shared state: a symmetric workspace (receive buffers, flags) and the peers' addresses
// of it. Opaque.
struct Communicator;

struct CommunicatorOptions {
  int64_t max_m = 0;  // the largest problem.m any call will use (receive buffers are sized for it)
  int64_t max_n = 0;  // the largest problem.n (reduce-scatter) or n_per_rank (all-gather)
  int64_t max_k = 0;  // the largest AllGatherProblem.k; 0: no all-gather + GEMM calls
  // A wait for a peer's partial longer than this ends the call with kPeerTimeout. 0: the
  // TPFUSE_PEER_TIMEOUT_MS environment variable (milliseconds), else 10 seconds.
  double peer_timeout_s = 0;
};

// One process per GPU (as PyTorch and Megatron run): wraps the caller's NCCL communicator. Collective:
// every rank of `comm` calls it. Buffers are NCCL symmetric memory (ncclMemAlloc + window
// registration); where that is unavailable, CUDA IPC peer mappings exchanged through `comm`.
Status communicator_create(ncclComm_t comm, const CommunicatorOptions& options, Communicator** out);

// One process driving `num_ranks` local GPUs: rank r runs on devices[r]. A device may repeat, for
// the tests: the library's calls run one rank per device and refuse ranks that share one
// (kUnsupported); only tpfuse's testing library emulates them, all of a GPU's in one cooperative
// launch, which checks the protocol but not NVLink.
Status communicator_create_local(const int* devices, int num_ranks, const CommunicatorOptions& options,
                                 Communicator** out);

Status communicator_destroy(Communicator* comm);

// kPeerTimeout (with which rank waited for which) if any call so far on this process's ranks timed
// out waiting for a peer, else Ok. Reflects the calls whose streams the caller has synchronized.
// After a timeout the communicator stays failed: destroy it.
Status communicator_status(const Communicator* comm);

}  // namespace tpfuse
