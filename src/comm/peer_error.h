// What a rank records when a peer never arrives (in host-mapped memory, read by the host).
#pragma once

#include <cstdint>

namespace tpfuse {

struct PeerError {
  uint32_t code;  // 0: none; 1: a wait for a peer expired
  uint32_t waiting_rank;
  uint32_t missing_rank;
  uint32_t row;  // first row of the slab it waited for
  uint32_t col;  // first column of that slab
};

}  // namespace tpfuse
