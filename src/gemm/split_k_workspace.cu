#include "gemm/split_k_workspace.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/cuda_check.h"
#include "gemm/split_k.h"

namespace tpfuse {
namespace {

struct Allocation {
  int device = 0;
  int max_steps = 0;
  void* base = nullptr;  // the counters, then the partials
  SplitKWorkspace workspace;
};

// Every workspace of the process, by (device, stream id), freed at exit (where the CUDA runtime is
// already gone, the driver frees them with the context).
class Workspaces {
 public:
  ~Workspaces() {
    for (auto& [key, allocation] : allocations_) {
      if (cudaSetDevice(allocation.device) == cudaSuccess) cudaFree(allocation.base);
    }
  }

  std::mutex mutex;

  Allocation* find(int device, unsigned long long stream_id) {
    auto it = allocations_.find({device, stream_id});
    return it == allocations_.end() ? nullptr : &it->second;
  }
  Allocation& add(int device, unsigned long long stream_id, const Allocation& allocation) {
    return allocations_[{device, stream_id}] = allocation;
  }

 private:
  std::map<std::pair<int, unsigned long long>, Allocation> allocations_;
};

Workspaces& workspaces() {
  static Workspaces all;
  return all;
}

// Lets this thread allocate and synchronize while a stream it captures waits: the allocation and its
// zeroing are the library's, not operations of the graph.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Allocates a workspace on the current device, its counters zeroed before this returns (on a stream
// of its own, so that a stream being captured is not involved).
Status allocate(int device, int max_steps, Allocation* out) {
  const SplitKWorkspaceSize size = split_k_workspace_size(max_steps);
  RelaxedCapture relaxed;
  Allocation a;
  a.device = device;
  a.max_steps = max_steps;
  TPFUSE_CUDA_TRY(cudaMalloc(&a.base, size.counter_bytes + size.partial_bytes));
  cudaStream_t zeroing = nullptr;
  Status s = cuda_status(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
                         __FILE__, __LINE__);
  if (s.ok()) {
    s = cuda_status(cudaMemsetAsync(a.base, 0, size.counter_bytes, zeroing), "cudaMemsetAsync", __FILE__, __LINE__);
    if (s.ok()) s = cuda_status(cudaStreamSynchronize(zeroing), "cudaStreamSynchronize", __FILE__, __LINE__);
    cudaStreamDestroy(zeroing);
  }
  if (!s.ok()) {
    cudaFree(a.base);
    return s;
  }
  a.workspace.splits_done = static_cast<uint32_t*>(a.base);
  a.workspace.partials = reinterpret_cast<float*>(static_cast<uint8_t*>(a.base) + size.counter_bytes);
  *out = a;
  return Status::Ok();
}

}  // namespace

Status split_k_workspace(cudaStream_t stream, int max_steps, SplitKWorkspace* workspace) {
  int device = 0;
  TPFUSE_CUDA_TRY(cudaGetDevice(&device));
  // The stream's handle names it (cudaStreamGetId is refused while a stream is captured).
  const unsigned long long stream_id = reinterpret_cast<uintptr_t>(stream);
  Workspaces& all = workspaces();
  std::lock_guard<std::mutex> lock(all.mutex);
  const Allocation* found = all.find(device, stream_id);
  if (found == nullptr) {
    Allocation allocation;
    TPFUSE_RETURN_IF_ERROR(allocate(device, max_steps, &allocation));
    found = &all.add(device, stream_id, allocation);
  }
  if (found->max_steps < max_steps) {
    return Status::Internal("the split GEMM's workspace holds " + std::to_string(found->max_steps) + " steps, the call needs " +
                            std::to_string(max_steps));
  }
  *workspace = found->workspace;
  return Status::Ok();
}

}  // namespace tpfuse
