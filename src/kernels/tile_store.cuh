// Moving a finished slab out of the accumulators: registers -> BF16 in swizzled shared memory ->
// TMA stores, one 64 x 64 chunk per buffer, the whole slab as one bulk group. Shared by every
// epilogue.
#pragma once

#include <cuda_bf16.h>

#include "kernels/gemm_mainloop.cuh"
#include "kernels/ptx.cuh"

namespace tpfuse::kernels {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Accumulator element i of a m64nNk16 WGMMA, for this thread of the warpgroup:
//   row = 16 * warp + lane / 4 + 8 * ((i / 2) % 2),   col = 8 * (i / 4) + 2 * (lane % 4) + i % 2
// so each group of 4 elements is this thread's piece of two 8x8 matrices (rows 0-7 and 8-15 of an
// 8-column block), the layout stmatrix takes. Chunk c holds columns [64c, 64c + 64): accumulator
// elements [32c, 32c + 32).
//
// A chunk buffer is 64 x 64 BF16 in the TMA SWIZZLE_128B layout: 128-byte rows whose 16-byte pieces
// are permuted by (piece ^ row % 8), which also keeps stmatrix/ldmatrix free of bank conflicts.
// This thread's stmatrix/ldmatrix address for column-block pair p: it addresses row (lane % 8) of
// matrix (lane / 8), i.e. rows 0-7 or 8-15 of column block 2p + (lane / 16).
__device__ __forceinline__ uint32_t chunk_matrix_addr(const __nv_bfloat16* buffer, int pair) {
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const int row = 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;
  const int block = 2 * pair + lane / 16;
  return ptx::smem_addr(buffer) + row * 128 + ((block ^ (row % 8)) << 4);
}

// Rounds one chunk of accumulators to BF16 into a chunk buffer.
__device__ __forceinline__ void stage_chunk_bf16(const float* acc_chunk, __nv_bfloat16* buffer) {
#pragma unroll
  for (int pair = 0; pair < 4; ++pair) {
    const float* a = acc_chunk + 8 * pair;  // blocks 2p and 2p + 1: elements [8p, 8p + 8)
    ptx::stmatrix_x4(chunk_matrix_addr(buffer, pair), pack_bf16x2(a[0], a[1]), pack_bf16x2(a[2], a[3]),
                     pack_bf16x2(a[4], a[5]), pack_bf16x2(a[6], a[7]));
  }
}

// Adds a BF16 chunk buffer to one chunk of accumulators (FP32).
__device__ __forceinline__ void add_chunk_bf16(const __nv_bfloat16* buffer, float* acc_chunk) {
#pragma unroll
  for (int pair = 0; pair < 4; ++pair) {
    uint32_t r[4];
    ptx::ldmatrix_x4(chunk_matrix_addr(buffer, pair), r[0], r[1], r[2], r[3]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // A BF16 is the top half of the FP32 of the same value: one integer op widens each.
      acc_chunk[8 * pair + 2 * i] += __uint_as_float(r[i] << 16);
      acc_chunk[8 * pair + 2 * i + 1] += __uint_as_float(r[i] & 0xffff0000u);
    }
  }
}

// Stores one consumer warpgroup's slabs: all chunks of a slab staged at once, then stored as one
// bulk group by the warpgroup's first thread.
class SlabStore {
 public:
  __device__ SlabStore(int consumer, ChunkBuffers buffers) : consumer_(consumer), buffers_(buffers.data) {}

  __device__ bool leader() const { return threadIdx.x % 128 == 0; }
  __device__ void sync() const { ptx::named_barrier_sync(1 + consumer_, 128); }

  // Rounds chunks [0, num_chunks) of `acc` into the buffers, ready for TMA stores once every thread
  // of the warpgroup has returned. The buffers must be free (their previous stores have read them).
  template <int kMaxChunks>
  __device__ void stage(const float* acc, int num_chunks) {
#pragma unroll
    for (int c = 0; c < kMaxChunks; ++c) {
      if (c < num_chunks) stage_chunk_bf16(acc + 32 * c, buffers_[c]);
    }
    // NOTE: generic-proxy smem writes -> proxy fence in every writer -> barrier -> TMA store.
    ptx::fence_proxy_async_shared();
    sync();
  }

