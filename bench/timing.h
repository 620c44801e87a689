// Timing with CUDA events, the way SPEC asks: the median over iterations of the slowest GPU's time,
// each iteration starting with the GPUs aligned, on inputs that are not left in L2 by the last one.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "gpus.h"

namespace tpfuse::bench {

struct TimingOptions {
  int warmup = 20;
  int iters = 200;
  // Hold every GPU at the start of an iteration until the host has queued the whole iteration on
  // all of them, so that host launch time and the skew between GPUs stay out of the times.
  bool gate = true;
};

// Queues one iteration of the timed work on every GPU of the set (streams of the set; NCCL calls
// inside ncclGroupStart/End). `iteration` counts from 0; use it to rotate the input sets.
using LaunchFn = std::function<void(int iteration)>;

// One untimed, ungated call of `launch` first (it loads modules and lets libraries pick kernels:
// neither may happen while the GPUs are held), then `warmup` and `iters` iterations. An iteration's
// time is the slowest GPU's time from its start event to its stop event; returns the median, in ms.
double time_median_ms(GpuSet& gpus, const TimingOptions& options, const LaunchFn& launch);

// The same for several launches compared with each other, interleaved: every iteration times each
// launch once, in order, so that slow drifts of the GPUs (clocks, temperature) fall on all of them
// alike and stay out of their ratios. The `iteration` a launch gets counts all calls of all
// launches, so consecutive calls rotate to different input sets. Returns each launch's median, in
// ms, in the launches' order.
std::vector<double> time_medians_ms(GpuSet& gpus, const TimingOptions& options, const std::vector<LaunchFn>& launches);

// How many input sets to rotate through: enough that one rotation touches about 4x the L2 cache
// (so no iteration finds its operands cached), at most 16, and within `budget_bytes`; at least 1.
int rotation_sets(size_t bytes_per_set, size_t l2_bytes, size_t budget_bytes);

}  // namespace tpfuse::bench
