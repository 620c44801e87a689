// Creating and destroying communicators: the symmetric workspace, peer addresses, error words.
#include "comm/communicator.h"

#if TPFUSE_NCCL_DEVICE_API
#include <nccl_device.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "core/cuda_check.h"
#include "core/env.h"

namespace tpfuse {
namespace {

constexpr size_t kAlign = 256;
constexpr int kCounterWords = 4;  // calls (two words), failed, spare

size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

Status nccl_status(ncclResult_t res, const char* what) {
  if (res == ncclSuccess) return Status::Ok();
  return Status(StatusCode::kNcclError, std::string(what) + " failed: " + ncclGetErrorString(res));
}
#define TPFUSE_NCCL_TRY(call) TPFUSE_RETURN_IF_ERROR(nccl_status((call), #call))

}  // namespace

Status check_options(const CommunicatorOptions& options, int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return Status::InvalidArgument("world size " + std::to_string(world_size) + " is out of range 1.." +
                                   std::to_string(kMaxWorldSize));
  }
  if (options.max_m <= 0 || options.max_m % world_size != 0) {
    return Status::InvalidArgument("options.max_m = " + std::to_string(options.max_m) +
                                   " must be positive and divisible by the world size " + std::to_string(world_size));
  }
  if (options.max_n <= 0 || options.max_n % 8 != 0) {
    return Status::InvalidArgument("options.max_n = " + std::to_string(options.max_n) +
                                   " must be a positive multiple of 8");
  }
  if (options.max_k < 0 || options.max_k % 8 != 0) {
    return Status::InvalidArgument("options.max_k = " + std::to_string(options.max_k) +
                                   " must be a multiple of 8 (0: no all-gather + GEMM calls)");
  }
  if (options.peer_timeout_s < 0 || !std::isfinite(options.peer_timeout_s)) {
    return Status::InvalidArgument("options.peer_timeout_s must be >= 0 (0: default)");
  }
  return Status::Ok();
}

namespace {

Status set_sizes(const CommunicatorOptions& options, int world_size, const WorkspaceSize& size, Communicator* comm) {
  comm->world_size = world_size;
  comm->options = options;
  double timeout_s = options.peer_timeout_s;
  if (timeout_s == 0) {
    int64_t timeout_ms = 0;
    TPFUSE_RETURN_IF_ERROR(default_peer_timeout_ms(&timeout_ms));
    timeout_s = double(timeout_ms) / 1000.0;
  }
  comm->timeout_ns = uint64_t(timeout_s * 1e9);
  comm->parity.data_bytes = align_up(size.data_bytes);
  comm->parity.flag_words = align_up(size.flag_words * 4) / 4;
  comm->parity.count_words = align_up(size.count_words * 4) / 4;
  return Status::Ok();
}

size_t data_bytes(const Communicator& comm) { return 2 * comm.parity.data_bytes; }
size_t flag_bytes(const Communicator& comm) { return 2 * comm.parity.flag_words * 4; }
size_t count_bytes(const Communicator& comm) { return 2 * comm.parity.count_words * 4; }

size_t allocation_bytes(const Communicator& comm) {
  return data_bytes(comm) + flag_bytes(comm) + count_bytes(comm) + align_up(kCounterWords * 4);
}

// Points the rank's fields into its allocation, zeroes flags and counters, and maps the error word.
Status init_rank(Communicator& comm, RankState& rank, void* allocation) {
  rank.allocation = allocation;
  uint8_t* base = static_cast<uint8_t*>(allocation);
  rank.data = base;
  base += data_bytes(comm);
  rank.flags = reinterpret_cast<uint32_t*>(base);
  base += flag_bytes(comm);
  rank.counts = reinterpret_cast<uint32_t*>(base);
  base += count_bytes(comm);
  rank.calls = reinterpret_cast<uint64_t*>(base);  // 256-byte aligned
  rank.failed = reinterpret_cast<uint32_t*>(base) + 2;
  TPFUSE_CUDA_TRY(cudaMemset(rank.flags, 0, flag_bytes(comm) + count_bytes(comm) + align_up(kCounterWords * 4)));
  TPFUSE_CUDA_TRY(cudaHostAlloc(&rank.error_host, sizeof(PeerError), cudaHostAllocMapped));
  std::memset(rank.error_host, 0, sizeof(PeerError));
  TPFUSE_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&rank.error_device), rank.error_host, 0));
  return Status::Ok();
}

