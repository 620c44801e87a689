// The public communicator: one symmetric workspace per rank, sized for every op that may run on it
// (the reduce-scatter's, ops/gemm_rs/workspace.h; the all-gather's, ops/ag_gemm/workspace.h). The
// ops' calls on one communicator are stream-ordered, so they share it.
#include <algorithm>

#include "comm/communicator.h"
#include "ops/ag_gemm/workspace.h"
#include "ops/gemm_rs/workspace.h"

namespace tpfuse {
namespace {

WorkspaceSize every_op(const CommunicatorOptions& options, int world_size) {
  const WorkspaceSize rs = gemm_rs_workspace(options, world_size);
  const WorkspaceSize ag = all_gather_workspace(options, world_size);
  return {std::max(rs.data_bytes, ag.data_bytes), std::max(rs.flag_words, ag.flag_words),
          std::max(rs.count_words, ag.count_words)};
}

}  // namespace

Status communicator_create(ncclComm_t nccl, const CommunicatorOptions& options, Communicator** out) {
  if (nccl == nullptr) return Status::InvalidArgument("comm must not be null");
  int world_size = 0;
  if (ncclCommCount(nccl, &world_size) != ncclSuccess) {
    return Status(StatusCode::kNcclError, "ncclCommCount failed: the communicator is not usable");
  }
  TPFUSE_RETURN_IF_ERROR(check_options(options, world_size));
  return create_nccl_workspace(nccl, options, every_op(options, world_size), out);
}

Status communicator_create_local(const int* devices, int num_ranks, const CommunicatorOptions& options,
                                 Communicator** out) {
  TPFUSE_RETURN_IF_ERROR(check_options(options, num_ranks));
  return create_local_workspace(devices, num_ranks, options, every_op(options, num_ranks), out);
}

}  // namespace tpfuse
