// The reduce-scatter op's own part of the kernel's shared memory (gemm/shared_storage.h composes
// it with the mainloop's): the consumers' hand-offs to the sender thread, the partial rounds'
// barriers and the watcher's. Pure C++.
#pragma once

#include <cstdint>

#include "gemm/variants.h"

namespace tpfuse {

// A staged slab handed from a consumer to the sender thread: where its chunk buffers go, and the
// flag to raise once they have landed there.
struct SlabHandoff {
  uint64_t staged;   // the consumer: the chunk buffers hold the slab, the fields below say where it goes
  uint64_t sent;     // the sender: its stores have read the chunk buffers, which may be staged again
  bool to_output;    // this rank's rows, into its output; else pushed to each other owner of the slab
  int first_owner;   // the slab's owners, first_owner .. last_owner (ops/gemm_rs/schedule.h)
  int last_owner;
  int row;           // where the slab's first row lands in first_owner's segment (or the output)
  int col;
  int num_chunks;
  int flag;          // index of the slab's flag in each owner's flag array, raised once landed; -1: none
};

struct PushReduceSync {
  SlabHandoff handoff[kConsumers];
  // Rounds of an own tile's partials into a consumer's chunk buffers during the K loop
  // (ops/gemm_rs/partial_rounds.h): the consumer has asked for the next round; its bytes have landed.
  uint64_t round_empty[kConsumers];
  uint64_t round_full[kConsumers];
  // The watcher thread and the producer: the partials of the next own tile have arrived; the
  // producer has taken that news.
  uint64_t extra_ready;
  uint64_t extra_taken;

  // The compiled variants: the one-consumer ones for the register epilogue only
  // (gemm_reduce_scatter.cu instantiates no other epilogue with them).
  static constexpr bool takes(const GemmVariant& v) { return register_epilogue_takes(v); }
};

}  // namespace tpfuse
