// The fused GEMM + reduce-scatter entry points: checks, config, parameters, launch.
#include <cstdio>

#include "kernels/fused_kernel.cuh"
#include "runtime/communicator.h"
#include "runtime/launch.cuh"

namespace tpfuse {
namespace {

Status check_call(const Communicator& comm, const Problem& problem, const std::vector<int>& local_ranks,
                  const void* const* a, const void* const* w, void* const* out, const cudaStream_t* streams) {
  if (problem.world_size != comm.world_size) {
    return Status::InvalidArgument("problem.world_size = " + std::to_string(problem.world_size) +
                                   " differs from the communicator's " + std::to_string(comm.world_size) + " ranks");
  }
  TPFUSE_RETURN_IF_ERROR(validate(problem));
  if (problem.m > comm.max_m || problem.n > comm.max_n) {
    return Status::InvalidArgument("problem " + problem.to_string() + " exceeds the communicator's capacity (max_m " +
                                   std::to_string(comm.max_m) + ", max_n " + std::to_string(comm.max_n) + ")");
  }
  if (a == nullptr || w == nullptr || out == nullptr || streams == nullptr) {
    return Status::InvalidArgument("the operand arrays a, w, out and streams must not be null");
  }
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    TPFUSE_RETURN_IF_ERROR(validate_operand(a[i], "a"));
    TPFUSE_RETURN_IF_ERROR(validate_operand(w[i], "w"));
    TPFUSE_RETURN_IF_ERROR(validate_operand(out[i], "out"));
  }
  return communicator_status(&comm);
}

template <class Config>
Status make_rank_params(const Communicator& comm, const RankState& rank, const Problem& problem,
                        const GemmConfig& config, const void* a, const void* w, void* out,
                        kernels::FusedRankParams* rp) {
  TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, config, rank.rank, a, w, &rp->mainloop));
  const TileSchedule& schedule = rp->mainloop.schedule;
  kernels::PushReduceEpilogue::Params& e = rp->epilogue;
  e.rank = rank.rank;
  e.world_size = comm.world_size;
  e.rows_per_rank = int(problem.rows_per_rank());
  e.n = int(problem.n);
  e.col_tiles = schedule.col_tiles();
  e.block_m = Config::kBlockM;
  e.block_n = Config::kBlockN;
  e.tiles_per_band = schedule.tiles_per_band();
  for (int owner = 0; owner < comm.world_size; ++owner) {
    TPFUSE_RETURN_IF_ERROR(make_receive_tensor_map(rank.recv_at[owner], comm.world_size, problem.rows_per_rank(),
                                                   problem.n, int64_t(comm.recv_parity_elems), kernels::kChunkRows,
                                                   kernels::kChunkCols, &e.recv_at[owner]));
    e.flags_at[owner] = rank.flags_at[owner];
  }
  e.recv = static_cast<const __nv_bfloat16*>(rank.recv_at[rank.rank]);
  e.recv_parity_elems = comm.recv_parity_elems;
  TPFUSE_RETURN_IF_ERROR(make_tensor_map_bf16(out, problem.rows_per_rank(), problem.n, problem.n, kernels::kChunkRows,
                                              kernels::kChunkCols, &e.out));
  e.flags_parity_words = comm.flags_parity_words;
  e.calls = rank.calls;
  e.failed = rank.failed;
  e.error = rank.error_device;
  e.timeout_ns = comm.timeout_ns;
  rp->calls = rank.calls;
  return Status::Ok();
}

template <class Config, int kLocalRanks>
Status launch_fused_kernel(const kernels::FusedLaunch<kLocalRanks>& launch, int num_ranks, bool cooperative,
                           cudaStream_t stream) {
  const auto kernel = kernels::fused_kernel<Config, kLocalRanks>;
  const size_t smem = sizeof(kernels::SharedStorage<Config>) + 1024;
  TPFUSE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  if (params::debug()) {
    std::fprintf(stderr, "tpfuse: fused launch %d rank(s) x %d CTAs x %d threads (clusters of %d), %zu B smem%s\n",
                 num_ranks, launch.ctas_per_rank, Config::kThreads, Config::kCluster, smem,
                 cooperative ? ", cooperative" : "");
  }
  return launch_persistent<Config>(kernel, launch, launch.ctas_per_rank * num_ranks, smem, cooperative, stream);
}

// The persistent grid of one rank: at most the config's CTAs, whole clusters, all resident.
template <class Config, int kLocalRanks>
Status rank_grid(const GemmConfig& config, int* ctas) {
  const auto kernel = kernels::fused_kernel<Config, kLocalRanks>;
  const size_t smem = sizeof(kernels::SharedStorage<Config>) + 1024;
  TPFUSE_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  return resident_grid<Config>(kernel, smem, config.num_ctas, ctas);
}

}  // namespace

