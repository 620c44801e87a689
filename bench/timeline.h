// The push timeline of one recorded fused call (mode proxy --timeline): what the kernel's
// PushTimeline recorded, summed up per shape so that the JSON stays small. Pure C++ (CPU tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ops/gemm_rs/push_timeline.h"

namespace tpfuse::bench {

// Equal parts of [call start, last push] over which the pushed bytes are binned.
constexpr int kTimelineBins = 100;

struct TimelineSummary {
  double call_us = 0;         // the first CTA's start to the last CTA's end
  double pushed_bytes = 0;    // to other ranks, as recorded (whole boxes)
  int pushes = 0;             // recorded events to other ranks
  uint64_t dropped = 0;       // events past the buffer's capacity (then the rest is incomplete)
  double share[3] = {};       // of the pushed bytes, issued by 25%, 50% and 75% of the call
  double first_push = 0;      // issue times as fractions of the call
  double last_push = 0;
  double last_own = -1;       // the last store of this rank's own rows (-1: none recorded)
  std::vector<double> bins;   // kTimelineBins shares of the pushed bytes, each part of [0, last_push]
};

// `count`: the kernel's event count (events holds min(count, capacity) of them).
TimelineSummary summarize_timeline(uint64_t start_ns, uint64_t end_ns, const std::vector<PushEvent>& events,
                                   uint32_t count, int rank);

// The bins as "0.0123 0.0100 ...", for the JSON.
std::string bins_text(const std::vector<double>& bins);

}  // namespace tpfuse::bench
