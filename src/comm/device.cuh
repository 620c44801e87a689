// The device side of a communicator's protocol, shared by the ops: a call's epoch and parity, flags
// compared with it, the bounded wait's failure record, and the epoch's advance at a call's end.
#pragma once

#include <cstdint>

#include "comm/epoch.h"
#include "comm/peer_error.h"
#include "core/ptx.cuh"

namespace tpfuse::comm {

// This call's epoch: one more than the calls this rank has completed (comm/epoch.h). Its parity
// selects the workspace half the call uses.
__device__ __forceinline__ uint32_t call_epoch(const uint64_t* calls) {
  return epoch_of(*reinterpret_cast<const volatile uint64_t*>(calls));
}

// Flag values compare modulo 2^32, so the epoch may wrap.
__device__ __forceinline__ bool epoch_reached(uint32_t flag, uint32_t epoch) { return int32_t(flag - epoch) >= 0; }

// Whether this rank's call has already failed (a wait of it timed out).
__device__ __forceinline__ bool call_failed(const uint32_t* failed) {
  return *reinterpret_cast<const volatile uint32_t*>(failed) != 0;
}

// The first timeout of a rank's call records what it waited for (the host reads it after the
// call, communicator_status) and marks the call failed, which ends every other wait of it.
__device__ __forceinline__ void report_timeout(uint32_t* failed, PeerError* error, int waiting_rank, int missing_rank,
                                               int row, int col) {
  if (atomicCAS(failed, 0u, 1u) != 0u) return;
  volatile PeerError* e = error;
  e->waiting_rank = waiting_rank;
  e->missing_rank = missing_rank;
  e->row = row;
  e->col = col;
  __threadfence_system();
  e->code = 1;
  __threadfence_system();
}

// ---- Bounded waits on other GPUs ------------------------------------------------------------------
// Every wait of a call on another GPU (its flags, or its CTAs' counts) ends by the call's deadline on
// %globaltimer: the first timeout records what was awaited and fails the call, which ends the others.

// What a timed-out wait was waiting for, as the call's timeout record names it.
struct Awaited {
  int missing_rank;
  int row;
  int col;
};

// The deadline of a wait that starts now.
__device__ __forceinline__ uint64_t wait_deadline(uint64_t timeout_ns) { return ptx::globaltimer_ns() + timeout_ns; }

// Polls until `arrived()` holds (returns true) or the wait ends without it (returns false): the call
// failed in another wait (kEndsOnFailure; a wait that must finish in a failed call too does not end
// so), or the deadline passed, which records `awaited()` as the call's timeout. Between polls it
// sleeps kSleepNs, then `reload()` issues the next poll's loads. `p` is an op's kernel params: its
// rank, failed word and timeout record.
// NOTE: ordering is the caller's: `arrived` and `reload` load relaxed (several in flight), and the
// caller fences (fence_acquire_sys) after a wait that returned true, before it reads what the flags
// release.
template <bool kEndsOnFailure, unsigned kSleepNs, class Params, class Arrived, class Reload, class AwaitedOf>
__device__ __forceinline__ bool wait_bounded(const Params& p, uint64_t deadline, Arrived arrived, Reload reload,
                                             AwaitedOf awaited) {
  for (;;) {
    if (arrived()) return true;
    if (kEndsOnFailure && call_failed(p.failed)) return false;
    if (ptx::globaltimer_ns() > deadline) {
      const Awaited a = awaited();
      report_timeout(p.failed, p.error, p.rank, a.missing_rank, a.row, a.col);
      return false;
    }
    __nanosleep(kSleepNs);
    reload();
  }
}

// Flags awaited together: bit f of `waiting` is flag f, not seen at the epoch yet. The flags
// [first, first + kInFlight) are loaded in one go (relaxed, all in flight) into `seen`, and looked at
// after; `flag(f)` is flag f's address.
template <int kInFlight, class FlagOf>
__device__ __forceinline__ void load_flags(uint32_t waiting, int first, FlagOf flag, uint32_t (&seen)[kInFlight]) {
#pragma unroll
  for (int i = 0; i < kInFlight; ++i) {
    if (waiting & (1u << (first + i))) seen[i] = ptx::load_relaxed_sys(flag(first + i));
  }
}

// Clears from `waiting` the flags [first, first + kInFlight) whose loads in `seen` reached the epoch.
template <int kInFlight>
__device__ __forceinline__ uint32_t clear_reached(uint32_t waiting, int first, const uint32_t (&seen)[kInFlight],
                                                  uint32_t epoch) {
#pragma unroll
  for (int i = 0; i < kInFlight; ++i) {
    if ((waiting & (1u << (first + i))) && epoch_reached(seen[i], epoch)) waiting &= ~(1u << (first + i));
  }
  return waiting;
}

// One poll of kFlags flags, kInFlight loads in flight at a time (as many as the polling thread's
// registers hold): returns the flags still waiting.
template <int kFlags, int kInFlight, class FlagOf>
__device__ __forceinline__ uint32_t poll_flags(uint32_t waiting, uint32_t epoch, FlagOf flag) {
  for (int first = 0; first < kFlags; first += kInFlight) {
    uint32_t seen[kInFlight];
    load_flags(waiting, first, flag, seen);
    waiting = clear_reached(waiting, first, seen, epoch);
  }
  return waiting;
}

// One CTA's end of a call: it adds its share to the call count without waiting for the others or
// for the addition to return (comm/epoch.h), so the epoch moves on with no host involvement
// (CUDA-graph friendly). Every thread of the CTA must have read the epoch before.
__device__ __forceinline__ void finish_call(uint64_t* calls, int cta, int num_ctas) {
  ptx::red_add_u64(calls, call_share(cta, num_ctas));
}

}  // namespace tpfuse::comm
