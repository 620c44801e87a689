// The solo-rank proxies' presets (bench/mode_proxy.cu, bench/mode_ag_proxy.cu: one rank of P runs
// alone, its peers' data preset): test support on the library's internals, not part of it.
#pragma once

#include "comm/communicator.h"
#include "tpfuse/problem.h"
#include "tpfuse/status.h"

namespace tpfuse {

// Marks every flag of this rank as raised (for every future call), so that one rank can run alone.
// Its own pushes still land in the peers' buffers. Its counts stay as they are.
Status preset_incoming_flags(Communicator* comm, int local_rank);

// Marks the peers' blocks of `problem` as landed in rank `local_rank`'s gathered buffer for every
// future call, so that the rank can run alone; its own block's flags stay down, for its copier to
// raise (a band of several blocks waits for them).
Status preset_peer_blocks(Communicator* comm, int local_rank, const AllGatherProblem& problem);

}  // namespace tpfuse
