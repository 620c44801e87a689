// Reducing this rank's own slabs in the shadow of the mainloop.
//
// A consumer warpgroup leaves an own slab's FP32 accumulators in the rank's own-partial buffer
// (row-major, rows_per_rank x n, where the rows land in the output) and goes on to its next tile.
// Once the watcher has seen the peers' partials of the slab, the warpgroup reduces it in vectors of
// 8 columns of a row: the FP32 values plus the P-1 partials in rank order, rounded to BF16 once,
// stored to the output. While the CTA has tiles left, each thread reduces one vector per K block:
// its loads go out right after the block's WGMMAs are issued, and are used once the previous
// block's WGMMAs are done, so that they are in flight while the tensor cores multiply; what is left
// after the CTA's last tile goes several vectors at a time.
//
// A warpgroup reduces its own slabs in the order it computed them, walking the schedule from one
// to the next, so that it never needs to remember more than one.
#pragma once

#include <cuda_bf16.h>

#include "kernels/gemm_mainloop.cuh"
#include "kernels/tile_store.cuh"
#include "tpfuse/problem.h"

namespace tpfuse::kernels {

// This rank's own rows in one call: where the slabs wait, where the peers' partials are, where the
// reduced rows go.
struct OwnRows {
  float* partial;                  // FP32, rows_per_rank x n: the own slabs' accumulators
  const __nv_bfloat16* received;   // this call's half of the receive buffer: [source][rows_per_rank][n]
  __nv_bfloat16* out;              // rows_per_rank x n
  int n;
  size_t source_elems;             // rows_per_rank * n
  int rank;
  int num_sources;                 // P - 1
};

// A consumer's slab of a tile as this rank's own rows to reduce.
struct OwnSlab {
  int wave;         // the CTA's wave that computed it
  int segment_row;  // first row in this rank's rows
  int rows;         // at most 64 (fewer at a band's end)
  int col;
  int cols;         // at most the slab's columns (fewer at n's end)
  bool reduced;     // the slab holds this rank's rows, not nothing, and there are peers
};

template <class Config>
class OwnSlabReducer {
 public:
  __device__ OwnSlabReducer(const OwnRows& rows, const TileSchedule& schedule, int cta, int num_ctas, int consumer,
                            const int* inputs_arrived)
      : rows_(rows), schedule_(schedule), cta_(cta), num_ctas_(num_ctas), consumer_(consumer),
        inputs_arrived_(inputs_arrived) {}

  // The consumer's slab of `tile`, computed in the CTA's wave `wave`.
  __device__ OwnSlab slab_of(const Tile& tile, int wave) const {
    const Slab<Config> slab = Slab<Config>::of_consumer(consumer_);
    OwnSlab own;
    own.wave = wave;
    own.segment_row = tile.segment_row_of(slab.row);
    own.rows = min(Config::kWgRows, tile.row_end - tile.row_begin - slab.row);
    own.col = tile.col_begin + slab.col;
    own.cols = min(Config::kWgCols, tile.col_end - own.col);
    own.reduced = rows_.num_sources > 0 && tile.owner_of(slab.row) == rows_.rank && own.rows > 0 && own.cols > 0;
    return own;
  }

  // Leaves a reduced slab's FP32 accumulators in the own-partial buffer. The warpgroup must pass a
  // barrier before any of its threads reduces the slab (each thread reads other threads' values).
  __device__ void leave(const float (&acc)[Config::kAccPerThread], const OwnSlab& own) const {
    const int lane = threadIdx.x % 32;
    const int warp = (threadIdx.x / 32) % 4;
#pragma unroll
    for (int block = 0; block < Config::kWgCols / 8; ++block) {
      const int col = 8 * block + 2 * (lane % 4);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // Accumulator elements 4 * block + 2 * half + {0, 1} (tile_store.cuh has the layout).
        const int row = 16 * warp + lane / 4 + 8 * half;
        if (row < own.rows && 8 * block < own.cols) {
          const float* pair = acc + 4 * block + 2 * half;
          *reinterpret_cast<float2*>(rows_.partial + offset(own, row, col)) = make_float2(pair[0], pair[1]);
        }
      }
    }
  }

  // After each tile's epilogue; `own` is the consumer's slab of it, left in the buffer if reduced.
  __device__ void end_wave(const OwnSlab& own) {
    if (own.reduced && !pending_) {
      start(own);
      pending_ = true;
    }
    ++waves_;
  }

  // Once per K block of the CTA's mainloop, right after its WGMMAs are issued: loads this thread's
  // next vector, if its slab's partials are in.
  __device__ void overlap_begin() {
    if (!pending_ || !arrived(slab_)) return;
    //prefetch_through(min(next_ + kPrefetchAhead, kVectorsPerThread - 1));
    load(inputs_, slab_, next_);
    in_flight_ = true;
  }

  // Once the previous K block's WGMMAs are done: adds and stores the vector loaded.
  __device__ void overlap_end() {
    if (!in_flight_) return;
    add_and_store(inputs_);
    in_flight_ = false;
    if (++next_ == kVectorsPerThread) advance();
  }

  // After the CTA's last tile: reduces every slab left, waiting for their partials (the watcher's
  // waits are bounded: after a timeout it still publishes, and the call reports the error).
  __device__ void finish() {
    while (pending_) {
      while (!arrived(slab_)) __nanosleep(64);
      //prefetch_through(kVectorsPerThread - 1);
      for (; next_ < kVectorsPerThread; next_ += kDrainDepth) {
        VectorInputs batch[kDrainDepth];
#pragma unroll
        for (int i = 0; i < kDrainDepth; ++i) load(batch[i], slab_, next_ + i);
#pragma unroll
        for (int i = 0; i < kDrainDepth; ++i) add_and_store(batch[i]);
      }
      advance();
    }
  }

