// The fused GEMM + reduce-scatter kernel: the shared persistent mainloop with the push/reduce
// epilogue over the rank's schedule. One launch runs one rank on its GPU, or several ranks emulated
// on one GPU (each rank gets ctas_per_rank consecutive CTAs; the launch is cooperative so that all
// of them are resident).
#pragma once

#include "comm/device.cuh"
#include "gemm/mainloop.cuh"
#include "ops/gemm_rs/epilogue.cuh"
#include "ops/gemm_rs/shared_tiles.cuh"
#include "ops/gemm_rs/schedule.h"

namespace tpfuse::kernels {

struct GemmRsRankParams {
  MainloopParams<TileSchedule> mainloop;
  PushReduceParams epilogue;
  uint64_t* calls;  // calls completed on this rank, in the high word (epilogue.calls, writable)
};

template <int kLocalRanks>
struct GemmRsLaunch {
  int ctas_per_rank;
  GemmRsRankParams ranks[kLocalRanks];
};

template <class Config, class Epilogue>
__device__ __forceinline__ void run_rank(const GemmRsRankParams& rank, int cta, int ctas_per_rank) {
  if constexpr (Epilogue::kRecordsTimeline) {
    if (threadIdx.x == 0) atomicMin(&rank.epilogue.timeline->start_ns, ptx::globaltimer_ns());
  }
  run_persistent<Config, Epilogue>(rank.mainloop, rank.epilogue, aligned_shared_storage<Config>(), cta, ctas_per_rank);
  // Every thread of the CTA has read the epoch (at its start) before the CTA adds its share. The
  // next call (stream-ordered after this one) uses the next epoch and the other parity.
  __syncthreads();
  if (threadIdx.x == 0) {
    comm::finish_call(rank.calls, cta, ctas_per_rank);
    if constexpr (Epilogue::kRecordsTimeline) atomicMax(&rank.epilogue.timeline->end_ns, ptx::globaltimer_ns());
  }
}

// Epilogue: PushReduceEpilogue<false, r> (tiles of one owner's rows), PushReduceEpilogue<true, r> (of
// several, staged) or SharedTileEpilogue<r> (of several, from registers); r: whether it records its
// pushes (the testing library's instantiation only).
template <class Config, int kLocalRanks, class Epilogue>
__global__ void __launch_bounds__(Config::kThreads, 1) gemm_rs_kernel(const __grid_constant__ GemmRsLaunch<kLocalRanks> launch) {
  // NOTE: a rank indexed at run time makes every parameter access a global load; a real rank (one
  // per launch) is indexed at compile time, so its parameters stay in the constant bank.
  if constexpr (kLocalRanks == 1) {
    run_rank<Config, Epilogue>(launch.ranks[0], blockIdx.x, launch.ctas_per_rank);
  } else {
    run_rank<Config, Epilogue>(launch.ranks[blockIdx.x / launch.ctas_per_rank], blockIdx.x % launch.ctas_per_rank,
                     launch.ctas_per_rank);
  }
}

}  // namespace tpfuse::kernels
