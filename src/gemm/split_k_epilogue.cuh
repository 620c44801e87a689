// The split GEMM's epilogue (gemm/split_k.h): each split of a tile writes its slab's FP32 partial
// to the workspace and counts itself in at the slab's counter; the split that counts in last adds
// the S partials in split order 0..S-1, rounds the sum to BF16 once and stores it into C.
//
//   split j:  partial -> workspace    barrier    leader: fence, counter += 1: the S-th?
//   the S-th: fence; counter = 0      acc = p_0 + p_1 + ... + p_{S-1}, read back in split order
//             -> BF16 -> C (SlabStore, as the unsplit GEMM)
//
// No split waits: the others go on to their next step. A slab's rows past the tile's (past m)
// hold nothing: threads whose rows all lie there neither write nor read partials, so at M = 8 one
// warp of four moves them.
#pragma once

#include <cuda_runtime.h>

#include "core/ptx.cuh"
#include "gemm/mainloop.cuh"
#include "gemm/slab_store.cuh"

namespace tpfuse::kernels {

// One consumer warpgroup's slab of a split step: its FP32 partial in the workspace (gemm/split_k.h),
// the slab's counter of splits counted in, and the sum of a tile's partials in split order. Shared
// by the split GEMM's epilogue, the reduce-scatter's over tiles of several owners' rows and the
// all-gather's.
class SplitPartials {
 public:
  __device__ SplitPartials(float* partials, uint32_t* splits_done, int consumer, const KSlice& k_slice)
      : partials_(partials), splits_done_(splits_done), consumer_(consumer), k_slice_(k_slice) {}

  // Whether this thread's accumulators (rows first_row and first_row + 8 of the slab,
  // gemm/slab_store.cuh) hold any of the tile's rows: a thread whose rows lie past them neither
  // writes nor reads partials (so at M = 8 one warp of four moves them).
  __device__ static bool holds_rows(int rows_in_slab) {
    const int t = threadIdx.x % 128;
    return 16 * (t / 32) + (t % 32) / 4 < rows_in_slab;
  }