  // Stages chunks [0, num_chunks) of `acc`, then the leader issues store_chunk(c, buffer) for each.
  template <int kMaxChunks, class StoreFn>
  __device__ void store(const float* acc, int num_chunks, StoreFn&& store_chunk) {
    // The previous slab's stores must have finished reading the buffers.
    if (leader()) ptx::bulk_wait_group_read<0>();
    sync();
    stage<kMaxChunks>(acc, num_chunks);
    if (leader()) {
      for (int c = 0; c < num_chunks; ++c) store_chunk(c, buffers_[c]);
      ptx::bulk_commit_group();
    }
  }

  // The same, kBuffers chunks at a time, each batch one bulk group.
  template <int kMaxChunks, int kBuffers, class StoreFn>
  __device__ void store_batched(const float* acc, int num_chunks, StoreFn&& store_chunk) {
#pragma unroll
    for (int first = 0; first < kMaxChunks; first += kBuffers) {
      if (first >= num_chunks) break;
      if (leader()) ptx::bulk_wait_group_read<0>();
      sync();
#pragma unroll
      for (int b = 0; b < kBuffers; ++b) {
        if (first + b < kMaxChunks && first + b < num_chunks) stage_chunk_bf16(acc + 32 * (first + b), buffers_[b]);
      }
      ptx::fence_proxy_async_shared();
      sync();
      if (leader()) {
        for (int b = 0; b < kBuffers && first + b < num_chunks; ++b) store_chunk(first + b, buffers_[b]);
        ptx::bulk_commit_group();
      }
    }
  }

  // Waits until every store issued so far has landed in global memory (not only read its source).
  __device__ void drain() const {
    if (leader()) ptx::bulk_wait_group<0>();
  }

 private:
  int consumer_;
  __nv_bfloat16 (*buffers_)[kChunkElems];
};

// Chunks of a slab starting at column `col_begin` that lie before `col_end`.
template <class Config>
__device__ __forceinline__ int chunks_before(int col_begin, int col_end) {
  const int chunks = (col_end - col_begin + kChunkCols - 1) / kChunkCols;
  return chunks < Config::kWgCols / kChunkCols ? chunks : Config::kWgCols / kChunkCols;
}

// The plain GEMM's epilogue: store the tile into C (m x n) on this GPU.
class StoreTileEpilogue {
 public:
  struct Params {
    CUtensorMap c;  // m x n, row-major BF16, box 64 x 64, SWIZZLE_128B
  };

  // The consumers store their slabs themselves, and there are no inputs to watch.
  static constexpr bool kHasSender = false;
  static constexpr bool kHasWatcher = false;

  __device__ StoreTileEpilogue(const Params& params, int consumer, ChunkBuffers buffers)
      : params_(params), slabs_(consumer, buffers) {}

  // A tile's output needs no input: no extra stages.
  template <class Config>
  __device__ static void produce_extra_stages(const Params&, const Tile&, SharedStorage<Config>&, StageCursor&,
                                              uint32_t&) {}

  // Stores the slab (unless the step is a duplicate that keeps a cluster's pair in lockstep).
  template <class Config>
  __device__ void end_tile(const Work& work, Slab<Config> slab, float (&acc)[Config::kAccPerThread],
                           SharedStorage<Config>&, StageCursor&) {
    if (!work.store) return;
    const Tile& tile = work.tile;
    const int row = tile.row_begin + slab.row;
    const int col = tile.col_begin + slab.col;
    // A slab past the tile's last row (a 64-row segment in a 128-row tile) or column has nothing to
    // store; rows past m inside a slab are clipped by the TMA store.
    if (row >= tile.row_end || col >= tile.col_end) return;
    auto store_chunk = [&](int c, const __nv_bfloat16* buffer) {
      ptx::tma_store_2d(&params_.c, buffer, col + c * kChunkCols, row);
    };
    if constexpr (Config::kStagedChunks < Config::kChunksPerSlab) {
      slabs_.store_batched<Config::kChunksPerSlab, Config::kStagedChunks>(acc, chunks_before<Config>(col, tile.col_end),
                                                                          store_chunk);
    } else {
      slabs_.store<Config::kWgCols / kChunkCols>(acc, chunks_before<Config>(col, tile.col_end), store_chunk);
    }
  }

  __device__ void finish() { slabs_.drain(); }

 private:
  const Params& params_;
  SlabStore slabs_;
};

}  // namespace tpfuse::kernels
