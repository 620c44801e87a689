// The fused GEMM + reduce-scatter entry points: checks, config, parameters, launch.
#include <cstdio>

#include "core/env.h"
#include "gemm/launch.cuh"
#include "gemm/split_k.h"
#include "gemm/split_k_workspace.h"
#include "ops/gemm_rs/config.h"
#include "ops/gemm_rs/kernel.cuh"
#include "ops/gemm_rs/launch.h"
#include "tpfuse/reduce_scatter.h"

namespace tpfuse {
namespace {

// An epilogue class as a value, to pick the kernel's instantiation at run time.
template <class Epilogue>
struct EpilogueOf {
  using type = Epilogue;
};

Status check_call(const Communicator& comm, const Problem& problem, const std::vector<int>& local_ranks,
                  const void* const* a, const void* const* w, void* const* out, const cudaStream_t* streams) {
  TPFUSE_RETURN_IF_ERROR(check_call_ranks(comm, problem.world_size, local_ranks));
  TPFUSE_RETURN_IF_ERROR(validate(problem));
  if (problem.m > comm.options.max_m || problem.n > comm.options.max_n) {
    return Status::InvalidArgument("problem " + problem.to_string() + " exceeds the communicator's capacity (max_m " +
                                   std::to_string(comm.options.max_m) + ", max_n " +
                                   std::to_string(comm.options.max_n) + ")");
  }
  if (a == nullptr || w == nullptr || out == nullptr || streams == nullptr) {
    return Status::InvalidArgument("the operand arrays a, w, out and streams must not be null");
  }
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    TPFUSE_RETURN_IF_ERROR(validate_operand(a[i], "a"));
    TPFUSE_RETURN_IF_ERROR(validate_operand(w[i], "w"));
    TPFUSE_RETURN_IF_ERROR(validate_operand(out[i], "out"));
  }
  return Status::Ok();
}

template <class Config>
Status make_rank_params(const Communicator& comm, const RankState& rank, const Problem& problem,
                        const GemmRsConfig& config, const void* a, const void* w, void* out,
                        const SplitKWorkspace& split, float* presum_scratch, PushTimeline* timeline,
                        kernels::GemmRsRankParams* rp) {
  const TileSchedule schedule(schedule_shape(problem, config, rank.rank));
  TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, a, w, schedule, &rp->mainloop));
  kernels::PushReduceParams& e = rp->epilogue;
  e.rank = rank.rank;
  e.world_size = comm.world_size;
  e.rows_per_rank = int(problem.rows_per_rank());
  e.n = int(problem.n);
  e.col_tiles = schedule.col_tiles();
  e.tiles_per_band = schedule.tiles_per_band();
  // Shared tiles move a segment's rows as one box (ops/gemm_rs/epilogue.cuh), or from registers
  // without tensor maps (ops/gemm_rs/shared_tiles.cuh); the others a chunk.
  e.box_rows = config.shared_tiles ? int(problem.rows_per_rank()) : kChunkRows;
  const int64_t parity_elems = int64_t(comm.parity.data_bytes / 2);
  for (int owner = 0; owner < comm.world_size; ++owner) {
    if (!config.register_epilogue) {
      TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(rank.data_at[owner], comm.world_size, problem.rows_per_rank(),
                                                     problem.n, 2, parity_elems, e.box_rows, kChunkCols,
                                                     &e.recv_at[owner]));
    }
    e.recv[owner] = static_cast<uint16_t*>(rank.data_at[owner]);
    e.flags_at[owner] = rank.flags_at[owner];
  }
  e.recv_parity_elems = size_t(parity_elems);
  e.out_rows = static_cast<uint16_t*>(out);
  if (!config.register_epilogue) {
    TPFUSE_RETURN_IF_ERROR(
        make_tensor_map_bf16(out, problem.rows_per_rank(), problem.n, problem.n, e.box_rows, kChunkCols, &e.out));
  }
  e.flags_parity_words = comm.parity.flag_words;
  e.calls = rank.calls;
  e.failed = rank.failed;
  e.error = rank.error_device;
  e.timeout_ns = comm.timeout_ns;
  e.partial_rounds = config.partial_rounds;
  e.num_k_blocks = rp->mainloop.num_k_blocks;
  e.split_partials = split.partials;
  e.splits_done = split.splits_done;
  e.timeline = timeline;
  e.presum = config.presum ? 1 : 0;
  e.presum_scratch = presum_scratch;
  rp->calls = rank.calls;
  return Status::Ok();
}

