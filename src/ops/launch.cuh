// One launch path for the fused ops: the checks every call makes, the config choice, the kernel
// variant, the grid on each rank's GPU, the per-rank parameters and the launch. An op supplies its
// traits, a struct `Op` with:
//
//   using Problem, Config, Operands;     its problem, its config (with a GemmConfig `gemm`), the
//                                        operand arrays of a call (one entry per local rank)
//   static constexpr const char* kName;  for the debug log (TPFUSE_DEBUG=1)
//   check(comm, problem, num_ranks, operands, streams)      its own checks: capacity, operands
//   select_config(problem, device, overrides, &config)      its config choice (pure C++)
//   config_that_fits(problem, config, ctas_per_rank)        the config for the CTAs a rank got
//   with_kernel(problem, config, fn)     calls fn(kernel) with a type that names the kernel (an
//                                        OpKernel: Config, the mainloop's; Launch<kLocalRanks>, its
//                                        parameter) and kernel<kLocalRanks, kRecordsPushes>() (the
//                                        __global__; kRecordsPushes, default false: the testing
//                                        library's push timeline, which only the reduce-scatter has)
//   make_rank_params<Config>(comm, rank, problem, config, operands, i, split, &params)
//   after_launch(comm, problem, local_ranks, operands, streams, emulated)   what follows the kernel
//
// Where the ranks run is the launch's placement, a struct with:
//
//   static constexpr bool kEmulates;     whether it runs ranks that share a device (else launch_op
//                                        refuses them)
//   launch<Kernel>(call, smem)           launches the kernel for every rank of an OpCall
//
// The library has one, OneRankPerDevice: every rank a persistent grid of its own on its GPU (the
// kernels' Launch<1>), and calls whose ranks share a device fail with kUnsupported. Only the testing
// library emulates those (testing/emulated_ranks.cuh), or records a call's pushes
// (OneRankPerDeviceOf<true>): its placements instantiate those kernels, so the library ships none.
//
// Host code only: the kernels are the ops' own.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/cuda_check.h"
#include "core/device_info.h"
#include "core/env.h"
#include "gemm/launch.cuh"
#include "gemm/split_k_workspace.h"
#include "tpfuse/overrides.h"
#include "tpfuse/problem.h"

