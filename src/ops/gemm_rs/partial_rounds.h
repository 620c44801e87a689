// Rounds of an own tile's peer partials added during the tile's K loop.
//
// A consumer's chunk buffers (the epilogue's staging space) sit idle while a tile is multiplied.
// For a tile of this rank's own rows the watcher thread loads its peers' partials of the
// consumer's slab into them, one peer a round, and the consumer adds each round to its FP32
// accumulators between two K blocks, while the other consumer's WGMMAs keep the tensor cores
// busy. The peers that no round holds go through the ring after the K stages, as before:
//
//   16 K blocks, 6 rounds (peers 0-5 of 7; peer 6 through the ring):
//   consumer 0:  0 1 2 3 [+r0] 4 5 [+r1] 6 7 [+r2] 8 9 [+r3] 10 11 [+r4] 12 13 [+r5] 14 15
//   consumer 1:  0 1 2 3 4 [+r0] 5 6 [+r1] 7 8 [+r2] 9 10 [+r3] 11 12 [+r4] 13 14 [+r5] 15
//
// The rounds end after the K block before the last one, whatever their number, so that round 0's
// loads have as long as the K loop allows: it is asked for after K block 0 (once the sender has
// read the previous slab out of the buffers), round r + 1 right after round r is added. Every
// element still gets its partials in one fixed order (peer by peer).
#pragma once

#include "core/host_device.h"

namespace tpfuse {

struct PartialRounds {
  static constexpr int kFirstAdd = 2;  // consumer 0 adds round 0 after this K block at the earliest
  static constexpr int kStagger = 1;   // consumer c adds c K blocks after consumer 0
  // K blocks from one round to the next (a round's loads in flight): 2 measured faster than 3 or 4
  // (docs/EXPERIMENTS.md).
  static constexpr int kSpacing = 2;
};

// The K block after which `consumer` (of `consumers`) adds `round` of a tile's `rounds`: the last
// consumer's last round after the K block before the last one, the others before it (so that
// round 0's loads have as long as the K loop allows).
TPFUSE_HOST_DEVICE int partial_round_k_block(int consumer, int consumers, int round, int rounds, int num_k_blocks) {
  return num_k_blocks - 2 - (consumers - 1 - consumer) * PartialRounds::kStagger -
         (rounds - 1 - round) * PartialRounds::kSpacing;
}

// Rounds a tile of `num_k_blocks` K blocks holds: consumer 0 adds round 0 no earlier than
// kFirstAdd, and no more rounds than the peers' pieces fill (`max_rounds`).
TPFUSE_HOST_DEVICE int partial_rounds_that_fit(int num_k_blocks, int consumers, int max_rounds) {
  const int last_first = num_k_blocks - 2 - (consumers - 1) * PartialRounds::kStagger;  // consumer 0's last round
  if (last_first < PartialRounds::kFirstAdd) return 0;
  const int fit = (last_first - PartialRounds::kFirstAdd) / PartialRounds::kSpacing + 1;
  return fit < max_rounds ? fit : max_rounds;
}

}  // namespace tpfuse
