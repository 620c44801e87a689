// The communicator behind the public handle: a symmetric workspace per rank (the same layout on
// every rank: data, flags and counts, each in two parity halves, and the rank's call counter), the
// peers' addresses of it, and the transport that mapped them. The ops decide what the data, flags
// and counts mean (ops/workspace.h sizes them for every op); the kernels see only the table of peer
// addresses, so one kernel serves every transport.
#pragma once

#include <nccl.h>

// Set by the tpfuse_nccl target (cmake/cuda.cmake) for everything that sees this struct, whose layout
// depends on it.
#ifndef TPFUSE_NCCL_DEVICE_API
#error "TPFUSE_NCCL_DEVICE_API must be defined (link the tpfuse_nccl or tpfuse_internal target)"
#endif

#include <array>
#include <cstdint>
#include <vector>

#include "comm/peer_error.h"
#include "comm/workspace_size.h"
#include "tpfuse/problem.h"
#include "tpfuse/reduce_scatter.h"

namespace tpfuse {

enum class Transport {
  kLocal,          // one process, plain device pointers (peer access between distinct GPUs)
  kNcclSymmetric,  // NCCL symmetric window, peer addresses from NCCL's device API (TPFUSE_NCCL_DEVICE_API)
  kCudaIpc,        // CUDA IPC handles exchanged through the NCCL communicator
};

const char* to_string(Transport transport);

// One rank's state, owned by the process that runs the rank.
struct RankState {
  int rank = 0;
  int device = 0;
  void* allocation = nullptr;  // data, flags, counts and the call counter in one allocation
  void* data = nullptr;        // [2 parities][WorkspaceSize::data_bytes]
  uint32_t* flags = nullptr;   // [2 parities][WorkspaceSize::flag_words]
  uint32_t* counts = nullptr;  // [2 parities][WorkspaceSize::count_words]
  uint64_t* calls = nullptr;   // the rank's completed calls, in the high word (comm/epoch.h)
  uint32_t* failed = nullptr;  // set by the first wait of a call that times out
  PeerError* error_host = nullptr;  // pinned, mapped: written by the GPU, read by the host
  PeerError* error_device = nullptr;
  // Every rank's data, flags and counts, as addressed from this rank's device.
  std::array<void*, kMaxWorldSize> data_at{};
  std::array<uint32_t*, kMaxWorldSize> flags_at{};
  std::array<uint32_t*, kMaxWorldSize> counts_at{};
};

struct Communicator {
  int world_size = 1;
  Transport transport = Transport::kLocal;
  CommunicatorOptions options;
  uint64_t timeout_ns = 0;
  WorkspaceSize parity;          // one parity half; the other follows it
  std::vector<RankState> ranks;  // the ranks this process runs
  // Transport resources, released by communicator_destroy.
  ncclComm_t nccl = nullptr;
#if TPFUSE_NCCL_DEVICE_API
  ncclWindow_t window = nullptr;
#endif
  std::vector<void*> ipc_opened;
};

// The transports: a workspace of `size` per parity on each rank. Collective for `nccl`.
Status create_local_workspace(const int* devices, int num_ranks, const CommunicatorOptions& options,
                              const WorkspaceSize& size, Communicator** out);
Status create_nccl_workspace(ncclComm_t nccl, const CommunicatorOptions& options, const WorkspaceSize& size,
                             Communicator** out);

// Rank `local_rank`'s data, parity half `parity`, laid out by the op that runs on it (the
// reduce-scatter's receive buffer, ops/gemm_rs/workspace.h; the all-gather's gathered buffer,
// ops/ag_gemm/workspace.h).
void* parity_data(const Communicator& comm, int local_rank, int parity);

// Bytes of one rank's workspace allocation (both parities, flags, counts and counters).
size_t workspace_bytes(const Communicator& comm);

// Checks options against the world size (the message names the bad field).
Status check_options(const CommunicatorOptions& options, int world_size);

// What every op's call checks of its communicator: the problem's world size is the communicator's,
// each local rank is one of this process's, and no earlier call failed.
Status check_call_ranks(const Communicator& comm, int problem_world_size, const std::vector<int>& local_ranks);

}  // namespace tpfuse
