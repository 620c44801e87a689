// The only environment variables the library reads: TPFUSE_DEBUG (1: log each chosen config and
// launch shape to stderr; 0 or unset: quiet) and TPFUSE_PEER_TIMEOUT_MS (the fallback of
// CommunicatorOptions::peer_timeout_s). Each is read once; a malformed value is an error, never a
// silent default. Tunables for experiments are ConfigOverrides, not variables.
#pragma once

#include <cstdint>

#include "tpfuse/status.h"

namespace tpfuse {

// TPFUSE_DEBUG: unset, "0" or "1".
Status debug_logging(bool* enabled);
// True when TPFUSE_DEBUG=1 (false when it is malformed: the entry points report that).
bool debug_enabled();

// TPFUSE_PEER_TIMEOUT_MS: a positive integer; unset: 10000.
Status default_peer_timeout_ms(int64_t* ms);

}  // namespace tpfuse
