// The all-gather + GEMM's epilogue policy (gemm/mainloop.cuh): where a tile's A rows come from, the
// copier warp that pushes this rank's block of X to its peers, and the plain store of Y's tiles.
//
// Who sends which block when: every CTA's copiers (warps 1-3 of the producer warpgroup) take pieces
// of X_r (kCopyRows x copy_cols, ops/ag_gemm/workspace.h), a piece every 3 x `grid`, in order,
// and stores each row of it into the gathered buffer of ranks r+1, r+2, ..., r+P-1 (and of this
// rank, when the caller wants the gathered X), then raises the piece's flag in each. All CTAs copy
// at once from the start of the call, so the pieces land in the first part of the own band's time.
// Meanwhile the producer multiplies its own band from X_r itself; before the first K stage of a
// tile of rank s's band it waits (bounded) for the flags of the pieces the tile's rows span, then
// loads them from its own gathered buffer. The consumers store Y's tiles as the plain GEMM does,
// into a map of P layers of m/P rows, so that a tile's store is clipped at its band's last row.
//
//   P = 4, rank 0:  copiers  pieces of X_0 -> ranks 1, 2, 3 (and 0)     from the start
//                   tiles    band 0 (X_0, local)  band 3 (waits on rank 3's pieces)  band 2  band 1
//
// NOTE (memory ordering, per piece): each copier lane stores its 16-byte vectors to the peer, then
// fences at system scope (fence.acq_rel.sys); the warp synchronizes; lane 0 stores the flag with
// release semantics at system scope. The producer polls the flags with relaxed system-scope loads,
// fences (acquire at system scope), then fences generic -> async proxy before its TMA loads.
//
// Reuse across calls is the reduce-scatter's argument (docs/DESIGN.md, Epochs and reuse): call e
// writes parity e mod 2, and a peer reaches call e+2 only after this rank has started e+1, when its
// reads of call e are done.
#pragma once

#include <cstdint>

#include "comm/device.cuh"
#include "comm/peer_error.h"
#include "gemm/mainloop.cuh"
#include "gemm/slab_store.cuh"
#include "ops/ag_gemm/workspace.h"
#include "tpfuse/problem.h"

namespace tpfuse::kernels {

class AllGatherEpilogue : public EpilogueBase {
 public:
  struct Params {
    int rank;
    int world_size;
    int rows_per_rank;
    int k;
    int row_blocks;                      // pieces of a block along its rows (kCopyRows)
    int copy_cols;                       // a piece's columns (kWideCopyCols or kNarrowCopyCols)
    int copiers_per_cta;                 // copier warps at work in a CTA, 1 .. kCopierWarps
    int col_chunks;                      // pieces along k
    bool copy_own;                       // also copy X_r into this rank's gathered buffer
    CUtensorMap y;                       // Y: 4D (column, row, band, 1), box 64 x 64
    CUtensorMap own_x;                   // X_r: 4D (k, row, 1, 1), box 64 x block_m
    CUtensorMap gathered;                // this rank's gathered buffer: 4D (k, row, source, parity)
    const uint16_t* x;                   // X_r, rows_per_rank x k, BF16
    uint16_t* gathered_at[kMaxWorldSize];  // each rank's gathered buffer (parity 0), as this rank addresses it
    size_t parity_elems;                 // distance between the parity halves of a gathered buffer
    uint32_t* flags_at[kMaxWorldSize];   // each rank's flags
    size_t flags_parity_words;
    const uint64_t* calls;               // calls completed on this rank, in the high word
    uint32_t* failed;                    // set by the first wait of this rank that times out
    PeerError* error;                    // host-mapped
    uint64_t timeout_ns;
  };

  static constexpr int kCopierWarps = 3;
  static constexpr bool kLayeredA = true;

  template <class Storage>
  __device__ AllGatherEpilogue(const Params& params, int consumer, Storage& smem)
      : p_(params), slabs_(consumer, smem.chunks[consumer]) {}

  // Producer thread, before a tile's K stages: its own band from X_r; a peer's band once the pieces
  // its rows span have landed (after a failed call, at once: the consumers must still finish).
  template <class Config, class Mainloop>
  __device__ static ALoad a_load(const Params& p, const Mainloop&, const Tile& tile) {
    if (tile.owner_rank == p.rank) return {&p.own_x, tile.segment_row, 0, 0};
    const uint32_t epoch = comm::call_epoch(p.calls);
    if (wait_for_rows(p, tile, epoch)) {
      ptx::fence_acquire_sys();         // flags seen -> the pieces
      ptx::fence_proxy_async_global();  // the pieces, for the TMA loads (async proxy)
    }
    return {&p.gathered, tile.segment_row, tile.owner_rank, int(epoch & 1)};
  }

