// The fused op's epilogue: a finished tile of another rank's rows is pushed (BF16, TMA store) into
// that owner's receive slot and signalled with an epoch flag; a tile of this rank's own rows waits
// for its P-1 partials, adds them to the FP32 accumulators in rank order, and is rounded once.
//
// Receive buffer of each rank (symmetric, on its own GPU), double-buffered by call parity; each
// parity half has a fixed base (sized for the largest problem), the rest is laid out for this call:
//   recv[parity][source rank][rows_per_rank][n]          BF16
//   flags[parity][source rank][tile in segment][slab]    u32 epoch values
// A rank's calls alternate parity, so the pushes of call e+1 never land on the data of call e. A
// peer can only reach call e+2 (same parity as e) after this rank has started call e+1, i.e. after
// it has finished consuming call e: its own rows in e+1 need this rank's pushes of e+1.
//
// NOTE (memory ordering, per pushed slab): the chunk stores go out as TMA bulk groups; before the
// flag is raised the pushing thread waits for the groups to COMPLETE (cp.async.bulk.wait_group, not
// the .read variant), fences the async proxy, then stores the flag with release semantics at system
// scope. The owner's waiting thread loads the flag with acquire at system scope, then a barrier
// hands the data to the warpgroup. The signal of a slab is deferred until the next slab's stores are
// issued, so compute never waits for NVLink; it is flushed before any wait on incoming flags.
#pragma once

#include "kernels/peer_error.h"
#include "kernels/tile_store.cuh"
#include "tpfuse/problem.h"

namespace tpfuse::kernels {

// Flag values compare modulo 2^32, so the epoch may wrap.
__device__ __forceinline__ bool epoch_reached(uint32_t flag, uint32_t epoch) { return int32_t(flag - epoch) >= 0; }

class PushReduceEpilogue {
 public:
  struct Params {
    int rank;
    int world_size;
    int rows_per_rank;
    int n;
    int col_tiles;
    int block_m;
    int block_n;
    int tiles_per_segment;
    CUtensorMap recv_at[kMaxWorldSize];  // each owner's receive buffer, 4D: (column, row, source, parity)
    CUtensorMap out;                 // rows_per_rank x n, this rank's output
    uint32_t* flags_at[kMaxWorldSize];   // each owner's flag array (flags_at[rank] is this rank's own)
    size_t flags_parity_words;       // distance between the two parity halves of a flag array
    const uint32_t* epoch_counter;   // calls completed on this rank; this call's epoch is one more
    uint32_t* failed;                // set by the first wait of this rank that times out
    PeerError* error;                // host-mapped
    uint64_t timeout_ns;
  };

  __device__ PushReduceEpilogue(const Params& params, int consumer, ChunkBuffers buffers)
      : p_(params), consumer_(consumer), buffers_(buffers), slabs_(consumer, buffers) {
    epoch_ = *reinterpret_cast<const volatile uint32_t*>(p_.epoch_counter) + 1;
    parity_ = epoch_ & 1;
  }

  template <class Config>
  __device__ void store(const Work& work, Slab<Config> slab, float (&acc)[Config::kAccPerThread]) {
    const Tile& tile = work.tile;
    const int segment_row = tile.segment_row + slab.row;
    const int col_begin = tile.col_begin + slab.col;
    // A slab past the segment's rows or the last column holds nothing: neither pushed nor awaited.
    if (tile.row_begin + slab.row >= tile.row_end || col_begin >= tile.col_end) return;
    if (tile.owner_rank == p_.rank) {
      reduce<Config>(tile, segment_row, col_begin, acc);
    } else {
      push<Config>(tile, segment_row, col_begin, acc, /*signal_now=*/work.partner_reduces);
    }
  }

  __device__ void finish() {
    slabs_.drain();
    signal_pending();
  }

 private:
  template <class Config>
  __device__ void push(const Tile& tile, int segment_row, int col_begin, float (&acc)[Config::kAccPerThread],
                       bool signal_now) {
    const CUtensorMap* recv = &p_.recv_at[tile.owner_rank];
    slabs_.store<Config::kWgCols / kChunkCols>(acc, chunks_before<Config>(col_begin, tile.col_end),
                                               [&](int c, const __nv_bfloat16* buffer) {
                                                 ptx::tma_store_4d(recv, buffer, col_begin + c * kChunkCols,
                                                                   segment_row, p_.rank, parity_);
                                               });
    if (slabs_.leader()) {
      // The previous slab's bulk group is older than this one: once it has landed, raise its flag.
      ptx::bulk_wait_group<1>();
      signal_pending();
      pending_flag_ = flag_at(tile.owner_rank, p_.rank, tile);
      // NOTE: a cluster partner about to wait for its peers stalls this CTA (it stops releasing the
      // shared stages), so this slab's flag cannot wait for our next slab: raise it now. Clusters keep
      // the own tiles last (runtime/launch.cuh), so only the pair that straddles the start of the own
      // tail meets this (every later step of the pair is own rows): no deferred flag is ever held by
      // a stalled CTA.
      if (signal_now) {
        ptx::bulk_wait_group<0>();
        signal_pending();
      }
    }
  }

