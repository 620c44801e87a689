// Split K: the plain GEMM's schedule for outputs whose tiles would leave most SMs idle (small M),
// and the layout of its workspace. Pure C++ that the kernels also compile.
//
// Each tile's K loop of kb K blocks is cut into S splits, each a step of its own: split j of tile t
// is step t * S + j and multiplies K blocks [j * kb / S, (j + 1) * kb / S), so the splits of a tile
// are consecutive steps (in the same wave) and differ by at most one K block:
//
//   S = 3, kb = 10:   step 3t: K blocks 0-2    step 3t + 1: K blocks 3-5    step 3t + 2: K blocks 6-9
//
// Every split writes its FP32 partial to the workspace and counts itself in at its tile's counter
// (per slab); the split that counts in last adds the S partials in split order 0..S-1 and rounds
// the sum to BF16 once (gemm/split_k_epilogue.cuh). Whichever split that is, the sum is the same,
// bit for bit. No split waits for another, so any grid runs any number of steps.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/fast_division.h"
#include "core/host_device.h"
#include "gemm/raster.h"
#include "gemm/tile.h"
#include "gemm/variants.h"

namespace tpfuse {

class SplitKSchedule {
 public:
  SplitKSchedule() = default;

  // The tiles of `tiles`, each in num_splits >= 1 steps over num_k_blocks >= num_splits K blocks
  // (num_splits * num_k_blocks < 2^31). On the host: the divisor is prepared here.
  SplitKSchedule(const GemmSchedule& tiles, int num_splits, int num_k_blocks)
      : tiles_(tiles), num_splits_(num_splits), num_k_blocks_(num_k_blocks), by_splits_(num_splits) {}

  TPFUSE_HOST_DEVICE int num_splits() const { return num_splits_; }
  TPFUSE_HOST_DEVICE int tiles() const { return tiles_.num_tiles(); }

  // Steps, as the mainloop counts them (a schedule has num_tiles() and tile(step)): S per tile.
  TPFUSE_HOST_DEVICE int num_tiles() const { return tiles_.num_tiles() * num_splits_; }

  // 0 <= step < num_tiles().
  TPFUSE_HOST_DEVICE Tile tile(int step) const { return tiles_.tile(by_splits_.div(step)); }

  TPFUSE_HOST_DEVICE KSlice k_slice(int step) const {
    KSlice k;
    k.tile_index = by_splits_.div(step);
    k.split = step - k.tile_index * num_splits_;
    k.num_splits = num_splits_;
    k.k_block_begin = k_block_of(k.split);
    k.num_k_blocks = k_block_of(k.split + 1) - k.k_block_begin;
    return k;
  }

 private:
  // The first K block of split j (j = S: the end of K).
  TPFUSE_HOST_DEVICE int k_block_of(int split) const { return by_splits_.div(split * num_k_blocks_); }

  GemmSchedule tiles_;
  int num_splits_ = 1;
  int num_k_blocks_ = 0;
  FastDivision by_splits_;
};

// A step's K slice under any schedule: all of K for those that do not split it.
template <class Schedule>
TPFUSE_HOST_DEVICE KSlice k_slice_of(const Schedule&, int step, int num_k_blocks) {
  return KSlice{step, 0, 1, 0, num_k_blocks};
}
TPFUSE_HOST_DEVICE KSlice k_slice_of(const SplitKSchedule& schedule, int step, int) { return schedule.k_slice(step); }

// The workspace, for at most `max_steps` steps (the config never splits into more than one wave:
// a step per SM):
//   partials:     [step][slab][float4 q][thread][4] FP32: a consumer's accumulators in register
//                 order, so that every thread writes and reads its own 16-byte pieces, coalesced
//   splits_done:  [tile][slab] u32: the splits whose partial has landed; the last one sets it back
//                 to 0, so a call leaves every counter as it found it (0)
// (Counters are sized for max_steps tiles: a split uses at most half as many.)
struct SplitKWorkspaceSize {
  size_t partial_bytes = 0;
  size_t counter_bytes = 0;
};

// The most FP32 accumulators a tile of any compiled variant holds.
constexpr size_t max_tile_accumulators() {
  size_t most = 0;
  for (const GemmVariant& v : kGemmVariants) most = most > size_t(v.block_m) * v.block_n ? most : size_t(v.block_m) * v.block_n;
  return most;
}

constexpr SplitKWorkspaceSize split_k_workspace_size(int max_steps) {
  SplitKWorkspaceSize size;
  size.partial_bytes = size_t(max_steps) * max_tile_accumulators() * sizeof(float);
  // A multiple of 256 bytes: partials placed after the counters stay aligned for 16-byte accesses.
  size.counter_bytes = (size_t(max_steps) * kConsumers * sizeof(uint32_t) + 255) / 256 * 256;
  return size;
}

}  // namespace tpfuse