  // A copier warp (32 threads, one of `copiers` over the CTAs): pushes its pieces of X_r to every
  // peer (and to this rank's own gathered buffer when asked). Each row of a piece is read once (the
  // loads' latency bounds a warp's rate) and stored to every destination.
  template <class Config>
  __device__ static void copy(const Params& p, int copier_warp, int copier_warps) {
    // The CTA's first copiers_per_cta warps work; the others have nothing to do. Consecutive pieces
    // go to different CTAs (the first warp of each, then the second, ...), so that no CTA's
    // multiply gives up more of its issue slots than it must.
    const int warp_in_cta = copier_warp % kCopierWarps;
    if (warp_in_cta >= p.copiers_per_cta) return;
    const int num_ctas = copier_warps / kCopierWarps;
    const int copier = warp_in_cta * num_ctas + copier_warp / kCopierWarps;
    const int copiers = p.copiers_per_cta * num_ctas;
    const uint32_t epoch = comm::call_epoch(p.calls);
    const int lane = threadIdx.x % 32;
    const int num_pieces = p.row_blocks * p.col_chunks;
    const int destinations = p.copy_own ? p.world_size : p.world_size - 1;
    if (destinations == 0) return;  // one rank, no gathered X wanted: nothing to move
    for (int piece = copier; piece < num_pieces; piece += copiers) {
      const int block = piece / p.col_chunks;
      const int chunk = piece - block * p.col_chunks;
      const int row0 = block * kCopyRows;
      const int col0 = chunk * p.copy_cols;
      const int rows = min(kCopyRows, p.rows_per_rank - row0);
      const int width = min(p.copy_cols, p.k - col0) / 8;  // vectors of this piece's rows (k: multiple of 8)
      const size_t dst_offset = size_t(epoch & 1) * p.parity_elems + (size_t(p.rank) * p.rows_per_rank + row0) * p.k + col0;
      // A row at a time: at most kWideCopyCols / 8 = 4 x 32 vectors, four a lane (a narrow piece's
      // row is one a lane). More in flight would not fit the producer warpgroup's registers.
      for (int r = 0; r < rows; ++r) {
        const uint4* src = reinterpret_cast<const uint4*>(p.x + size_t(row0 + r) * p.k + col0);
        uint4 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (lane + 32 * i < width) v[i] = __ldg(src + lane + 32 * i);
        }
        for (int d = 1; d <= destinations; ++d) {
          const int dest = p.rank + d < p.world_size ? p.rank + d : p.rank + d - p.world_size;
          uint4* dst = reinterpret_cast<uint4*>(p.gathered_at[dest] + dst_offset + size_t(r) * p.k);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (lane + 32 * i < width) dst[lane + 32 * i] = v[i];
          }
        }
      }
      // Every lane's stores are visible system-wide before lane 0 raises the piece's flags.
      __threadfence_system();
      __syncwarp();
      if (lane == 0) {
        const size_t flag_index = size_t(epoch & 1) * p.flags_parity_words +
                                  (size_t(p.rank) * p.row_blocks + block) * p.col_chunks + chunk;
        for (int d = 1; d <= destinations; ++d) {
          const int dest = p.rank + d < p.world_size ? p.rank + d : p.rank + d - p.world_size;
          ptx::store_release_sys(p.flags_at[dest] + flag_index, epoch);
        }
      }
    }
  }

  // Consumers: nothing to add during the K loop (EpilogueBase's), no extra stages; the slab goes to
  // Y's band.
  template <class Config>
  __device__ void end_tile(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread],
                           StorageOf<Config>&, StageCursor&) {
    const int row = tile.segment_row + slab.row;  // in the band
    const int col = tile.col_begin + slab.col;
    // A slab past the band's last row or past n has nothing to store; rows past the band inside a
    // slab are clipped by the layered map.
    if (tile.row_begin + slab.row >= tile.row_end || col >= tile.col_end) return;
    slabs_.store<Config::kChunksPerSlab, Config::kStagedChunks>(
        acc, chunks_before<Config>(col, tile.col_end), [&](int c, const void* buffer) {
          ptx::tma_store_4d(&p_.y, buffer, col + c * kChunkCols, row, tile.owner_rank, 0);
        });
  }

  __device__ void finish() { slabs_.drain(); }

 private:
  // Producer thread: waits, boundedly, for the flags of every piece the tile's rows span (all of k),
  // eight loads in flight at a time. Returns false if the call failed (this wait timed out, or
  // another one of this rank's).
  __device__ static bool wait_for_rows(const Params& p, const Tile& tile, uint32_t epoch) {
    const int first_block = tile.segment_row / kCopyRows;
    const int last_block = (tile.segment_row + (tile.row_end - tile.row_begin) - 1) / kCopyRows;
    const uint32_t* flags = p.flags_at[p.rank] + size_t(epoch & 1) * p.flags_parity_words +
                            (size_t(tile.owner_rank) * p.row_blocks + first_block) * p.col_chunks;
    const int num_flags = (last_block - first_block + 1) * p.col_chunks;  // consecutive in the array
    const uint64_t deadline = ptx::globaltimer_ns() + p.timeout_ns;
    for (int first = 0; first < num_flags; first += 8) {
      uint32_t seen[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (first + i < num_flags) seen[i] = ptx::load_relaxed_sys(flags + first + i);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if (first + i >= num_flags) continue;
        while (!comm::epoch_reached(seen[i], epoch)) {
          if (comm::call_failed(p.failed)) return false;
          if (ptx::globaltimer_ns() > deadline) {
            const int chunk = (first + i) % p.col_chunks;
            comm::report_timeout(p.failed, p.error, p.rank, tile.owner_rank, tile.row_begin, chunk * p.copy_cols);
            return false;
          }
          __nanosleep(100);
          seen[i] = ptx::load_relaxed_sys(flags + first + i);
        }
      }
    }
    return true;
  }

  const Params& p_;
  SlabStore slabs_;
};

}  // namespace tpfuse::kernels
