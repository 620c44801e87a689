// The fused GEMM + reduce-scatter kernel: the shared persistent mainloop with the push/reduce
// epilogue. One launch runs one rank on its GPU, or several ranks emulated on one GPU (each rank
// gets ctas_per_rank consecutive CTAs; the launch is cooperative so that all of them are resident).
#pragma once

#include "kernels/gemm_mainloop.cuh"
#include "kernels/push_reduce_epilogue.cuh"

namespace tpfuse::kernels {

struct FusedRankParams {
  MainloopParams mainloop;
  PushReduceParams epilogue;
  uint32_t* epoch_counter;  // calls completed on this rank (epilogue.epoch_counter, writable)
  uint32_t* done_counter;   // CTAs of this rank done with the current call
};

template <int kLocalRanks>
struct FusedLaunch {
  int ctas_per_rank;
  FusedRankParams ranks[kLocalRanks];
};

template <class Config>
__device__ __forceinline__ void run_rank(const FusedRankParams& rank, int cta, int ctas_per_rank) {
  run_persistent<Config, PushReduceEpilogue<Config>>(rank.mainloop, rank.epilogue, aligned_shared_storage<Config>(), cta,
                                             ctas_per_rank);
  __syncthreads();
  // The last CTA of this rank to finish advances the epoch: the next call (stream-ordered after this
  // one) uses the next epoch and the other parity, with no host involvement (CUDA-graph friendly).
  // Every CTA read the epoch at its start, before this point.
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(rank.done_counter, 1u) == uint32_t(ctas_per_rank - 1)) {
      *rank.done_counter = 0;
      atomicAdd(rank.epoch_counter, 1u);
    }
  }
}

template <class Config, int kLocalRanks>
__global__ void __launch_bounds__(Config::kThreads, 1) fused_kernel(const __grid_constant__ FusedLaunch<kLocalRanks> launch) {
  // NOTE: a rank indexed at run time makes every parameter access a global load; a real rank (one
  // per launch) is indexed at compile time, so its parameters stay in the constant bank.
  if constexpr (kLocalRanks == 1) {
    run_rank<Config>(launch.ranks[0], blockIdx.x, launch.ctas_per_rank);
  } else {
    run_rank<Config>(launch.ranks[blockIdx.x / launch.ctas_per_rank], blockIdx.x % launch.ctas_per_rank,
                     launch.ctas_per_rank);
  }
}

}  // namespace tpfuse::kernels
