// The plain GEMM's epilogue: each consumer stores its slab of the tile into C (m x n) on this GPU,
// through its chunk buffers and TMA stores. Ops whose output is a plain tile reuse it.
#pragma once

#include "gemm/mainloop.cuh"
#include "gemm/slab_store.cuh"

namespace tpfuse::kernels {

class StoreTileEpilogue : public EpilogueBase {
 public:
  struct Params {
    CUtensorMap c;  // m x n, row-major BF16, box 64 x 64, SWIZZLE_128B
  };

  // The consumers store their slabs themselves.
  template <class Storage>
  __device__ StoreTileEpilogue(const Params& params, int consumer, Storage& smem)
      : params_(params), slabs_(consumer, smem.chunks[consumer]) {}

  template <class Config>
  __device__ void end_tile(const Tile& tile, Slab<Config> slab, float (&acc)[Config::kAccPerThread],
                           StorageOf<Config>&, StageCursor&) {
    const int row = tile.row_begin + slab.row;
    const int col = tile.col_begin + slab.col;
    // A slab past the tile's last row (a 64-row segment in a 128-row tile) or column has nothing to
    // store; rows past m inside a slab are clipped by the TMA store.
    if (row >= tile.row_end || col >= tile.col_end) return;
    slabs_.store<Config::kChunksPerSlab, Config::kStagedChunks>(
        acc, chunks_before<Config>(col, tile.col_end), [&](int c, const void* buffer) {
          ptx::tma_store_2d(&params_.c, buffer, col + c * kChunkCols, row);
        });
  }

  __device__ void finish() { slabs_.drain(); }

 private:
  const Params& params_;
  SlabStore slabs_;
};

}  // namespace tpfuse::kernels