namespace tpfuse {

// One operand of a call: its array of device pointers, one a local rank, and its name. An optional
// one may be null, or any of its entries.
struct OperandArray {
  const void* const* pointers;
  const char* name;
  bool optional = false;
};

// Every op's checks of its operands: no required array (nor the streams) null, and each rank's
// pointers non-null and 16-byte aligned (validate_operand), rank by rank.
inline Status check_operands(std::initializer_list<OperandArray> operands, const cudaStream_t* streams,
                             size_t num_ranks) {
  std::string required;
  bool missing = streams == nullptr;
  for (const OperandArray& o : operands) {
    if (o.optional) continue;
    required += std::string(required.empty() ? "" : ", ") + o.name;
    missing = missing || o.pointers == nullptr;
  }
  if (missing) return Status::InvalidArgument("the operand arrays " + required + " and streams must not be null");
  for (size_t i = 0; i < num_ranks; ++i) {
    for (const OperandArray& o : operands) {
      if (o.optional && (o.pointers == nullptr || o.pointers[i] == nullptr)) continue;
      TPFUSE_RETURN_IF_ERROR(validate_operand(o.pointers[i], o.name));
    }
  }
  return Status::Ok();
}

// What every op's epilogue params hold of the call: the rank, its call count (the epoch), and what
// its bounded waits read (comm::wait_bounded): the failed word, the timeout record and the timeout.
template <class EpilogueParams>
void set_call_params(const Communicator& comm, const RankState& rank, EpilogueParams* e) {
  e->rank = rank.rank;
  e->world_size = comm.world_size;
  e->calls = rank.calls;
  e->failed = rank.failed;
  e->error = rank.error_device;
  e->timeout_ns = comm.timeout_ns;
}

// What an op's kernel type names besides its __global__ (kernel<kLocalRanks, kRecordsPushes>()): the
// mainloop's config and the launch parameter of kLocalRanks ranks.
template <class MainloopConfig, template <int> class LaunchOf>
struct OpKernel {
  using Config = MainloopConfig;
  template <int kLocalRanks>
  using Launch = LaunchOf<kLocalRanks>;
};

// Launches `grid` CTAs of a kernel over num_ranks ranks of `launch`.
template <class Kernel, int kLocalRanks, bool kRecordsPushes = false>
Status launch_op_kernel(const char* name, const typename Kernel::template Launch<kLocalRanks>& launch, int num_ranks,
                        size_t smem, bool cooperative, bool debug, cudaStream_t stream) {
  using Config = typename Kernel::Config;
  if (debug) {
    std::fprintf(stderr, "tpfuse: %s launch %d rank(s) x %d CTAs x %d threads, %zu B smem%s\n", name, num_ranks,
                 launch.ctas_per_rank, Config::kThreads, smem, cooperative ? ", cooperative" : "");
  }
  return launch_persistent<Config>(Kernel::template kernel<kLocalRanks, kRecordsPushes>(), launch,
                                   launch.ctas_per_rank * num_ranks, smem, cooperative, stream);
}

// A checked call of an op, its config chosen: what a placement launches.
template <class Op>
struct OpCall {
  const Communicator& comm;
  const typename Op::Problem& problem;
  const std::vector<int>& local_ranks;
  const typename Op::Operands& operands;
  const cudaStream_t* streams;
  const typename Op::Config& config;
  int num_sms;    // of the first rank's device
  bool emulated;  // some of its ranks share a device
  bool debug;
};

// "ranks 0 and 2 share device 1" for the first two of `local_ranks` on one device; empty where each
// has a device of its own.
inline std::string shared_device(const Communicator& comm, const std::vector<int>& local_ranks) {
  for (size_t j = 1; j < local_ranks.size(); ++j) {
    for (size_t i = 0; i < j; ++i) {
      const RankState& a = comm.ranks[local_ranks[i]];
      const RankState& b = comm.ranks[local_ranks[j]];
      if (a.device == b.device) {
        return "ranks " + std::to_string(a.rank) + " and " + std::to_string(b.rank) + " share device " +
               std::to_string(a.device);
      }
    }
  }
  return "";
}

// The library's placement: each rank on a device of its own, in a persistent grid of its own there,
// its parameters indexed at compile time (Launch<1>). Every rank's parameters are made (and so its
// operands checked) before any rank launches: a rank that launched would wait for a refused one
// until its timeout. kRecordsPushes: the kernels that record their pushes (the testing library's).
template <bool kRecordsPushes>
struct OneRankPerDeviceOf {
  static constexpr bool kEmulates = false;

