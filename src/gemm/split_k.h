// Split K: the plain GEMM's schedule for outputs whose tiles would leave most SMs idle (small M),
// and the layout of its workspace. Pure C++ that the kernels also compile.
//
// Each tile's K loop of kb K blocks is cut into S splits, each a step of its own: split j of tile t
// is step t * S + j and multiplies K blocks [j * kb / S, (j + 1) * kb / S), so the splits of a tile
// are consecutive steps (in the same wave) and differ by at most one K block:
//
//   S = 3, kb = 10:   step 3t: K blocks 0-2    step 3t + 1: K blocks 3-5    step 3t + 2: K blocks 6-9
//
// Or only the tail is split: the tiles past the last full wave of the grid's CTAs, which alone
// would leave most SMs idle in a last wave of their own (the first W whole tiles a step each, then
// tile W + t's splits at steps W + t * S + j):
//
//   2 CTAs, 5 tiles, S = 2:   steps 0-3: tiles 0-3 whole    steps 4, 5: tile 4's two splits
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

// A tile's K loop of num_k_blocks cut into S >= 1 consecutive steps, for every tile or for those
// from whole_tiles on (split j of split tile t, counted from there, is step whole_tiles + t * S + j):
// each step's tile and K blocks. The schedules that split K keep one (this GEMM's, and the ops'
// over tiles that fill few SMs).
class KSplits {
 public:
  KSplits() = default;

  // On the host: the divisor is prepared here.
  explicit KSplits(int num_splits, int whole_tiles = 0)
      : splits_(num_splits > 1 ? num_splits : 1), whole_tiles_(splits_ > 1 ? whole_tiles : 0), by_splits_(splits_) {}

  TPFUSE_HOST_DEVICE int num_splits() const { return splits_; }
  TPFUSE_HOST_DEVICE int whole_tiles() const { return whole_tiles_; }

  // Steps of `tiles` tiles (at least whole_tiles()).
  TPFUSE_HOST_DEVICE int num_steps(int tiles) const { return whole_tiles_ + (tiles - whole_tiles_) * splits_; }

  TPFUSE_HOST_DEVICE int tile_of(int step) const {
    return step < whole_tiles_ || splits_ == 1 ? step : whole_tiles_ + by_splits_.div(step - whole_tiles_);
  }

  // The part of its tile's K loop that `step` multiplies (all of it for a whole tile). A split
  // tile's tile_index counts the split tiles only: its splits' places in the workspace.
  TPFUSE_HOST_DEVICE KSlice k_slice(int step, int num_k_blocks) const {
    KSlice k{step, 0, 1, 0, num_k_blocks};
    if (splits_ > 1 && step >= whole_tiles_) {
      const int split_step = step - whole_tiles_;
      k.tile_index = by_splits_.div(split_step);
      k.split = split_step - k.tile_index * splits_;
      k.num_splits = splits_;
      k.k_block_begin = by_splits_.div(k.split * num_k_blocks);
      k.num_k_blocks = by_splits_.div((k.split + 1) * num_k_blocks) - k.k_block_begin;
    }
    return k;
  }

  // Whether `step` is its tile's last split (every whole tile's step).
  TPFUSE_HOST_DEVICE bool last_split(int step) const {
    if (splits_ == 1 || step < whole_tiles_) return true;
    const int split_step = step - whole_tiles_;
    return split_step - by_splits_.div(split_step) * splits_ == splits_ - 1;
  }

 private:
  int splits_ = 1;
  int whole_tiles_ = 0;
  FastDivision by_splits_;
};

// The most of `splits` whose steps, `tiles` tiles' worth, fit in `ctas` CTAs (at least 1): a split
// call holds a step per CTA (one wave, a workspace slot each), and ranks emulated on one GPU have
// fewer CTAs than the config planned for.
inline int splits_that_fit(int64_t tiles, int splits, int ctas) {
  while (splits > 1 && tiles * splits > ctas) --splits;
  return splits;
}

// Which tiles a call of `tiles` tiles on `ctas` CTAs splits, and in how many: every tile in the most
// of `splits` that fit, or with tail_only the tiles past the last full wave of `ctas` (none where
// the tiles fill their waves, or where no split of the tail fits).
struct SplitPlan {
  int whole_tiles = 0;
  int splits = 1;
};
inline SplitPlan split_plan(int64_t tiles, int splits, bool tail_only, int ctas) {
  if (!tail_only) return {0, splits_that_fit(tiles, splits, ctas)};
  const int64_t whole = tiles / ctas * ctas;
  const int tail_splits = whole < tiles ? splits_that_fit(tiles - whole, splits, ctas) : 1;
  return tail_splits > 1 ? SplitPlan{int(whole), tail_splits} : SplitPlan{0, 1};
}

class SplitKSchedule {
 public:
  SplitKSchedule() = default;

  // The tiles of `tiles`, each from plan.whole_tiles on in plan.splits >= 1 steps over num_k_blocks
  // >= plan.splits K blocks (plan.splits * num_k_blocks < 2^31). On the host: the divisor is
  // prepared here.
  SplitKSchedule(const GemmSchedule& tiles, SplitPlan plan, int num_k_blocks)
      : tiles_(tiles), splits_(plan.splits, plan.whole_tiles), num_k_blocks_(num_k_blocks) {}

  TPFUSE_HOST_DEVICE int num_splits() const { return splits_.num_splits(); }
  TPFUSE_HOST_DEVICE int whole_tiles() const { return splits_.whole_tiles(); }
  TPFUSE_HOST_DEVICE int tiles() const { return tiles_.num_tiles(); }

  // Steps, as the mainloop counts them (a schedule has num_tiles() and tile(step)): S per split tile.
  TPFUSE_HOST_DEVICE int num_tiles() const { return splits_.num_steps(tiles_.num_tiles()); }

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

// The workspace, for at most `max_steps` split steps (the config never splits more tiles' steps
// than one wave: a step per SM), indexed by the split tiles alone (KSlice::tile_index):
//   partials:     [split step][slab][float4 q][thread][4] FP32: a consumer's accumulators in
//                 register order, so that every thread writes and reads its own 16-byte pieces,
//                 coalesced
//   splits_done:  [split tile][slab] u32: the splits whose partial has landed; the last one sets it
//                 back to 0, so a call leaves every counter as it found it (0)
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