  template <class Config>
  __device__ void write(const float (&acc)[Config::kAccPerThread]) const {
    float4* mine = partial_of<Config>(k_slice_.split);
#pragma unroll
    for (int q = 0; q < Config::kAccPerThread / 4; ++q) {
      __stcg(mine + q * 128, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
    }
  }

  // The leader thread counts the warpgroup's partial in (once every thread has written its part,
  // the caller's barrier); returns the splits counted in before it.
  __device__ uint32_t count_in() const {
    // NOTE: release: the warpgroup's partial (ordered before by the barrier) before the count.
    ptx::fence_acq_rel_gpu();
    return ptx::atomic_add_relaxed_gpu(counter(), 1);
  }

  // The leader thread, once every split has counted in: acquire their partials, and set the counter
  // back to 0 (no one else touches it in this call; the next call, stream-ordered, finds 0).
  __device__ void finish_count() const {
    ptx::fence_acq_rel_gpu();
    ptx::store_relaxed_gpu(counter(), 0);
  }

  __device__ const uint32_t* counter_address() const { return counter(); }

  // A step's end of its slab (rows_in_slab of the tile's rows in it) where no split waits for
  // another: writes this split's partial and counts it in; true in every thread of the warpgroup
  // when it was the tile's last, which then holds the sum of all S partials in acc (to store).
  template <class Config>
  __device__ bool sum_if_last(float (&acc)[Config::kAccPerThread], int rows_in_slab, const SlabStore& slabs) const {
    const bool mine = holds_rows(rows_in_slab);
    if (mine) write<Config>(acc);
    slabs.sync();  // every thread's part is written before the leader counts the partial in
    bool last = false;
    if (slabs.leader()) {
      last = count_in() == uint32_t(k_slice_.num_splits - 1);
      if (last) finish_count();
    }
    if (!ptx::named_barrier_any(1 + consumer_, 128, last)) return false;
    if (mine) add_all<Config>(acc);
    return true;
  }

  // acc = p_0 + p_1 + ... + p_{S-1}, added in this order in FP32, so that the sum is the same
  // whichever split adds it. In place: the accumulators stay live across steps (the WGMMAs read
  // them), so this split's own partial is read back like the others, and the pieces of each
  // further partial come kPiecesInFlight at a time beside them.
  template <class Config>
  __device__ void add_all(float (&acc)[Config::kAccPerThread]) const {
    constexpr int kPieces = Config::kAccPerThread / 4;
    constexpr int kPiecesInFlight = 8;
    static_assert(kPieces % kPiecesInFlight == 0, "a slab's pieces go in equal groups");
    const size_t split_stride = size_t(kConsumers) * 128 * Config::kAccPerThread / 4;  // float4s
    const float4* first = partial_of<Config>(0);
#pragma unroll
    for (int q = 0; q < kPieces; ++q) set_piece(acc, q, __ldcg(first + q * 128));
#pragma unroll 1
    for (int j = 1; j < k_slice_.num_splits; ++j) {
      const float4* partial = first + j * split_stride;
#pragma unroll
      for (int q0 = 0; q0 < kPieces; q0 += kPiecesInFlight) {
        float4 part[kPiecesInFlight];
#pragma unroll
        for (int g = 0; g < kPiecesInFlight; ++g) part[g] = __ldcg(partial + (q0 + g) * 128);
#pragma unroll
        for (int g = 0; g < kPiecesInFlight; ++g) {
          float* a = acc + 4 * (q0 + g);
          set_piece(acc, q0 + g, make_float4(a[0] + part[g].x, a[1] + part[g].y, a[2] + part[g].z, a[3] + part[g].w));
        }
      }
    }
  }

 private:
  __device__ uint32_t* counter() const { return splits_done_ + k_slice_.tile_index * kConsumers + consumer_; }

  // The 16-byte pieces of split j's partial of this consumer's slab that this thread writes and
  // reads: piece q at [q * 128].
  template <class Config>
  __device__ float4* partial_of(int split) const {
    constexpr int kSlabFloats = 128 * Config::kAccPerThread;
    const int step_slot = k_slice_.tile_index * k_slice_.num_splits + split;
    return reinterpret_cast<float4*>(partials_ + (size_t(step_slot) * kConsumers + consumer_) * kSlabFloats) +
           threadIdx.x % 128;
  }

  template <int kAcc>
  __device__ static void set_piece(float (&acc)[kAcc], int q, float4 piece) {
    acc[4 * q] = piece.x;
    acc[4 * q + 1] = piece.y;
    acc[4 * q + 2] = piece.z;
    acc[4 * q + 3] = piece.w;
  }

  float* partials_;
  uint32_t* splits_done_;
  int consumer_;
  KSlice k_slice_;
};

class SplitKEpilogue : public EpilogueBase {
 public:
  struct Params {
    CUtensorMap c;          // m x n, row-major BF16, box 64 x 64, SWIZZLE_128B
    float* partials;        // the workspace's (gemm/split_k.h): [step][slab][float4 q][thread][4]
    uint32_t* splits_done;  // [tile][slab], 0 between calls
  };

  // The consumers store their slabs themselves.
  template <class Storage>
  __device__ SplitKEpilogue(const Params& params, int consumer, Storage& smem)
      : params_(params), consumer_(consumer), slabs_(consumer, smem.chunks[consumer]) {}

  // The step's slice of K, for the workspace (no input during the K loop, no extra stages).
  template <class Config>
  __device__ void begin_tile(const Tile&, const KSlice& k_slice) {
    k_slice_ = k_slice;
  }

  template <class Config>
  __device__ void end_tile(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread],
                           StorageOf<Config>&, StageCursor&) {
    const int row = tile.row_begin + slab.row;
    const int col = tile.col_begin + slab.col;
    // A slab past the tile's last row or column has nothing to store (in any split: its counter
    // stays 0). A whole tile (before a split tail) is stored as it is.
    if (row >= tile.row_end || col >= tile.col_end) return;
    if (k_slice_.num_splits > 1) {
      const SplitPartials split(params_.partials, params_.splits_done, consumer_, k_slice_);
      if (!split.sum_if_last<Config>(acc, tile.row_end - row, slabs_)) return;
    }
    slabs_.store<Config::kChunksPerSlab, Config::kStagedChunks>(
        acc, chunks_before<Config>(col, tile.col_end), [&](int c, const void* buffer) {
          ptx::tma_store_2d(&params_.c, buffer, col + c * kChunkCols, row);
        });
  }

  __device__ void finish() { slabs_.drain(); }

 private:
  const Params& params_;
  int consumer_;
  SlabStore slabs_;
  KSlice k_slice_{};
};

}  // namespace tpfuse::kernels