// Offsets of the flags and counts inside every rank's allocation: the same on every rank.
uint32_t* flags_in(void* allocation, const Communicator& comm) {
  return reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(allocation) + data_bytes(comm));
}
uint32_t* counts_in(void* allocation, const Communicator& comm) {
  return reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(allocation) + data_bytes(comm) + flag_bytes(comm));
}

#if TPFUSE_NCCL_DEVICE_API
__global__ void peer_pointers_kernel(ncclWindow_t window, int world_size, void** out) {
  for (int peer = 0; peer < world_size; ++peer) out[peer] = ncclGetPeerPointer(window, 0, peer);
}

// NCCL symmetric memory: every rank's allocation reached through the window's flat peer mapping.
Status attach_nccl_symmetric(Communicator& comm, RankState& rank, size_t bytes) {
  ncclDevComm dev_comm{};
  ncclDevCommRequirements requirements{};
  TPFUSE_NCCL_TRY(ncclDevCommCreate(comm.nccl, &requirements, &dev_comm));
  const int lsa_size = dev_comm.lsaSize;
  TPFUSE_NCCL_TRY(ncclDevCommDestroy(comm.nccl, &dev_comm));
  if (lsa_size != comm.world_size) {
    return Status::Unsupported("NCCL reaches only " + std::to_string(lsa_size) + " of " +
                               std::to_string(comm.world_size) + " ranks by load/store (not one NVLink domain)");
  }
  void* allocation = nullptr;
  TPFUSE_NCCL_TRY(ncclMemAlloc(&allocation, bytes));
  TPFUSE_NCCL_TRY(ncclCommWindowRegister(comm.nccl, allocation, bytes, &comm.window, NCCL_WIN_COLL_SYMMETRIC));
  TPFUSE_RETURN_IF_ERROR(init_rank(comm, rank, allocation));
  void** peers = nullptr;
  TPFUSE_CUDA_TRY(cudaMalloc(&peers, sizeof(void*) * kMaxWorldSize));
  peer_pointers_kernel<<<1, 1>>>(comm.window, comm.world_size, peers);
  std::array<void*, kMaxWorldSize> host{};
  const cudaError_t err = cudaMemcpy(host.data(), peers, sizeof(void*) * kMaxWorldSize, cudaMemcpyDeviceToHost);
  cudaFree(peers);
  TPFUSE_CUDA_TRY(err);
  for (int r = 0; r < comm.world_size; ++r) {
    rank.data_at[r] = host[r];
    rank.flags_at[r] = flags_in(host[r], comm);
    rank.counts_at[r] = counts_in(host[r], comm);
  }
  return Status::Ok();
}
#endif  // TPFUSE_NCCL_DEVICE_API

// CUDA IPC: each rank exports its allocation; the handles travel through an NCCL all-gather.
Status attach_cuda_ipc(Communicator& comm, RankState& rank, size_t bytes) {
  void* allocation = nullptr;
  TPFUSE_CUDA_TRY(cudaMalloc(&allocation, bytes));
  TPFUSE_RETURN_IF_ERROR(init_rank(comm, rank, allocation));
  cudaIpcMemHandle_t* handles = nullptr;
  TPFUSE_CUDA_TRY(cudaMalloc(&handles, sizeof(cudaIpcMemHandle_t) * comm.world_size));
  cudaIpcMemHandle_t mine{};
  TPFUSE_CUDA_TRY(cudaIpcGetMemHandle(&mine, allocation));
  TPFUSE_CUDA_TRY(cudaMemcpy(handles + rank.rank, &mine, sizeof(mine), cudaMemcpyHostToDevice));
  TPFUSE_NCCL_TRY(ncclAllGather(handles + rank.rank, handles, sizeof(mine), ncclUint8, comm.nccl, nullptr));
  std::vector<cudaIpcMemHandle_t> all(comm.world_size);
  const cudaError_t err = cudaMemcpy(all.data(), handles, sizeof(mine) * comm.world_size, cudaMemcpyDeviceToHost);
  cudaFree(handles);
  TPFUSE_CUDA_TRY(err);
  for (int r = 0; r < comm.world_size; ++r) {
    void* peer = allocation;
    if (r != rank.rank) {
      TPFUSE_CUDA_TRY(cudaIpcOpenMemHandle(&peer, all[r], cudaIpcMemLazyEnablePeerAccess));
      comm.ipc_opened.push_back(peer);
    }
    rank.data_at[r] = peer;
    rank.flags_at[r] = flags_in(peer, comm);
    rank.counts_at[r] = counts_in(peer, comm);
  }
  return Status::Ok();
}

