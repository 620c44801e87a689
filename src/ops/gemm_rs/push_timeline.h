// A record of one reduce-scatter call's pushes, for the benchmark's push timeline (mode proxy): when
// each push was issued, its bytes and owner, and the call's start and end. Only the testing
// library's kernels record one (testing/recorded_gemm_rs.cu); the library's carry no trace of it.
#pragma once

#include <cstdint>

namespace tpfuse {

struct PushEvent {
  uint64_t issue_ns;  // %globaltimer when the push's first store was issued
  uint32_t bytes;     // whole boxes: a clipped edge counts in full
  int32_t owner;      // the receiving rank; this rank itself for a store of its own rows into its output
};

struct PushTimeline {
  unsigned long long start_ns;  // the first CTA's start (set to ~0 before the call)
  unsigned long long end_ns;    // the last CTA's end (set to 0 before the call)
  unsigned int count;           // events issued; those past `capacity` are counted, not stored
  unsigned int capacity;
  PushEvent* events;
};

#ifdef __CUDACC__
// One event, from the thread that issues the push.
__device__ __forceinline__ void record_push(PushTimeline* timeline, uint64_t now_ns, uint32_t bytes, int owner) {
  const unsigned int i = atomicAdd(&timeline->count, 1u);
  if (i < timeline->capacity) timeline->events[i] = {now_ns, bytes, owner};
}
#endif

}  // namespace tpfuse