 private:
  static constexpr int kVectorCols = 8;  // 16 bytes of BF16
  static constexpr int kVectorsPerRow = Config::kWgCols / kVectorCols;
  static constexpr int kVectorsPerThread = Config::kWgRows * kVectorsPerRow / 128;
  static constexpr int kDrainDepth = 4;  // vectors in flight per thread after the last tile
  // Vectors asked into L2 ahead of their loads in the mainloop (K blocks of about half a
  // microsecond each: more than a load from HBM takes while the GEMM streams its operands).
  static constexpr int kPrefetchAhead = 4;
  static constexpr int kMaxSources = kMaxWorldSize - 1;

  struct VectorInputs {
    float4 own[2];
    uint4 partials[kMaxSources];  // 8 BF16 of each source
    size_t at;                    // element offset in this rank's rows
    bool valid;
  };

  __device__ size_t offset(const OwnSlab& own, int row, int col) const {
    return size_t(own.segment_row + row) * rows_.n + own.col + col;
  }

  // Asks L2 for this thread's vectors of slab_ up to `last`, those not asked for yet.
  __device__ void prefetch_through(int last) {
    for (; prefetched_ <= last; ++prefetched_) {
      const int index = prefetched_ * 128 + threadIdx.x % 128;
      const int row = index / kVectorsPerRow;
      const int col = index % kVectorsPerRow * kVectorCols;
      if (row >= slab_.rows || col >= slab_.cols) continue;
      const size_t at = offset(slab_, row, col);
      ptx::prefetch_l2(rows_.partial + at);
#pragma unroll
      for (int j = 0; j < kMaxSources; ++j) {
        if (j < rows_.num_sources) ptx::prefetch_l2(rows_.received + source_offset(j) + at);
      }
    }
  }

  __device__ size_t source_offset(int j) const { return size_t(j < rows_.rank ? j : j + 1) * rows_.source_elems; }

  __device__ bool arrived(const OwnSlab& own) const { return ptx::load_acquire_cta(inputs_arrived_) > own.wave; }

  // Vector i of this thread in the slab: consecutive threads take consecutive vectors of a row. A
  // vector past the slab's rows (or its last batch's, i >= kVectorsPerThread) is skipped.
  __device__ void load(VectorInputs& v, const OwnSlab& own, int i) const {
    const int index = i * 128 + threadIdx.x % 128;
    const int row = index / kVectorsPerRow;
    const int col = index % kVectorsPerRow * kVectorCols;
    v.valid = row < own.rows && col < own.cols;
    if (!v.valid) return;
    v.at = offset(own, row, col);
    // Through L2 only: the values were written during this call (by this CTA, or by a peer).
    v.own[0] = *reinterpret_cast<const float4*>(rows_.partial + v.at);
    v.own[1] = *reinterpret_cast<const float4*>(rows_.partial + v.at + 4);
#pragma unroll
    for (int j = 0; j < kMaxSources; ++j) {
      if (j < rows_.num_sources) v.partials[j] = *reinterpret_cast<const uint4*>(rows_.received + source_offset(j) + v.at);
    }
  }

  __device__ void add_and_store(const VectorInputs& v) const {
    if (!v.valid) return;
    float sum[8] = {v.own[0].x, v.own[0].y, v.own[0].z, v.own[0].w, v.own[1].x, v.own[1].y, v.own[1].z, v.own[1].w};
#pragma unroll
    for (int j = 0; j < kMaxSources; ++j) {
      if (j < rows_.num_sources) {
        const uint32_t words[4] = {v.partials[j].x, v.partials[j].y, v.partials[j].z, v.partials[j].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          // A BF16 is the top half of the FP32 of the same value: one integer op widens each.
          sum[2 * k] += __uint_as_float(words[k] << 16);
          sum[2 * k + 1] += __uint_as_float(words[k] & 0xffff0000u);
        }
      }
    }
    const uint4 packed = {pack_bf16x2(sum[0], sum[1]), pack_bf16x2(sum[2], sum[3]), pack_bf16x2(sum[4], sum[5]),
                          pack_bf16x2(sum[6], sum[7])};
    *reinterpret_cast<uint4*>(rows_.out + v.at) = packed;
  }

  __device__ void start(const OwnSlab& own) {
    slab_ = own;
    next_ = 0;
    prefetched_ = 0;
  }

  // The slab is loaded: moves on to the next reduced slab this warpgroup has left in the buffer,
  // if any (a later one becomes pending at its end_wave).
  __device__ void advance() {
    for (int wave = slab_.wave + 1; wave < waves_; ++wave) {
      const OwnSlab own = slab_of(schedule_.tile(step_of<Config>(cta_, num_ctas_, wave)), wave);
      if (own.reduced) {
        start(own);
        return;
      }
    }
    pending_ = false;
  }

  OwnRows rows_;
  const TileSchedule& schedule_;
  int cta_;
  int num_ctas_;
  int consumer_;
  const int* inputs_arrived_;
  int waves_ = 0;         // tiles whose epilogue this warpgroup has finished
  bool pending_ = false;  // slab_ has vectors not loaded yet
  OwnSlab slab_{};
  int next_ = 0;          // this thread's next vector of slab_
  int prefetched_ = 0;    // this thread's vectors of slab_ asked into L2
  bool in_flight_ = false;
  VectorInputs inputs_;
};

}  // namespace tpfuse::kernels