void release(Communicator* comm) {
  for (void* peer : comm->ipc_opened) cudaIpcCloseMemHandle(peer);
  for (RankState& rank : comm->ranks) {
    cudaSetDevice(rank.device);
    if (rank.error_host != nullptr) cudaFreeHost(rank.error_host);
    if (rank.allocation == nullptr) continue;
#if TPFUSE_NCCL_DEVICE_API
    if (comm->transport == Transport::kNcclSymmetric) {
      if (comm->window != nullptr) ncclCommWindowDeregister(comm->nccl, comm->window);
      ncclMemFree(rank.allocation);
      continue;
    }
#endif
    cudaFree(rank.allocation);
  }
  delete comm;
}

}  // namespace

const char* to_string(Transport transport) {
  switch (transport) {
    case Transport::kLocal: return "local";
    case Transport::kNcclSymmetric: return "nccl-symmetric";
    case Transport::kCudaIpc: return "cuda-ipc";
  }
  return "unknown";
}

Status create_local_workspace(const int* devices, int num_ranks, const CommunicatorOptions& options,
                              const WorkspaceSize& size, Communicator** out) {
  if (out == nullptr) return Status::InvalidArgument("out must not be null");
  if (devices == nullptr) return Status::InvalidArgument("devices must not be null");
  *out = nullptr;
  TPFUSE_RETURN_IF_ERROR(check_options(options, num_ranks));
  int device_count = 0;
  TPFUSE_CUDA_TRY(cudaGetDeviceCount(&device_count));
  for (int r = 0; r < num_ranks; ++r) {
    if (devices[r] < 0 || devices[r] >= device_count) {
      return Status::InvalidArgument("devices[" + std::to_string(r) + "] = " + std::to_string(devices[r]) +
                                     " is not a visible device (" + std::to_string(device_count) + " visible)");
    }
  }
  auto comm = std::unique_ptr<Communicator, void (*)(Communicator*)>(new Communicator, release);
  comm->transport = Transport::kLocal;
  TPFUSE_RETURN_IF_ERROR(set_sizes(options, num_ranks, size, comm.get()));
  comm->ranks.resize(num_ranks);
  for (int r = 0; r < num_ranks; ++r) {
    RankState& rank = comm->ranks[r];
    rank.rank = r;
    rank.device = devices[r];
    TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
    void* allocation = nullptr;
    TPFUSE_CUDA_TRY(cudaMalloc(&allocation, allocation_bytes(*comm)));
    TPFUSE_RETURN_IF_ERROR(init_rank(*comm, rank, allocation));
  }
  for (RankState& rank : comm->ranks) {
    TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
    for (const RankState& peer : comm->ranks) {
      if (peer.device != rank.device) {
        int can_access = 0;
        TPFUSE_CUDA_TRY(cudaDeviceCanAccessPeer(&can_access, rank.device, peer.device));
        if (!can_access) {
          return Status::Unsupported("device " + std::to_string(rank.device) + " cannot access device " +
                                     std::to_string(peer.device) + " (no peer access)");
        }
        const cudaError_t err = cudaDeviceEnablePeerAccess(peer.device, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();
        } else {
          TPFUSE_CUDA_TRY(err);
        }
      }
      rank.data_at[peer.rank] = peer.data;
      rank.flags_at[peer.rank] = peer.flags;
      rank.counts_at[peer.rank] = peer.counts;
    }
  }
  *out = comm.release();
  return Status::Ok();
}

