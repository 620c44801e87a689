#include "testing/solo_rank.h"

#include <cstdint>

#include "core/cuda_check.h"
#include "ops/ag_gemm/workspace.h"

namespace tpfuse {

Status preset_incoming_flags(Communicator* comm, int local_rank) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  if (local_rank < 0 || local_rank >= int(comm->ranks.size())) return Status::InvalidArgument("no such local rank");
  const RankState& rank = comm->ranks[local_rank];
  TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
  // 0x7F7F7F7F is at or past every epoch this communicator will reach (modulo-2^32 comparison).
  TPFUSE_CUDA_TRY(cudaMemset(rank.flags, 0x7F, 2 * comm->parity.flag_words * sizeof(uint32_t)));
  return Status::Ok();
}

Status preset_peer_blocks(Communicator* comm, int local_rank, const AllGatherProblem& problem) {
  TPFUSE_RETURN_IF_ERROR(preset_incoming_flags(comm, local_rank));
  const RankState& rank = comm->ranks[local_rank];
  const size_t row_blocks = size_t(copy_row_blocks(problem.rows_per_rank()));
  for (int parity = 0; parity < 2; ++parity) {
    uint32_t* own = rank.flags + size_t(parity) * comm->parity.flag_words + size_t(rank.rank) * row_blocks;
    TPFUSE_CUDA_TRY(cudaMemset(own, 0, row_blocks * sizeof(uint32_t)));
  }
  return Status::Ok();
}

}  // namespace tpfuse
