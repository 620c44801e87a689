// Timing with CUDA events, the way docs/SPEC.md asks: the median over iterations of the slowest GPU's time,
// each iteration starting with the GPUs aligned, on inputs that are not left in L2 by the last one;
// with it, the host's time per call and the GPUs' SM clock and power during the timed iterations.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "gpus.h"
#include "loop_order.h"
#include "rotation.h"
#include "sensors.h"

namespace tpfuse::bench {

// How often the SM clock and power are read during a timed loop (a read takes about a microsecond):
// a few clock readings per launch even in a loop of small shapes.
inline constexpr std::chrono::milliseconds kSensorPeriod{1};

struct TimingOptions {
  int warmup = 20;
  int iters = 200;
  // Hold every GPU at the start of an iteration until the host has queued the whole iteration on
  // all of them, so that host launch time and the skew between GPUs stay out of the times.
  bool gate = true;
  // Sample the GPUs' SM clock and power during the timed iterations (see LoopTiming).
  bool read_sensors = true;
  // Each launch's warm-up and iterations in a row, one launch after the other, instead of every
  // iteration timing each launch in turn: each then runs at the clock its own power draw sets, and
  // has a power of its own (LoopSensors::launch_power_w).
  bool separate_loops = false;
  // Two launches compared with each other (--compare): in the interleaved loop they trade places every
  // other iteration (launch_order), and each one's time is the geometric mean of its medians in the two
  // places (placed_median). Unused with separate loops.
  std::optional<AlternatePair> alternate;
};

// With separate loops a launch's warm-up lasts at least kSettleSeconds, so that the clock settles
// where its own power draw sets it, and its timed iterations at least kSeparateTimedSeconds, so
// that the energy counter steps often enough in them (kMinEnergySteps) to give its power.
inline constexpr double kSettleSeconds = 0.3;
inline constexpr double kSeparateTimedSeconds = 0.35;

// Queues one iteration of the timed work on every GPU of the set (streams of the set; NCCL calls
// inside ncclGroupStart/End). `call` numbers the calls from 0; rotation_set(call, num_sets) is the
// input set to take.
using LaunchFn = std::function<void(int call)>;

// The timed loop's results for one launch.
struct LaunchTiming {
  double median_ms = 0;  // the slowest GPU's time from its start event to its stop event
  double host_us = 0;    // the host's time to queue one call (`launch` alone, no graph), median
};

struct LoopTiming {
  std::vector<LaunchTiming> launches;  // in the launches' order
  LoopSensors sensors;  // SM clock per launch and power, sampled during the timed iterations
};

// Several launches compared with each other, interleaved: one untimed, ungated call of each first
// (it loads modules and lets libraries pick kernels: neither may happen while the GPUs are held),
// then `warmup` and `iters` iterations, each timing every launch once, in order (but for the pair
// options.alternate, which trades places every other iteration), so that slow drifts of the GPUs
// (clocks, temperature) fall on all of them alike and stay out of their ratios. The number a call
// gets counts all calls of all launches in the order they run, so consecutive calls rotate to
// different input sets.
LoopTiming time_loop(GpuSet& gpus, const TimingOptions& options, const std::vector<LaunchFn>& launches);

// One launch alone: its median time, in ms.
double time_median_ms(GpuSet& gpus, const TimingOptions& options, const LaunchFn& launch);


}  // namespace tpfuse::bench
