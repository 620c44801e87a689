// An optional record of one reduce-scatter call's pushes, for the benchmark's push timeline (mode
// proxy): when each push was issued, its bytes and owner, and the call's start and end. Null in
// every other call, where it costs a predicated branch.
#pragma once

#include <cstdint>

namespace tpfuse {

struct PushEvent {
  uint64_t issue_ns;  // %globaltimer when the push's first store was issued
  uint32_t bytes;     // whole boxes: a clipped edge counts in full
  int32_t owner;      // the receiving rank; this rank itself for a store of its own rows into its output
};

#if TPFUSE_PROBE_E1 >= 1
// Probe E1 of issue 51: stamps of each CTA's steps, %globaltimer and the SM's clock64 (durations
// inside a CTA are taken from the clock, converted to ns by the CTA's own start-to-end ratio).
enum class ProbeKind : uint8_t {
  kCtaStart,    // thread 0, as the CTA starts
  kCtaEnd,      // thread 0, after the CTA's last barrier
  kKLoopEnd,    // each consumer's leader, as a step's K loop ends (sub: the consumer)
  kSweepStart,  // the sweeper, once the sender has read the step's chunk buffers
  kSweepEnd,    // the sweeper, before it arrives on sweep_done
  kWaitBegin,   // each consumer's leader, before it waits on sweep_done to stage its step
  kWaitEnd,
};
struct ProbeEvent {
  uint64_t ns;     // %globaltimer
  uint64_t clk;    // clock64 of the SM
  uint32_t step;   // the CTA's step (0, 1, ...): a K loop's, a sweep's, or the one a wait stages
  uint16_t cta;    // blockIdx.x
  uint8_t kind;    // ProbeKind
  uint8_t sub;     // the consumer
};
#endif

struct PushTimeline {
  unsigned long long start_ns;  // the first CTA's start (set to ~0 before the call)
  unsigned long long end_ns;    // the last CTA's end (set to 0 before the call)
  unsigned int count;           // events issued; those past `capacity` are counted, not stored
  unsigned int capacity;
  PushEvent* events;
#if TPFUSE_PROBE_E1 >= 1
  unsigned int probe_count;     // as count and capacity, for the probe's stamps
  unsigned int probe_capacity;
  ProbeEvent* probe_events;
#endif
};

#ifdef __CUDACC__
// One event, from the thread that issues the push.
__device__ __forceinline__ void record_push(PushTimeline* timeline, uint64_t now_ns, uint32_t bytes, int owner) {
  const unsigned int i = atomicAdd(&timeline->count, 1u);
  if (i < timeline->capacity) timeline->events[i] = {now_ns, bytes, owner};
}

#if TPFUSE_PROBE_E1 >= 1
__device__ __forceinline__ void record_probe(PushTimeline* timeline, ProbeKind kind, int step, int sub = 0) {
  uint64_t ns, clk;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(clk));
  const unsigned int i = atomicAdd(&timeline->probe_count, 1u);
  if (i < timeline->probe_capacity) {
    timeline->probe_events[i] = {ns, clk, uint32_t(step), uint16_t(blockIdx.x), uint8_t(kind), uint8_t(sub)};
  }
}
#endif
#endif

}  // namespace tpfuse
