// Moving a finished slab out of the accumulators: registers -> BF16 in swizzled shared memory ->
// TMA stores, one 64 x 64 chunk per buffer; and adding a BF16 chunk back into the accumulators.
// Shared by every epilogue.
#pragma once

#include <cuda_bf16.h>

#include "core/ptx.cuh"
#include "gemm/mainloop.cuh"

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
__device__ __forceinline__ uint32_t chunk_matrix_addr(const void* buffer, int pair) {
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  const int row = 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;
  const int block = 2 * pair + lane / 16;
  return ptx::smem_addr(buffer) + row * 128 + ((block ^ (row % 8)) << 4);
}

// Rounds one chunk of accumulators to BF16 into a chunk buffer.
__device__ __forceinline__ void stage_chunk_bf16(const float* acc_chunk, void* buffer) {
#pragma unroll
  for (int pair = 0; pair < 4; ++pair) {
    const float* a = acc_chunk + 8 * pair;  // blocks 2p and 2p + 1: elements [8p, 8p + 8)
    ptx::stmatrix_x4(chunk_matrix_addr(buffer, pair), pack_bf16x2(a[0], a[1]), pack_bf16x2(a[2], a[3]),
                     pack_bf16x2(a[4], a[5]), pack_bf16x2(a[6], a[7]));
  }
}

// Adds a BF16 chunk buffer to one chunk of accumulators (FP32).
__device__ __forceinline__ void add_chunk_bf16(const void* buffer, float* acc_chunk) {
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

// Adds bias[col] (BF16) to this thread's accumulators of a slab whose columns start at `col_begin`,
// for the columns before `col_end` (those past it are never stored): rows of row halves
// first_half..last_half (0: its rows r, 1: rows r + 8; constants once inlined). In FP32, before the
// slab's one rounding.
template <int kAccPerThread>
__device__ __forceinline__ void add_bias(float (&acc)[kAccPerThread], const uint16_t* bias, int col_begin, int col_end,
                                         int first_half = 0, int last_half = 1) {
  const int lane_col = col_begin + 2 * (threadIdx.x % 4);
#pragma unroll
  for (int block = 0; block < kAccPerThread / 4; ++block) {
    const int col = lane_col + 8 * block;  // even, and n is a multiple of 8: its pair lies before col_end too
    if (col < col_end) {
      const uint32_t pair = __ldg(reinterpret_cast<const unsigned int*>(bias + col));
#pragma unroll
      for (int h = first_half; h <= last_half; ++h) {
        acc[4 * block + 2 * h] += __uint_as_float(pair << 16);
        acc[4 * block + 2 * h + 1] += __uint_as_float(pair & 0xffff0000u);
      }
    }
  }
}

// Stores one consumer warpgroup's slabs: the chunks of a slab are staged as many at a time as there
// are buffers, each batch stored as one bulk group by the warpgroup's first thread.
class SlabStore {
 public:
  __device__ SlabStore(int consumer, ChunkBuffer* buffers) : consumer_(consumer), buffers_(buffers) {}

  __device__ bool leader() const { return threadIdx.x % 128 == 0; }
  __device__ void sync() const { consumer_sync(consumer_); }

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

  // Stages chunks [0, num_chunks) of `acc`, kBuffers at a time; after each batch the leader issues
  // store_chunk(c, buffer) for its chunks.
  template <int kMaxChunks, int kBuffers, class StoreFn>
  __device__ void store(const float* acc, int num_chunks, StoreFn&& store_chunk) {
#pragma unroll
    for (int first = 0; first < kMaxChunks; first += kBuffers) {
      if (first >= num_chunks) break;
      // The stores issued before must have finished reading the buffers.
      if (leader()) ptx::bulk_wait_group_read<0>();
      sync();
      stage<kBuffers>(acc + 32 * first, min(num_chunks - first, kBuffers));
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
  ChunkBuffer* buffers_;
};

// Chunks of a slab starting at column `col_begin` that lie before `col_end`.
template <class Config>
__device__ __forceinline__ int chunks_before(int col_begin, int col_end) {
  const int chunks = (col_end - col_begin + kChunkCols - 1) / kChunkCols;
  return chunks < Config::kWgCols / kChunkCols ? chunks : Config::kWgCols / kChunkCols;
}

}  // namespace tpfuse::kernels
