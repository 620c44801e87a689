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

// One CTA's end of a call: it adds its share to the call count without waiting for the others or
// for the addition to return (comm/epoch.h), so the epoch moves on with no host involvement
// (CUDA-graph friendly). Every thread of the CTA must have read the epoch before.
__device__ __forceinline__ void finish_call(uint64_t* calls, int cta, int num_ctas) {
  ptx::red_add_u64(calls, call_share(cta, num_ctas));
}

}  // namespace tpfuse::comm
