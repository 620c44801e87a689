// Where the split GEMM's workspace lives (its layout: gemm/split_k.h): one per device and stream,
// allocated (its counters zeroed) on the first split call on that stream, kept for the process and
// freed at its exit. Each call leaves the counters at 0 again, so no call resets them: back-to-back
// calls and CUDA-graph replays need nothing from the host. Streams have their own, so that calls
// on different streams may overlap. NOTE: a graph captured from a stream keeps that stream's
// workspace: its replays must not overlap one another or split calls on that stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gemm/split_k.h"

#include "tpfuse/status.h"

namespace tpfuse {

struct SplitKWorkspace {
  float* partials = nullptr;
  uint32_t* splits_done = nullptr;
};

// The workspace of `stream` on the current device, for at most `max_steps` steps (the device's SMs:
// the config never asks for more). The first call on a stream allocates it, also while the stream
// is being captured (the allocation is the library's, not the graph's).
Status split_k_workspace(cudaStream_t stream, int max_steps, SplitKWorkspace* workspace);

// Emulated rank i's part of one stream's workspace, where each of the ranks on the GPU has at most
// steps_per_rank steps (its CTAs): its own partials and counters.
inline SplitKWorkspace emulated_rank_part(const SplitKWorkspace& workspace, int i, int steps_per_rank) {
  SplitKWorkspace part = workspace;
  if (workspace.partials != nullptr) {
    part.partials += size_t(i) * steps_per_rank * max_tile_accumulators();
    part.splits_done += size_t(i) * steps_per_rank * kConsumers;
  }
  return part;
}

}  // namespace tpfuse
