// Tunables and switches come from one place: TPFUSE_PARAM(name, "ENV", default) defines
// `int64_t name()`, read once from the environment.
#pragma once

#include <cstdint>
#include <cstdlib>

#define TPFUSE_PARAM(name, env, default_value)                              \
  inline int64_t name() {                                                   \
    static const int64_t value = [] {                                       \
      const char* text = std::getenv(env);                                  \
      return text != nullptr ? std::strtoll(text, nullptr, 10) : int64_t(default_value); \
    }();                                                                    \
    return value;                                                           \
  }

namespace tpfuse::params {

// 1: log each chosen config and launch shape to stderr.
TPFUSE_PARAM(debug, "TPFUSE_DEBUG", 0)
// CTAs per cluster (1 or 2) instead of the config's choice; 0: the config's choice.
TPFUSE_PARAM(cluster_size, "TPFUSE_CLUSTER_SIZE", 0)
// Tile width (192 or 256, for 128-row tiles) instead of the config's choice; 0: the config's choice.
TPFUSE_PARAM(block_n, "TPFUSE_BLOCK_N", 0)
// Row tiles per raster group instead of the config's choice; 0: the config's choice.
TPFUSE_PARAM(group_rows, "TPFUSE_GROUP_ROWS", 0)
// Rounds from a peer's tile to the own tile of the same rows (plan/schedule.h) instead of the
// config's choice; -1: the config's choice.
TPFUSE_PARAM(own_lag, "TPFUSE_OWN_LAG", -1)
// At most this many rounds of an own tile's peer partials added during its K loop
// (plan/partial_rounds.h); -1: the config's choice.
TPFUSE_PARAM(partial_rounds, "TPFUSE_PARTIAL_ROUNDS", -1)
// 0: bands of two segments reduce this rank's rows in the own band's tiles, not spread over every
// CTA after the tiles; -1: the config's choice.
TPFUSE_PARAM(spread_reduction, "TPFUSE_SPREAD_REDUCTION", -1)
// How long a rank waits for a peer's partial before the call fails with kPeerTimeout.
TPFUSE_PARAM(peer_timeout_ms, "TPFUSE_PEER_TIMEOUT_MS", 10000)

}  // namespace tpfuse::params
