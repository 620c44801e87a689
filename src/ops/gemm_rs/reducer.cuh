// Reducer CTAs: where the config gives them (ops/gemm_rs/config.cpp), the last `reducers` CTAs of a
// rank reduce its own tiles and the others run the GEMM. A GEMM CTA parks an own tile's FP32
// accumulators (ops/gemm_rs/parked_slab.cuh) instead of reducing it, and goes on to its next tile;
// so the tensor cores never wait for a peer's partial, nor for the loads and adds of the reduction.
//
//   GEMM CTA:     ... foreign tile: push   own tile j: park (FP32, L2), count in   foreign tile ...
//   reducer r:    own tiles j = r, r + R, ...: wait for the parked slabs and the peers' flags,
//                 stream the P-1 partials through the ring, add them to the parked FP32 sum in rank
//                 order, round once, store into the output
//
// The sum is the one an own tile reduced where it is computed would get without partial rounds:
// round_bf16(((acc + p_0) + p_1) + ...), p_j the peers in rank order, whichever CTA adds it. The
// reducers take the own tiles in their order in the schedule (one a round), each CTA every R-th, with
// the GEMM CTAs' producer, sender and consumer roles on them: the same ring, extra stages and
// hand-offs as an own tile's epilogue, with no K stages before.
#pragma once

#include "gemm/mainloop.cuh"
#include "ops/gemm_rs/epilogue.cuh"
#include "ops/gemm_rs/schedule.h"

namespace tpfuse::kernels {

// Reducer `reducer` of `num_reducers`, on the own tiles of `schedule`. Every thread returns (none
// exits early), as from run_persistent.
template <class Config, class Epilogue>
__device__ __forceinline__ void run_reducer(const TileSchedule& schedule, const PushReduceParams& p,
                                            StorageOf<Config>& smem, int reducer, int num_reducers) {
  init_barriers<Config, Epilogue>(smem);
  const int num_own = schedule.tiles_per_band();
  if (threadIdx.x < 128) {
    ptx::setmaxnreg_dec<Config::kProducerRegs>();
    if (threadIdx.x == 0) {
      const uint32_t epoch = comm::call_epoch(p.calls);
      StageCursor ring;
      for (int t = reducer; t < num_own; t += num_reducers) {
        Epilogue::template load_parked_tile<Config>(p, schedule.own_tile(t), epoch, smem, ring);
      }
    }
    if (threadIdx.x == 32) {
      const int num_tiles = reducer < num_own ? (num_own - reducer + num_reducers - 1) / num_reducers : 0;
      Epilogue::template send_reduced<Config>(p, smem, num_tiles);
    }
  } else {
    ptx::setmaxnreg_inc<Config::kConsumerRegs>();
    const int consumer = threadIdx.x / 128 - 1;
    Epilogue epilogue(p, consumer, smem);
    float acc[Config::kAccPerThread];
    StageCursor ring;
    for (int t = reducer; t < num_own; t += num_reducers) {
      epilogue.template reduce_parked<Config>(schedule.own_tile(t), Slab<Config>::of_consumer(consumer), acc, smem,
                                              ring);
    }
  }
}

}  // namespace tpfuse::kernels
