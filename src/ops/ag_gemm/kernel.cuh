// The all-gather + GEMM kernel: the shared persistent mainloop over the rank's schedule
// (ops/ag_gemm/schedule.h) with the all-gather epilogue policy. One launch runs one rank on its GPU,
// or several ranks emulated on one GPU (ctas_per_rank consecutive CTAs each, cooperative).
#pragma once

#include "comm/device.cuh"
#include "gemm/mainloop.cuh"
#include "ops/ag_gemm/epilogue.cuh"
#include "ops/ag_gemm/schedule.h"

namespace tpfuse::kernels {

struct AllGatherRankParams {
  MainloopParams<AllGatherSchedule> mainloop;
  AllGatherEpilogue::Params epilogue;
  uint64_t* calls;  // calls completed on this rank, in the high word (epilogue.calls, writable)
};

template <int kLocalRanks>
struct AllGatherLaunch {
  int ctas_per_rank;
  AllGatherRankParams ranks[kLocalRanks];
};

template <class Config>
__device__ __forceinline__ void run_all_gather_rank(const AllGatherRankParams& rank, int cta, int ctas_per_rank) {
  run_persistent<Config, AllGatherEpilogue>(rank.mainloop, rank.epilogue, aligned_shared_storage<Config>(), cta,
                                            ctas_per_rank);
  // Every thread of the CTA has read the epoch before the CTA adds its share (comm/epoch.h).
  __syncthreads();
  if (threadIdx.x == 0) comm::finish_call(rank.calls, cta, ctas_per_rank);
}

template <class Config, int kLocalRanks>
__global__ void __launch_bounds__(Config::kThreads, 1)
    all_gather_kernel(const __grid_constant__ AllGatherLaunch<kLocalRanks> launch) {
  // NOTE: as the reduce-scatter's kernel: a real rank's parameters are indexed at compile time.
  if constexpr (kLocalRanks == 1) {
    run_all_gather_rank<Config>(launch.ranks[0], blockIdx.x, launch.ctas_per_rank);
  } else {
    run_all_gather_rank<Config>(launch.ranks[blockIdx.x / launch.ctas_per_rank], blockIdx.x % launch.ctas_per_rank,
                                launch.ctas_per_rank);
  }
}

// After a call: its gathered X (this rank's buffer, the parity of the call that just completed, whose
// halves are parity_bytes apart: [source][row of its segment][k]) into the caller's m x k buffer,
// each row where `sequences` puts it (every source's rows in a row, with one sequence). Stream-ordered
// after the call, so every piece has landed. Rows of `vectors` 16-byte vectors; `by_segment` divides
// by a segment's rows.
// NOTE: static: the library and the testing library (its emulated ranks) each compile this header,
// and a program links both.
static __global__ void copy_gathered_kernel(const uint8_t* gathered, size_t parity_bytes, const uint64_t* calls,
                                            uint8_t* out, int rows, int vectors, FastDivision by_segment,
                                            SequenceRows sequences) {
  const uint32_t completed_epoch = epoch_of(*calls) - 1;
  const uint4* src = reinterpret_cast<const uint4*>(gathered + size_t(completed_epoch & 1) * parity_bytes);
  uint4* dst = reinterpret_cast<uint4*>(out);
  const int segment_rows = by_segment.divisor();
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const int source = by_segment.div(row);
    const size_t to = size_t(sequences.row_of(source, row - source * segment_rows)) * vectors;
    for (int v = threadIdx.x; v < vectors; v += blockDim.x) dst[to + v] = src[size_t(row) * vectors + v];
  }
}

}  // namespace tpfuse::kernels