  // The peers' partials stream through the chunk buffers as TMA loads (kBuffers in flight), each
  // added to the FP32 accumulators by the whole warpgroup; chunk-major, then sources in rank order,
  // so the sum does not depend on arrival order.
  template <class Config>
  __device__ void reduce(const Tile& tile, int segment_row, int col_begin, float (&acc)[Config::kAccPerThread]) {
    constexpr int kBuffers = Config::kWgCols / kChunkCols;
    const int num_chunks = chunks_before<Config>(col_begin, tile.col_end);
    const int num_sources = p_.world_size - 1;
    const int num_pieces = num_chunks * num_sources;
    if (slabs_.leader()) {
      // NOTE: flush our own pending push first: a peer may be waiting for it while we wait for it.
      // This also leaves no store reading the chunk buffers the loads below will fill.
      ptx::bulk_wait_group<0>();
      signal_pending();
      wait_for_partials(tile, segment_row, col_begin);
      // NOTE: flags acquired (generic proxy) before the TMA reads (async proxy) of the data.
      ptx::fence_proxy_async_global();
      for (int i = 0; i < num_pieces && i < kBuffers; ++i) load_piece<kBuffers>(i, num_sources, segment_row, col_begin);
    }
#pragma unroll
    for (int c = 0; c < kBuffers; ++c) {
      if (c >= num_chunks) continue;
      for (int j = 0; j < num_sources; ++j) {
        const int i = c * num_sources + j;
        const int use = pieces_loaded_ + i;
        ptx::mbarrier_wait(&buffers_.loaded[use % kBuffers], (use / kBuffers) & 1);
        add_chunk_bf16(buffers_.data[use % kBuffers], acc + c * 32);
        // Everyone has read the buffer before the next load into it (generic reads, async write).
        ptx::fence_proxy_async_shared();
        slabs_.sync();
        if (slabs_.leader() && i + kBuffers < num_pieces) load_piece<kBuffers>(i + kBuffers, num_sources, segment_row, col_begin);
      }
    }
    pieces_loaded_ += num_pieces;
    slabs_.store<kBuffers>(acc, num_chunks, [&](int c, const __nv_bfloat16* buffer) {
      ptx::tma_store_2d(&p_.out, buffer, col_begin + c * kChunkCols, segment_row);
    });
  }

  // Leader only: piece i of this slab's reduction (chunk i / num_sources, the (i % num_sources)-th
  // peer in rank order) into buffer (pieces_loaded_ + i) % kBuffers.
  template <int kBuffers>
  __device__ void load_piece(int i, int num_sources, int segment_row, int col_begin) {
    const int chunk = i / num_sources;
    const int j = i % num_sources;
    const int source = j < p_.rank ? j : j + 1;
    const int buffer = (pieces_loaded_ + i) % kBuffers;
    uint64_t* loaded = &buffers_.loaded[buffer];
    ptx::mbarrier_arrive_expect_tx(loaded, kChunkElems * 2);
    ptx::tma_load_4d(buffers_.data[buffer], &p_.recv_at[p_.rank], loaded, col_begin + chunk * kChunkCols, segment_row,
                     source, parity_);
  }

  // Leader only: waits, boundedly, for every peer's flag of this slab. The flags are polled with
  // relaxed loads, all in flight together (one memory latency, not P-1), and one acquire fence
  // after they all show this epoch orders the data reads after every peer's release.
  __device__ void wait_for_partials(const Tile& tile, int segment_row, int col_begin) {
    uint32_t waiting = ((1u << p_.world_size) - 1) & ~(1u << p_.rank);  // sources not arrived yet
    const uint64_t deadline = ptx::globaltimer_ns() + p_.timeout_ns;
    for (;;) {
      uint32_t flags[kMaxWorldSize];
#pragma unroll
      for (int source = 0; source < kMaxWorldSize; ++source) {
        if (waiting & (1u << source)) flags[source] = ptx::load_relaxed_sys(flag_at(p_.rank, source, tile));
      }
#pragma unroll
      for (int source = 0; source < kMaxWorldSize; ++source) {
        if ((waiting & (1u << source)) && epoch_reached(flags[source], epoch_)) waiting &= ~(1u << source);
      }
      if (waiting == 0) break;
      if (*reinterpret_cast<volatile uint32_t*>(p_.failed) != 0) return;  // this call already failed
      if (ptx::globaltimer_ns() > deadline) {
        report_timeout(__ffs(waiting) - 1, tile.row_begin + (segment_row - tile.segment_row), col_begin);
        return;
      }
      __nanosleep(100);
    }
    ptx::fence_acquire_sys();
  }

  // The first timeout of this rank's call records what it waited for; the host reads it after the call.
  __device__ void report_timeout(int source, int row, int col) {
    if (atomicCAS(p_.failed, 0u, 1u) != 0u) return;
    volatile PeerError* error = p_.error;
    error->waiting_rank = p_.rank;
    error->missing_rank = source;
    error->row = row;
    error->col = col;
    __threadfence_system();
    error->code = 1;
    __threadfence_system();
  }

  // Flag of (owner's flag array, source, tile, this slab) for this call's parity.
  __device__ uint32_t* flag_at(int owner, int source, const Tile& tile) const {
    const int row_tile = tile.segment_row / p_.block_m;
    const int col_tile = tile.col_begin / p_.block_n;
    const int tile_idx = row_tile * p_.col_tiles + col_tile;
    const size_t index = (size_t(source) * p_.tiles_per_segment + tile_idx) * 2 + consumer_;
    return p_.flags_at[owner] + parity_ * p_.flags_parity_words + index;
  }

  // Leader only: raises the flag of the last pushed slab, whose stores have landed.
  __device__ void signal_pending() {
    if (pending_flag_ == nullptr) return;
    ptx::fence_proxy_async_global();
    ptx::store_release_sys(pending_flag_, epoch_);
    pending_flag_ = nullptr;
  }

  const Params& p_;
  int consumer_;
  ChunkBuffers buffers_;
  int pieces_loaded_ = 0;   // loads into the chunk buffers so far: buffer and phase of the next
  SlabStore slabs_;
  uint32_t epoch_;
  int parity_;
  uint32_t* pending_flag_ = nullptr;
};

}  // namespace tpfuse::kernels
