// Moving a finished slab out of the accumulators: registers -> BF16 in swizzled shared memory ->
// TMA store, in 64 x 64 chunks, double-buffered per consumer warpgroup. Shared by every epilogue.
#pragma once

#include <cuda_bf16.h>

#include "kernels/gemm_mainloop.cuh"
#include "kernels/ptx.cuh"

namespace tpfuse::kernels {

// Accumulator element i of a m64nNk16 WGMMA, for this thread of the warpgroup:
//   row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2),   col = 8 * (i / 4) + 2 * (lane % 4) + i % 2
// Chunk c holds columns [64c, 64c + 64): accumulator elements [32c, 32c + 32).
//
// Rounds one chunk of accumulators to BF16 and writes it to a
// 64 x 64 buffer in the TMA SWIZZLE_128B layout: 128-byte rows whose 16-byte pieces are permuted by
// (piece ^ row % 8), which also keeps the warp's stores free of bank conflicts.
__device__ __forceinline__ void stage_chunk_bf16(const float* acc_chunk, __nv_bfloat16* buffer) {
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  uint8_t* base = reinterpret_cast<uint8_t*>(buffer);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * warp + lane / 4 + 8 * half;
      const __nv_bfloat162 pair = __floats2bfloat162_rn(acc_chunk[4 * j + 2 * half], acc_chunk[4 * j + 2 * half + 1]);
      const int offset = row * 128 + ((j ^ (row % 8)) << 4) + (lane % 4) * 4;
      *reinterpret_cast<__nv_bfloat162*>(base + offset) = pair;
    }
  }
}

// The double-buffered chunk pipeline of one consumer warpgroup.
class ChunkStore {
 public:
  __device__ ChunkStore(int consumer, __nv_bfloat16 (*buffers)[kChunkElems]) : consumer_(consumer), buffers_(buffers) {}

  __device__ bool leader() const { return threadIdx.x % 128 == 0; }
  __device__ void sync() const { ptx::named_barrier_sync(1 + consumer_, 128); }

  // Stages accumulator chunk `acc_chunk` in a free buffer, then the leader issues the store of that
  // buffer (`issue_store(buffer)`) as one bulk group.
  template <class StoreFn>
  __device__ void store(const float* acc_chunk, StoreFn&& issue_store) {
    __nv_bfloat16* buffer = buffers_[count_ % kChunkBuffers];
    // The store that last used this buffer must have finished reading it.
    if (leader()) ptx::bulk_wait_group_read<kChunkBuffers - 1>();
    sync();
    stage_chunk_bf16(acc_chunk, buffer);
    // NOTE: generic-proxy smem writes -> proxy fence in every writer -> barrier -> TMA store.
    ptx::fence_proxy_async_shared();
    sync();
    if (leader()) {
      issue_store(buffer);
      ptx::bulk_commit_group();
    }
    ++count_;
  }

  // Waits until every store issued so far has landed in global memory (not only read its source).
  __device__ void drain() const {
    if (leader()) ptx::bulk_wait_group<0>();
  }

 private:
  int consumer_;
  __nv_bfloat16 (*buffers_)[kChunkElems];
  int count_ = 0;
};

// The plain GEMM's epilogue: store the tile into C (m x n) on this GPU.
class StoreTileEpilogue {
 public:
  struct Params {
    CUtensorMap c;  // m x n, row-major BF16, box 64 x 64, SWIZZLE_128B
  };

  __device__ StoreTileEpilogue(const Params& params, int consumer, __nv_bfloat16 (*buffers)[kChunkElems])
      : params_(params), chunks_(consumer, buffers) {}

  template <class Config>
  __device__ void store(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread]) {
    const int row = tile.row_begin + slab.row;
    // A slab past the tile's last row (a 64-row segment in a 128-row tile) has nothing to store;
    // rows past m inside a slab are clipped by the TMA store.
    if (row >= tile.row_end) return;
#pragma unroll
    for (int c = 0; c < Config::kWgCols / kChunkCols; ++c) {
      const int col = tile.col_begin + slab.col + c * kChunkCols;
      if (col < tile.col_end) {
        chunks_.store(acc + c * 32, [&](const __nv_bfloat16* buffer) { ptx::tma_store_2d(&params_.c, buffer, col, row); });
      }
    }
  }

  __device__ void finish() { chunks_.drain(); }

 private:
  const Params& params_;
  ChunkStore chunks_;
};

}  // namespace tpfuse::kernels
