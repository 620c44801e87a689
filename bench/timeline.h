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

#if TPFUSE_PROBE_E1 >= 1
// Probe E1 of issue 51: the recorded call's step stamps (ProbeEvent), per shape. Durations inside a
// CTA come from its SM's clock, converted to ns by that CTA's own start-to-end ratio of %globaltimer
// to clock64. A wait's step is its consumer's interval between the K loop ends of that step and the
// one before.
struct ProbeSummary {
  int ctas = 0;               // CTAs with a start and an end stamp
  uint64_t dropped = 0;       // stamps past the buffer's capacity (then the rest is incomplete)
  double step_ns = 0;         // mean step (a consumer's K loop end to its next)
  int sweeps = 0;             // the sweeper's steps (sweep build only)
  double sweep_ns = 0;        // mean and max of a sweep's start to its end
  double sweep_max_ns = 0;
  double sweep_frac = 0;      // mean sweep / mean step
  int waits = 0;              // the consumers' waits on sweep_done
  double wait_ns = 0;         // mean and max of those waits
  double wait_max_ns = 0;
  double wait_frac = 0;       // mean wait / mean step
  double wait_max_frac = 0;   // max of a wait / its step
  int late = 0;               // sweeps that ended after a consumer began to wait for them
  int late_of = 0;            // sweeps that a consumer waited for (not a CTA's last)
  double late_max_ns = 0;     // the latest of those ends after the first consumer's wait began
  double tail_max = 0;        // E4: (CTA end - its last K loop end) / the call, max and mean over CTAs
  double tail_mean = 0;
};

ProbeSummary summarize_probe(uint64_t start_ns, uint64_t end_ns, const std::vector<ProbeEvent>& events,
                             uint32_t count);
#endif

}  // namespace tpfuse::bench
