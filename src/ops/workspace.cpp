// The public communicator: one symmetric workspace per rank, sized for every op that may run on it
// (today the reduce-scatter's, ops/gemm_rs/workspace.h).
#include "comm/communicator.h"
#include "ops/gemm_rs/workspace.h"

namespace tpfuse {

Status communicator_create(ncclComm_t nccl, const CommunicatorOptions& options, Communicator** out) {
  if (nccl == nullptr) return Status::InvalidArgument("comm must not be null");
  int world_size = 0;
  if (ncclCommCount(nccl, &world_size) != ncclSuccess) {
    return Status(StatusCode::kNcclError, "ncclCommCount failed: the communicator is not usable");
  }
  TPFUSE_RETURN_IF_ERROR(check_options(options, world_size));
  return create_nccl_workspace(nccl, options, gemm_rs_workspace(options, world_size), out);
}

Status communicator_create_local(const int* devices, int num_ranks, const CommunicatorOptions& options,
                                 Communicator** out) {
  TPFUSE_RETURN_IF_ERROR(check_options(options, num_ranks));
  return create_local_workspace(devices, num_ranks, options, gemm_rs_workspace(options, num_ranks), out);
}

}  // namespace tpfuse