template <class Config, int kLocalRanks, class Epilogue>
Status launch_kernel(const kernels::GemmRsLaunch<kLocalRanks>& launch, int num_ranks, size_t smem, bool cooperative,
                     bool debug, cudaStream_t stream) {
  const auto kernel = kernels::gemm_rs_kernel<Config, kLocalRanks, Epilogue>;
  if (debug) {
    std::fprintf(stderr, "tpfuse: gemm_reduce_scatter launch %d rank(s) x %d CTAs x %d threads, %zu B smem%s\n",
                 num_ranks, launch.ctas_per_rank, Config::kThreads, smem, cooperative ? ", cooperative" : "");
  }
  return launch_persistent<Config>(kernel, launch, launch.ctas_per_rank * num_ranks, smem, cooperative, stream);
}

}  // namespace

Status launch_gemm_rs(Communicator* comm, const Problem& problem, const std::vector<int>& local_ranks,
                      const void* const* a, const void* const* w, void* const* out, const cudaStream_t* streams,
                      const ConfigOverrides& overrides, PushTimeline* timeline) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  TPFUSE_RETURN_IF_ERROR(check_call(*comm, problem, local_ranks, a, w, out, streams));
  bool debug = false;
  TPFUSE_RETURN_IF_ERROR(debug_logging(&debug));
  const int num_ranks = int(local_ranks.size());
  const RankState& first = comm->ranks[local_ranks[0]];
  bool one_device = true;
  for (int i : local_ranks) one_device = one_device && comm->ranks[i].device == first.device;

  TPFUSE_CUDA_TRY(cudaSetDevice(first.device));
  DeviceInfo device;
  TPFUSE_RETURN_IF_ERROR(current_device_info(&device));
  GemmRsConfig config;
  TPFUSE_RETURN_IF_ERROR(select_gemm_rs_config(problem, device, overrides, &config));
  if (debug) {
    std::fprintf(stderr, "tpfuse: gemm_reduce_scatter %s, overrides %s -> %s\n", problem.to_string().c_str(),
                 overrides.to_string().c_str(), config.to_string().c_str());
  }

  // Split K holds a step per CTA of a rank (one wave: a tile's last split waits for the others):
  // fewer splits where the rank has fewer CTAs than the config planned (emulated ranks).
  const auto config_that_fits = [&](int ctas_per_rank) {
    GemmRsConfig c = config;
    if (config.gemm.split_k > 1) {
      const int tiles = TileSchedule(schedule_shape(problem, config, 0)).num_tiles() / config.gemm.split_k;
      c.gemm.split_k = splits_that_fit(tiles, config.gemm.split_k, ctas_per_rank);
    }
    return c;
  };
  const auto launch_variant = [&](auto mainloop_config, auto epilogue) -> Status {
    using Config = decltype(mainloop_config);
    using Epilogue = typename decltype(epilogue)::type;
    size_t smem = 0;
    TPFUSE_RETURN_IF_ERROR(kernel_smem_bytes<Config>(config.gemm, &smem));
    // Pre-summed partials: the presummer's staging past the storage (ops/gemm_rs/shared_storage.h).
    if (config.presum) smem += presum_staging_bytes(Config::kWgCols);
    if (num_ranks > 1 && one_device) {
      // Ranks emulated on one GPU: one cooperative launch, the SMs split evenly among them.
      kernels::GemmRsLaunch<kMaxWorldSize> launch{};
      int ctas = 0;
      TPFUSE_RETURN_IF_ERROR((resident_grid<Config>(kernels::gemm_rs_kernel<Config, kMaxWorldSize, Epilogue>, smem,
                                                    config.gemm.num_ctas, &ctas)));
      launch.ctas_per_rank = ctas / num_ranks;
      if (launch.ctas_per_rank == 0) {
        return Status::InvalidArgument(std::to_string(num_ranks) + " emulated ranks do not fit on one GPU's " +
                                       std::to_string(ctas) + " resident CTAs");
      }
      const GemmRsConfig rank_config = config_that_fits(launch.ctas_per_rank);
      SplitKWorkspace split;
      // Sized for the device's SMs, as the plain GEMM's on the same stream (the two share it). Presum
      // (never with split K) takes a slot of its partials per CTA of the launch.
      if (rank_config.gemm.split_k > 1 || rank_config.presum) {
        TPFUSE_RETURN_IF_ERROR(split_k_workspace(streams[0], device.num_sms, &split));
      }
      for (int i = 0; i < num_ranks; ++i) {
        TPFUSE_RETURN_IF_ERROR(make_rank_params<Config>(*comm, comm->ranks[local_ranks[i]], problem, rank_config,
                                                        a[i], w[i], out[i],
                                                        emulated_rank_part(split, i, launch.ctas_per_rank),
                                                        split.partials, timeline, &launch.ranks[i]));
      }
      return launch_kernel<Config, kMaxWorldSize, Epilogue>(launch, num_ranks, smem, /*cooperative=*/true, debug,
                                                                streams[0]);
    }
    // One rank per GPU: a persistent grid of its own on each.
    for (int i = 0; i < num_ranks; ++i) {
      const RankState& rank = comm->ranks[local_ranks[i]];
      TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
      kernels::GemmRsLaunch<1> launch{};
      TPFUSE_RETURN_IF_ERROR((resident_grid<Config>(kernels::gemm_rs_kernel<Config, 1, Epilogue>, smem,
                                                    config.gemm.num_ctas, &launch.ctas_per_rank)));
      const GemmRsConfig rank_config = config_that_fits(launch.ctas_per_rank);
      SplitKWorkspace split;
      if (rank_config.gemm.split_k > 1 || rank_config.presum) {
        TPFUSE_RETURN_IF_ERROR(split_k_workspace(streams[i], device.num_sms, &split));
      }
      TPFUSE_RETURN_IF_ERROR(make_rank_params<Config>(*comm, rank, problem, rank_config, a[i], w[i], out[i], split,
                                                      split.partials, timeline, &launch.ranks[0]));
      TPFUSE_RETURN_IF_ERROR(
          (launch_kernel<Config, 1, Epilogue>(launch, 1, smem, /*cooperative=*/false, debug, streams[i])));
    }
    return Status::Ok();
  };
  return with_variant<PushReduceSync>(config.gemm.variant, problem.weight_layout, [&](auto mainloop_config) -> Status {
    if (config.register_epilogue) return launch_variant(mainloop_config, EpilogueOf<kernels::SharedTileEpilogue>{});
    // The staged epilogues hand both slabs of a tile on: variants of two consumers only.
    if constexpr (decltype(mainloop_config)::kConsumers == kConsumers) {
      if (config.shared_tiles) return launch_variant(mainloop_config, EpilogueOf<kernels::PushReduceEpilogue<true>>{});
      return launch_variant(mainloop_config, EpilogueOf<kernels::PushReduceEpilogue<false>>{});
    } else {
      return Status::Internal("kernel variant " + std::to_string(config.gemm.variant) +
                              " (one consumer) takes the register epilogue only");
    }
  });
}

void* receive_buffer(const Communicator& comm, int local_rank, int parity) {
  return static_cast<uint8_t*>(comm.ranks[local_rank].data) + size_t(parity) * comm.parity.data_bytes;
}

Status gemm_reduce_scatter(Communicator* comm, const Problem& problem, const void* a, const void* w, void* out,
                           cudaStream_t stream, const ConfigOverrides& overrides) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  if (comm->ranks.size() != 1) {
    return Status::InvalidArgument("this communicator runs " + std::to_string(comm->ranks.size()) +
                                   " local ranks: use gemm_reduce_scatter_local");
  }
  return launch_gemm_rs(comm, problem, {0}, &a, &w, &out, &stream, overrides);
}

Status gemm_reduce_scatter_local(Communicator* comm, const Problem& problem, const void* const* a,
                                 const void* const* w, void* const* out, const cudaStream_t* streams,
                                 const ConfigOverrides& overrides) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  std::vector<int> all(comm->ranks.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = int(i);
  return launch_gemm_rs(comm, problem, all, a, w, out, streams, overrides);
}

}  // namespace tpfuse
