// The compiled GEMM mainloop variants: ONE table, read by the config choice (gemm/config.cpp) and
// by the dispatch (gemm/launch.cuh), which instantiates every entry for both weight layouts. So the
// choice can only pick what is compiled. Pure C++.
#pragma once

namespace tpfuse {

// Fixed for every variant: K per pipeline stage (128 bytes of BF16: one TMA swizzle row) and two
// consumer warpgroups issuing WGMMA beside one producer warpgroup.
constexpr int kBlockK = 64;
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kSlabRows = 64;  // a consumer's slab of a tile

struct GemmVariant {
  int block_m;        // rows of a tile: one 64-row slab per consumer (128), or two side by side (64)
  int block_n;        // columns of a tile
  int stages;         // shared-memory pipeline depth
  int staged_chunks;  // 64 x 64 chunk buffers per consumer for the epilogue; 0: a whole slab's
};

inline constexpr GemmVariant kGemmVariants[] = {
    {128, 256, 3, 0},  // the default
    {128, 256, 4, 2},  // a single wave of 128 x 256 tiles: a fourth stage, the slab staged 2 chunks at a time
    {128, 192, 4, 0},  // where 256-wide tiles would leave SMs idle in the last wave
    {64, 256, 4, 0},   // segments of at most 64 rows
    {64, 128, 8, 0},   // at most 64 rows and few K blocks: twice the CTAs on W, a deeper ring
};
inline constexpr int kNumGemmVariants = int(sizeof(kGemmVariants) / sizeof(kGemmVariants[0]));

}  // namespace tpfuse