Status launch_fused(Communicator* comm, const Problem& problem, const std::vector<int>& local_ranks,
                    const void* const* a, const void* const* w, void* const* out, const cudaStream_t* streams) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  TPFUSE_RETURN_IF_ERROR(check_call(*comm, problem, local_ranks, a, w, out, streams));
  const int num_ranks = int(local_ranks.size());
  const RankState& first = comm->ranks.at(local_ranks.at(0));
  bool one_device = true;
  for (int i : local_ranks) one_device = one_device && comm->ranks.at(i).device == first.device;

  TPFUSE_CUDA_TRY(cudaSetDevice(first.device));
  GemmConfig config;
  TPFUSE_RETURN_IF_ERROR(choose_config(problem, "gemm_reduce_scatter", &config));
  // Clusters are the plain GEMM's option only: an own tile's extra stages (its peers' partials) would
  // break the lockstep of a cluster's shared ring.
  if (config.cluster_size != 1 && params::debug()) {
    std::fprintf(stderr, "tpfuse: gemm_reduce_scatter runs without clusters (TPFUSE_CLUSTER_SIZE is the GEMM's)\n");
  }
  config.cluster_size = 1;

  const bool k_major = problem.weight_layout == WeightLayout::kNxK;
  return with_tile_config<1>(config, k_major, [&](auto mainloop_config) -> Status {
    using Config = decltype(mainloop_config);
    if (num_ranks > 1 && one_device) {
      // Ranks emulated on one GPU: one cooperative launch, the SMs split evenly among them.
      kernels::FusedLaunch<kMaxWorldSize> launch{};
      int ctas = 0;
      TPFUSE_RETURN_IF_ERROR((rank_grid<Config, kMaxWorldSize>(config, &ctas)));
      // Whole clusters per rank, so that no cluster spans two ranks.
      launch.ctas_per_rank = ctas / num_ranks / Config::kCluster * Config::kCluster;
      if (launch.ctas_per_rank == 0) {
        return Status::InvalidArgument(std::to_string(num_ranks) + " emulated ranks do not fit on one GPU's " +
                                       std::to_string(ctas) + " resident CTAs");
      }
      for (int i = 0; i < num_ranks; ++i) {
        TPFUSE_RETURN_IF_ERROR(make_rank_params<Config>(*comm, comm->ranks[local_ranks[i]], problem, config, a[i], w[i],
                                                        out[i], &launch.ranks[i]));
      }
      return launch_fused_kernel<Config>(launch, num_ranks, /*cooperative=*/true, streams[0]);
    }
    // One rank per GPU: a persistent grid of its own on each.
    for (int i = 0; i < num_ranks; ++i) {
      const RankState& rank = comm->ranks.at(local_ranks[i]);
      TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
      kernels::FusedLaunch<1> launch{};
      TPFUSE_RETURN_IF_ERROR((rank_grid<Config, 1>(config, &launch.ctas_per_rank)));
      TPFUSE_RETURN_IF_ERROR(make_rank_params<Config>(*comm, rank, problem, config, a[i], w[i], out[i], &launch.ranks[0]));
      TPFUSE_RETURN_IF_ERROR(launch_fused_kernel<Config>(launch, 1, /*cooperative=*/false, streams[i]));
    }
    return Status::Ok();
  });
}

Status preset_incoming_flags(Communicator* comm, int local_rank) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  const RankState& rank = comm->ranks.at(local_rank);
  TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
  // 0x7F7F7F7F is at or past every epoch this communicator will reach (modulo-2^32 comparison).
  TPFUSE_CUDA_TRY(cudaMemset(rank.flags, 0x7F, 2 * comm->flags_parity_words * sizeof(uint32_t)));
  return Status::Ok();
}

Status gemm_reduce_scatter(Communicator* comm, const Problem& problem, const void* a, const void* w, void* out,
                           cudaStream_t stream) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  if (comm->ranks.size() != 1) {
    return Status::InvalidArgument("this communicator runs " + std::to_string(comm->ranks.size()) +
                                   " local ranks: use gemm_reduce_scatter_local");
  }
  return launch_fused(comm, problem, {0}, &a, &w, &out, &stream);
}

Status gemm_reduce_scatter_local(Communicator* comm, const Problem& problem, const void* const* a,
                                 const void* const* w, void* const* out, const cudaStream_t* streams) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  std::vector<int> all(comm->ranks.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = int(i);
  return launch_fused(comm, problem, all, a, w, out, streams);
}

}  // namespace tpfuse
