// The compiled GEMM mainloop variants: ONE table, read by the config choice (gemm/config.cpp) and
// by the dispatch (gemm/launch.cuh), which instantiates every entry for both weight layouts. So the
// choice can only pick what is compiled. Pure C++.
#pragma once

#include <cstdint>
#include <type_traits>

#include "tpfuse/problem.h"

namespace tpfuse {

// Fixed for every variant: a pipeline stage holds kStageRowBytes of each of its rows of A and W (one
// 128-byte TMA swizzle row), whatever the inputs' dtype, so its K extent is the dtype's: block_k_of
// (64 BF16, 128 E4M3), and a stage's bytes are the same for every dtype. One producer warpgroup
// beside the consumer warpgroups issuing WGMMA, at most kConsumers of them.
constexpr int kStageRowBytes = 128;
constexpr int kConsumers = 2;
constexpr int kSlabRows = 64;  // a consumer's slab of a tile

struct GemmVariant {
  int block_m;        // rows of a tile: one 64-row slab per consumer (128), or two side by side (64)
  int block_n;        // columns of a tile
  int stages;         // shared-memory pipeline depth
  int staged_chunks;  // 64 x 64 chunk buffers per consumer for the epilogue; 0: a whole slab's
  int consumers;      // consumer warpgroups: 2, or 1 holding the whole 64-row tile as its slab
  bool fused_ops;     // the fused ops take it too (else the plain GEMM's only: fused_ops_take)
  bool storing_ops;   // the ops that store their tiles as the plain GEMM does take it (storing_ops_take)
  DType dtype = DType::kBF16;  // of the mainloop's inputs (A, W): a problem of another dtype never picks it
  // E4M3: each stage's WGMMA sums (128 of K) added into FP32 registers (Accumulation::kPromoted),
  // which needs a second set of accumulators, so tiles of 128 x 128 at most.
  bool promoted = false;
  // E4M3, promoted: each stage's sums multiplied by its blockwise scales as they are added
  // (Scaling::kBlockwise), which needs a slab's columns in one or two 128-column blocks of W's
  // scales (128 or 192 wide).
  bool block_scaled = false;
};

inline constexpr GemmVariant kGemmVariants[] = {
    {128, 256, 3, 0, 2, true, true},    // the default
    {128, 256, 4, 2, 2, true, true},    // a single wave of 128 x 256 tiles: a fourth stage, the slab staged 2 chunks at a time
    {128, 192, 4, 0, 2, true, true},    // where 256-wide tiles would leave SMs idle in the last wave
    {64, 256, 4, 0, 2, true, true},     // segments of at most 64 rows
    {64, 128, 8, 0, 2, true, true},     // at most 64 rows and few K blocks: twice the CTAs on W, a deeper ring
    {64, 64, 12, 0, 1, false, false},   // at most 64 rows: four times the CTAs on W without splitting K
    {128, 128, 6, 0, 2, false, false},  // one band of 129..256 rows, or about a wave where wider tiles need splits of K
    {64, 192, 6, 0, 1, false, false},   // at most 256 rows: as few bytes a CTA loads as 128 x 128, on a third more CTAs at N = 6144
    {128, 128, 5, 0, 2, true, true},    // the same for the fused ops (a stage fewer: the all-gather's copier's ring)
    {128, 256, 3, 0, 2, true, true, DType::kE4M3},        // E4M3, the tensor cores' own accumulation
    {128, 128, 5, 0, 2, true, true, DType::kE4M3, true},  // E4M3, promoted: two sets of accumulators
    {128, 192, 4, 0, 2, false, false, DType::kE4M3, true},  // E4M3, promoted, wider: two sets of 96 a thread
    {128, 128, 5, 0, 2, true, true, DType::kE4M3, true, true},  // E4M3, blockwise scales at each promotion
    {128, 192, 4, 0, 2, true, true, DType::kE4M3, true, true},  // the same, wider: two blocks of W's scales a slab (the fused ops' too)
};
inline constexpr int kNumGemmVariants = int(sizeof(kGemmVariants) / sizeof(kGemmVariants[0]));

// K per pipeline stage for inputs of `dtype` (a dtype validate() takes): a stage's kStageRowBytes of a row.
constexpr int block_k_of(DType dtype) { return kStageRowBytes / element_bytes(dtype); }
// The K blocks (pipeline stages) of a reduction dimension of k elements of `dtype`.
constexpr int64_t k_blocks_of(int64_t k, DType dtype) { return (k + block_k_of(dtype) - 1) / block_k_of(dtype); }

// The raw bits of one input element of kDType: what the stages hold and offsets in elements count
// (never computed with).
template <DType kDType>
using ElementBits = std::conditional_t<element_bytes(kDType) == 2, uint16_t, uint8_t>;

// Whether variant v runs a problem of inputs of `dtype` accumulated as `accumulation` and scaled as
// `scaling` (BF16's ignore both).
constexpr bool serves(const GemmVariant& v, DType dtype, Accumulation accumulation, Scaling scaling) {
  if (v.dtype != dtype) return false;
  if (dtype == DType::kBF16) return true;
  return v.promoted == (accumulation == Accumulation::kPromoted) && v.block_scaled == (scaling == Scaling::kBlockwise);
}

// Whether some compiled variant takes inputs of `dtype` (problem validation asks).
constexpr bool variants_take(DType dtype) {
  for (const GemmVariant& v : kGemmVariants) {
    if (v.dtype == dtype) return true;
  }
  return false;
}

// The widest input element of the compiled variants: what the workspaces that hold inputs are sized by.
constexpr int max_input_element_bytes() {
  int most = 0;
  for (const GemmVariant& v : kGemmVariants) most = most > element_bytes(v.dtype) ? most : element_bytes(v.dtype);
  return most;
}

// Threads of a CTA of variant v.
constexpr int threads_of(const GemmVariant& v) { return 128 * (v.consumers + 1); }

// Columns of a consumer's slab.
constexpr int slab_cols_of(const GemmVariant& v) { return v.block_n * (v.block_m / kSlabRows) / v.consumers; }

// The variants the fused ops are compiled for. Their epilogues hand every tile's two slabs on (the
// reduce-scatter's sender and flags, the all-gather's counts): two consumers.
constexpr bool fused_ops_take(const GemmVariant& v) { return v.fused_ops; }
// Those and the 64-row variants of one consumer (64 x 64, 64 x 192): the reduce-scatter's shared
// tiles from registers (ops/gemm_rs/shared_tiles.cuh), whose epilogue hands no slab on, take them
// too, as the plain GEMM does (more CTAs on W at decode-sized M).
constexpr bool register_epilogue_takes(const GemmVariant& v) {
  return fused_ops_take(v) || (v.block_m == kSlabRows && v.consumers == 1);
}
// The fused ops' and the 128 x 128 tiles: an op whose epilogue stores its tiles as the plain GEMM
// does (the all-gather's; its tile traits, ops/ag_gemm/config.cpp).
constexpr bool storing_ops_take(const GemmVariant& v) { return v.storing_ops; }
static_assert([] {
  for (const GemmVariant& v : kGemmVariants) {
    if ((v.fused_ops || v.storing_ops) && v.consumers != kConsumers) return false;
    if (v.fused_ops && !v.storing_ops) return false;
    if (v.block_scaled && (!v.promoted || (v.block_n != kScaleBlock && v.block_n != 192) || v.block_m != 128)) {
      return false;
    }
  }
  return true;
}(), "the fused ops take variants of two consumers only, and the ops that store their tiles take those; "
     "blockwise scales take promoted 128 x 128 or 128 x 192 tiles");

}  // namespace tpfuse
