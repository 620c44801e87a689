// The communicator behind the public handle: per-rank receive buffers, flags and counters, and the
// peer addresses the kernel pushes to. Internal to the runtime (and to tests and the benchmark,
// which use the launch hooks at the bottom).
#pragma once

#include <nccl.h>

#include <array>
#include <cstdint>
#include <vector>

#include "kernels/peer_error.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse {

enum class Transport {
  kLocal,          // one process, plain device pointers (peer access between distinct GPUs)
  kNcclSymmetric,  // NCCL symmetric window, peer addresses from NCCL's device API
  kCudaIpc,        // CUDA IPC handles exchanged through the NCCL communicator
};

const char* to_string(Transport transport);

// One rank's state, owned by the process that runs the rank.
struct RankState {
  int rank = 0;
  int device = 0;
  void* allocation = nullptr;  // receive buffer, flags and counters in one allocation
  void* recv = nullptr;        // BF16 [2 parities][P][rows_per_rank][n]
  uint32_t* flags = nullptr;   // [2 parities][P][tiles per segment][2 slabs]
  uint32_t* epoch_counter = nullptr;
  uint32_t* done_counter = nullptr;
  uint32_t* failed = nullptr;
  // FP32 [rows_per_rank][n]: this rank's own slabs, waiting for their peers' partials. Private to
  // the rank (not in the symmetric allocation).
  float* own_partial = nullptr;
  kernels::PeerError* error_host = nullptr;  // pinned, mapped: written by the GPU, read by the host
  kernels::PeerError* error_device = nullptr;
  // Every rank's receive buffer and flags, as addressed from this rank's device.
  std::array<void*, kMaxWorldSize> recv_at{};
  std::array<uint32_t*, kMaxWorldSize> flags_at{};
};

struct Communicator {
  int world_size = 1;
  Transport transport = Transport::kLocal;
  int64_t max_m = 0;
  int64_t max_n = 0;
  uint64_t timeout_ns = 0;
  size_t recv_parity_elems = 0;  // BF16 elements in one parity half of a receive buffer
  size_t flags_parity_words = 0;
  size_t own_partial_elems = 0;  // FP32 elements of a rank's own-partial buffer
  std::vector<RankState> ranks;  // the ranks this process runs
  // Transport resources, released by communicator_destroy.
  ncclComm_t nccl = nullptr;
  ncclWindow_t window = nullptr;
  std::vector<void*> ipc_opened;

  bool all_ranks_on_one_device() const;
};

// Launches the fused op for the local ranks listed in `local_ranks` (indices into comm->ranks), with
// their operands; ranks emulated on one device share one cooperative launch on the first of their
// streams. The public entry points call this with every local rank; tests use subsets.
Status launch_fused(Communicator* comm, const Problem& problem, const std::vector<int>& local_ranks,
                    const void* const* a, const void* const* w, void* const* out, const cudaStream_t* streams);

// Marks every partial this rank will wait for as already delivered (for every future call), so one
// rank can run alone: the solo-rank proxy benchmark. Its pushes still land in the peers' buffers.
Status preset_incoming_flags(Communicator* comm, int local_rank);

}  // namespace tpfuse