Status create_nccl_workspace(ncclComm_t nccl, const CommunicatorOptions& options, const WorkspaceSize& size,
                             Communicator** out) {
  if (out == nullptr) return Status::InvalidArgument("out must not be null");
  if (nccl == nullptr) return Status::InvalidArgument("comm must not be null");
  *out = nullptr;
  int world_size = 0, rank_id = 0, device = 0;
  TPFUSE_NCCL_TRY(ncclCommCount(nccl, &world_size));
  TPFUSE_NCCL_TRY(ncclCommUserRank(nccl, &rank_id));
  TPFUSE_NCCL_TRY(ncclCommCuDevice(nccl, &device));
  TPFUSE_RETURN_IF_ERROR(check_options(options, world_size));
  TPFUSE_CUDA_TRY(cudaSetDevice(device));

  auto comm = std::unique_ptr<Communicator, void (*)(Communicator*)>(new Communicator, release);
  comm->nccl = nccl;
  TPFUSE_RETURN_IF_ERROR(set_sizes(options, world_size, size, comm.get()));
  comm->ranks.resize(1);
  comm->ranks[0].rank = rank_id;
  comm->ranks[0].device = device;
  const size_t bytes = allocation_bytes(*comm);

#if TPFUSE_NCCL_DEVICE_API
  comm->transport = Transport::kNcclSymmetric;
  Status symmetric = attach_nccl_symmetric(*comm, comm->ranks[0], bytes);
  if (!symmetric.ok()) {
    if (debug_enabled()) std::fprintf(stderr, "tpfuse: NCCL symmetric memory unavailable (%s); using CUDA IPC\n",
                                      symmetric.to_string().c_str());
    // Every rank takes the same branch: registration and the LSA check are collective.
    if (comm->window != nullptr) ncclCommWindowDeregister(nccl, comm->window);
    if (comm->ranks[0].allocation != nullptr) ncclMemFree(comm->ranks[0].allocation);
    if (comm->ranks[0].error_host != nullptr) cudaFreeHost(comm->ranks[0].error_host);
    comm->window = nullptr;
    comm->ranks[0] = RankState{};
    comm->ranks[0].rank = rank_id;
    comm->ranks[0].device = device;
    comm->transport = Transport::kCudaIpc;
    TPFUSE_RETURN_IF_ERROR(attach_cuda_ipc(*comm, comm->ranks[0], bytes));
  }
#else
  // Built without NCCL's device API (the Python package): peers' addresses from CUDA IPC, which needs
  // NCCL's host API only.
  comm->transport = Transport::kCudaIpc;
  TPFUSE_RETURN_IF_ERROR(attach_cuda_ipc(*comm, comm->ranks[0], bytes));
#endif
  if (debug_enabled()) {
    std::fprintf(stderr, "tpfuse: communicator rank %d of %d on device %d, transport %s, %zu bytes\n", rank_id,
                 world_size, device, to_string(comm->transport), bytes);
  }
  *out = comm.release();
  return Status::Ok();
}

size_t workspace_bytes(const Communicator& comm) { return allocation_bytes(comm); }

void* parity_data(const Communicator& comm, int local_rank, int parity) {
  return static_cast<uint8_t*>(comm.ranks[local_rank].data) + size_t(parity) * comm.parity.data_bytes;
}

Status communicator_destroy(Communicator* comm) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  for (const RankState& rank : comm->ranks) {
    TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
    TPFUSE_CUDA_TRY(cudaDeviceSynchronize());
  }
  release(comm);
  return Status::Ok();
}

Status communicator_status(const Communicator* comm) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  for (const RankState& rank : comm->ranks) {
    const volatile PeerError* error = rank.error_host;
    if (error->code != 0) {
      return Status(StatusCode::kPeerTimeout,
                    "rank " + std::to_string(error->waiting_rank) + " waited more than " +
                        std::to_string(double(comm->timeout_ns) / 1e9) + " s for rank " +
                        std::to_string(error->missing_rank) + "'s data of rows " + std::to_string(error->row) +
                        ".., columns " + std::to_string(error->col) +
                        ".. (the peer never arrived); the communicator is unusable, destroy it");
    }
  }
  return Status::Ok();
}

Status check_call_ranks(const Communicator& comm, int problem_world_size, const std::vector<int>& local_ranks) {
  if (problem_world_size != comm.world_size) {
    return Status::InvalidArgument("problem.world_size = " + std::to_string(problem_world_size) +
                                   " differs from the communicator's " + std::to_string(comm.world_size) + " ranks");
  }
  if (local_ranks.empty()) return Status::InvalidArgument("no local rank to launch");
  for (int rank : local_ranks) {
    if (rank < 0 || rank >= int(comm.ranks.size())) {
      return Status::InvalidArgument("local rank " + std::to_string(rank) + " is not one of the " +
                                     std::to_string(comm.ranks.size()) + " ranks of this process");
    }
  }
  return communicator_status(&comm);
}

}  // namespace tpfuse
