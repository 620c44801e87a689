// An own slab parked for a reducer CTA (ops/gemm_rs/reducer.cuh): the consumer's FP32 accumulators
// in the call's parked tiles (ops/gemm_rs/workspace.h), piece q of thread t at [q * 128 + t] as the
// split GEMM's partials (gemm/split_k_epilogue.cuh), and the slab's counter: 1 once parked, 0 again
// once the reducer has seen it, so that every call finds 0.
#pragma once

#include <cuda_runtime.h>

#include "core/ptx.cuh"
#include "gemm/mainloop.cuh"

namespace tpfuse::kernels {

template <class Config>
class ParkedSlab {
 public:
  // Params: the reduce-scatter's (ops/gemm_rs/epilogue.cuh); tile: an own tile; parity: the call's.
  template <class Params>
  __device__ ParkedSlab(const Params& p, const Tile& tile, int consumer, int parity) {
    const int row_tile = tile.segment_row / Config::kBlockM;  // constants: no division
    const int slot = (row_tile * p.col_tiles + tile.col_begin / Config::kBlockN) * Config::kConsumers + consumer;
    pieces_ = reinterpret_cast<float4*>(p.parked[parity] + size_t(slot) * 128 * Config::kAccPerThread) + threadIdx.x % 128;
    counter_ = p.parked_counts[parity] + slot;
  }

  // Whether the slab holds any of the tile's rows and columns: an empty one is neither parked nor awaited.
  __device__ static bool holds_rows(const Tile& tile, Slab<Config> slab) {
    return tile.row_begin + slab.row < tile.row_end && tile.col_begin + slab.col < tile.col_end;
  }

  __device__ void write(const float (&acc)[Config::kAccPerThread]) const {
#pragma unroll
    for (int q = 0; q < Config::kAccPerThread / 4; ++q) {
      __stcg(pieces_ + q * 128, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
    }
  }

  __device__ void read(float (&acc)[Config::kAccPerThread]) const {
#pragma unroll
    for (int q = 0; q < Config::kAccPerThread / 4; ++q) {
      const float4 piece = __ldcg(pieces_ + q * 128);
      acc[4 * q] = piece.x;
      acc[4 * q + 1] = piece.y;
      acc[4 * q + 2] = piece.z;
      acc[4 * q + 3] = piece.w;
    }
  }

  // The leader thread, once every thread of the warpgroup has written its part (the caller's barrier).
  __device__ void count_in() const {
    // NOTE: release: the warpgroup's pieces (ordered before by the barrier) before the count.
    ptx::fence_acq_rel_gpu();
    ptx::store_relaxed_gpu(counter_, 1);
  }

  __device__ bool parked() const { return ptx::load_relaxed_sys(counter_) == 1; }

  // The reducer's thread, once it has seen the slab parked: acquire its pieces, set the counter back.
  __device__ void take() const {
    ptx::fence_acq_rel_gpu();
    ptx::store_relaxed_gpu(counter_, 0);
  }

 private:
  float4* pieces_;
  uint32_t* counter_;
};

}  // namespace tpfuse::kernels
