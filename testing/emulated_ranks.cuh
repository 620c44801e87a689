// The testing library's placement of a fused op's ranks (ops/launch.cuh): ranks that share a device
// are emulated on it, all in one cooperative launch of the op's kernel for kMaxWorldSize ranks, the
// device's resident CTAs split evenly among them; ranks on devices of their own run as the library
// runs them. Emulation checks the protocol on one GPU, not its speed: that kernel indexes a rank's
// parameters at run time, so every parameter read is a global load.
#pragma once

#include <string>

#include "gemm/split_k_workspace.h"
#include "ops/launch.cuh"

namespace tpfuse {

struct EmulatedRanks {
  static constexpr bool kEmulates = true;

  template <class Kernel, class Op>
  static Status launch(const OpCall<Op>& call, size_t smem) {
    if (!call.emulated) return OneRankPerDevice::template launch<Kernel>(call, smem);
    using Config = typename Kernel::Config;
    const int num_ranks = int(call.local_ranks.size());
    const int device = call.comm.ranks[call.local_ranks[0]].device;
    for (int i : call.local_ranks) {
      const RankState& rank = call.comm.ranks[i];
      if (rank.device != device) {
        return Status::InvalidArgument("ranks are emulated where all of a call's share one device: rank " +
                                       std::to_string(rank.rank) + " is on device " + std::to_string(rank.device) +
                                       ", not " + std::to_string(device));
      }
    }
    typename Kernel::template Launch<kMaxWorldSize> launch{};
    int ctas = 0;
    TPFUSE_RETURN_IF_ERROR(
        (resident_grid<Config>(Kernel::template kernel<kMaxWorldSize>(), smem, call.config.gemm.num_ctas, &ctas)));
    launch.ctas_per_rank = ctas / num_ranks;
    if (launch.ctas_per_rank == 0) {
      return Status::InvalidArgument(std::to_string(num_ranks) + " emulated ranks do not fit on one GPU's " +
                                     std::to_string(ctas) + " resident CTAs");
    }
    const typename Op::Config rank_config = Op::config_that_fits(call.problem, call.config, launch.ctas_per_rank);
    SplitKWorkspace split;
    // Sized for the device's SMs, as the plain GEMM's on the same stream (the two share it).
    if (rank_config.gemm.split_k > 1) {
      TPFUSE_RETURN_IF_ERROR(split_k_workspace(call.streams[0], call.num_sms, &split));
    }
    for (int i = 0; i < num_ranks; ++i) {
      TPFUSE_RETURN_IF_ERROR(Op::template make_rank_params<Config>(
          call.comm, call.comm.ranks[call.local_ranks[i]], call.problem, rank_config, call.operands, i,
          emulated_rank_part(split, i, launch.ctas_per_rank), &launch.ranks[i]));
    }
    return launch_op_kernel<Kernel, kMaxWorldSize>(Op::kName, launch, num_ranks, smem, /*cooperative=*/true,
                                                    call.debug, call.streams[0]);
  }
};

}  // namespace tpfuse
