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

// A tile's K loop of num_k_blocks cut into S >= 1 consecutive steps (split j of tile t is step
// t * S + j): each step's tile and K blocks. The schedules that split K keep one (this GEMM's, and
// the ops' over tiles that fill few SMs).
class KSplits {
 public:
  KSplits() = default;

  // On the host: the divisor is prepared here.
  explicit KSplits(int num_splits) : splits_(num_splits > 1 ? num_splits : 1), by_splits_(splits_) {}

  TPFUSE_HOST_DEVICE int num_splits() const { return splits_; }
  TPFUSE_HOST_DEVICE int tile_of(int step) const { return splits_ == 1 ? step : by_splits_.div(step); }

  // The part of its tile's K loop that `step` multiplies (all of it without splits).
  TPFUSE_HOST_DEVICE KSlice k_slice(int step, int num_k_blocks) const {
    KSlice k{step, 0, 1, 0, num_k_blocks};
    if (splits_ > 1) {
      k.tile_index = by_splits_.div(step);
      k.split = step - k.tile_index * splits_;
      k.num_splits = splits_;
      k.k_block_begin = by_splits_.div(k.split * num_k_blocks);
      k.num_k_blocks = by_splits_.div((k.split + 1) * num_k_blocks) - k.k_block_begin;
    }
    return k;
  }

  // Whether `step` is its tile's last split (every step without splits).
  TPFUSE_HOST_DEVICE bool last_split(int step) const {
    return splits_ == 1 || step - by_splits_.div(step) * splits_ == splits_ - 1;
  }

 private:
  int splits_ = 1;
  FastDivision by_splits_;
};

// The most of `splits` whose steps, `tiles` tiles' worth, fit in `ctas` CTAs (at least 1): a split
// call holds a step per CTA (one wave, a workspace slot each), and ranks emulated on one GPU have
// fewer CTAs than the config planned for.
inline int splits_that_fit(int64_t tiles, int splits, int ctas) {
  while (splits > 1 && tiles * splits > ctas) --splits;
  return splits;
}

class SplitKSchedule {
 public:
  SplitKSchedule() = default;

  // The tiles of `tiles`, each in num_splits >= 1 steps over num_k_blocks >= num_splits K blocks
  // (num_splits * num_k_blocks < 2^31). On the host: the divisor is prepared here.
  SplitKSchedule(const GemmSchedule& tiles, int num_splits, int num_k_blocks)
      : tiles_(tiles), splits_(num_splits), num_k_blocks_(num_k_blocks) {}

  TPFUSE_HOST_DEVICE int num_splits() const { return splits_.num_splits(); }
  TPFUSE_HOST_DEVICE int tiles() const { return tiles_.num_tiles(); }

  // Steps, as the mainloop counts them (a schedule has num_tiles() and tile(step)): S per tile.
  TPFUSE_HOST_DEVICE int num_tiles() const { return tiles_.num_tiles() * splits_.num_splits(); }

  // 0 <= step < num_tiles().
  TPFUSE_HOST_DEVICE Tile tile(int step) const { return tiles_.tile(splits_.tile_of(step)); }

  TPFUSE_HOST_DEVICE KSlice k_slice(int step) const { return splits_.k_slice(step, num_k_blocks_); }

 private:
  GemmSchedule tiles_;
  KSplits splits_;
  int num_k_blocks_ = 0;
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