  template <class Kernel, class Op>
  static Status launch(const OpCall<Op>& call, size_t smem) {
    using Config = typename Kernel::Config;
    std::vector<typename Kernel::template Launch<1>> launches(call.local_ranks.size());
    for (size_t i = 0; i < call.local_ranks.size(); ++i) {
      const RankState& rank = call.comm.ranks[call.local_ranks[i]];
      TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
      typename Kernel::template Launch<1>& launch = launches[i];
      TPFUSE_RETURN_IF_ERROR((resident_grid<Config>(Kernel::template kernel<1, kRecordsPushes>(), smem,
                                                    call.config.gemm.num_ctas, &launch.ctas_per_rank)));
      const typename Op::Config rank_config = Op::config_that_fits(call.problem, call.config, launch.ctas_per_rank);
      SplitKWorkspace split;
      if (rank_config.gemm.split_k > 1) {
        TPFUSE_RETURN_IF_ERROR(split_k_workspace(call.streams[i], call.num_sms, &split));
      }
      TPFUSE_RETURN_IF_ERROR(Op::template make_rank_params<Config>(call.comm, rank, call.problem, rank_config,
                                                                   call.operands, int(i), split, &launch.ranks[0]));
    }
    for (size_t i = 0; i < call.local_ranks.size(); ++i) {
      TPFUSE_CUDA_TRY(cudaSetDevice(call.comm.ranks[call.local_ranks[i]].device));
      TPFUSE_RETURN_IF_ERROR((launch_op_kernel<Kernel, 1, kRecordsPushes>(
          Op::kName, launches[i], 1, smem, /*cooperative=*/false, call.debug, call.streams[i])));
    }
    return Status::Ok();
  }
};
using OneRankPerDevice = OneRankPerDeviceOf<false>;

// Launches the op for the local ranks listed in `local_ranks` (indices into comm->ranks), with their
// operands, where `Placement` puts them.
template <class Op, class Placement = OneRankPerDevice>
Status launch_op(Communicator* comm, const typename Op::Problem& problem, const std::vector<int>& local_ranks,
                 const typename Op::Operands& operands, const cudaStream_t* streams,
                 const ConfigOverrides& overrides) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  TPFUSE_RETURN_IF_ERROR(check_call_ranks(*comm, problem.world_size, local_ranks));
  TPFUSE_RETURN_IF_ERROR(validate(problem));
  TPFUSE_RETURN_IF_ERROR(Op::check(*comm, problem, local_ranks.size(), operands, streams));
  const std::string shared = shared_device(*comm, local_ranks);
  if (!shared.empty() && !Placement::kEmulates) {
    return Status::Unsupported(shared + ": tpfuse runs one rank per device; ranks that share a device are emulated "
                               "only by its testing library, for tests");
  }
  bool debug = false;
  TPFUSE_RETURN_IF_ERROR(debug_logging(&debug));

  TPFUSE_CUDA_TRY(cudaSetDevice(comm->ranks[local_ranks[0]].device));
  DeviceInfo device;
  TPFUSE_RETURN_IF_ERROR(current_device_info(&device));
  typename Op::Config config;
  TPFUSE_RETURN_IF_ERROR(Op::select_config(problem, device, overrides, &config));
  if (debug) {
    std::fprintf(stderr, "tpfuse: %s %s, overrides %s -> %s\n", Op::kName, problem.to_string().c_str(),
                 overrides.to_string().c_str(), config.to_string().c_str());
  }

  const OpCall<Op> call{*comm, problem, local_ranks, operands, streams, config, device.num_sms, !shared.empty(), debug};
  const Status launched = Op::with_kernel(problem, config, [&](auto kernel) -> Status {
    using Kernel = decltype(kernel);
    size_t smem = 0;
    TPFUSE_RETURN_IF_ERROR(kernel_smem_bytes<typename Kernel::Config>(config.gemm, &smem));
    return Placement::template launch<Kernel>(call, smem);
  });
  TPFUSE_RETURN_IF_ERROR(launched);
  return Op::after_launch(*comm, problem, local_ranks, operands, streams, call.emulated);
}

// The public entry points of an op: a communicator of one rank (`operands` holds its one rank's), or
// every local rank of it.
template <class Op>
Status launch_op_on_one_rank(Communicator* comm, const typename Op::Problem& problem,
                             const typename Op::Operands& operands, const cudaStream_t* stream,
                             const ConfigOverrides& overrides) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  if (comm->ranks.size() != 1) {
    return Status::InvalidArgument("this communicator runs " + std::to_string(comm->ranks.size()) +
                                   " local ranks: use " + Op::kName + "_local");
  }
  return launch_op<Op>(comm, problem, {0}, operands, stream, overrides);
}

template <class Op>
Status launch_op_on_local_ranks(Communicator* comm, const typename Op::Problem& problem,
                                const typename Op::Operands& operands, const cudaStream_t* streams,
                                const ConfigOverrides& overrides) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  std::vector<int> all(comm->ranks.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = int(i);
  return launch_op<Op>(comm, problem, all, operands, streams, overrides);
}

}  // namespace tpfuse
