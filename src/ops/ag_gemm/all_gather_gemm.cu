// The fused all-gather + GEMM entry points: checks, config, parameters, launch.
#include <cstdio>

#include "core/env.h"
#include "gemm/launch.cuh"
#include "gemm/split_k_workspace.h"
#include "ops/ag_gemm/config.h"
#include "ops/ag_gemm/kernel.cuh"
#include "ops/ag_gemm/launch.h"
#include "ops/ag_gemm/workspace.h"
#include "tpfuse/all_gather.h"

namespace tpfuse {
namespace {

Status check_call(const Communicator& comm, const AllGatherProblem& problem, const std::vector<int>& local_ranks,
                  const void* const* x, const void* const* w, void* const* y, void* const* gathered_x,
                  const cudaStream_t* streams) {
  TPFUSE_RETURN_IF_ERROR(check_call_ranks(comm, problem.world_size, local_ranks));
  TPFUSE_RETURN_IF_ERROR(validate(problem));
  if (problem.m > comm.options.max_m || problem.n_per_rank > comm.options.max_n || problem.k > comm.options.max_k) {
    return Status::InvalidArgument("problem " + problem.to_string() + " exceeds the communicator's capacity (max_m " +
                                   std::to_string(comm.options.max_m) + ", max_n " +
                                   std::to_string(comm.options.max_n) + ", max_k " +
                                   std::to_string(comm.options.max_k) + ")");
  }
  if (x == nullptr || w == nullptr || y == nullptr || streams == nullptr) {
    return Status::InvalidArgument("the operand arrays x, w, y and streams must not be null");
  }
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    TPFUSE_RETURN_IF_ERROR(validate_operand(x[i], "x"));
    TPFUSE_RETURN_IF_ERROR(validate_operand(w[i], "w"));
    TPFUSE_RETURN_IF_ERROR(validate_operand(y[i], "y"));
    if (gathered_x != nullptr && gathered_x[i] != nullptr) {
      TPFUSE_RETURN_IF_ERROR(validate_operand(gathered_x[i], "gathered_x"));
    }
  }
  return Status::Ok();
}

template <class Config>
Status make_rank_params(const Communicator& comm, const RankState& rank, const AllGatherProblem& problem,
                        const AllGatherConfig& config, const void* x, const void* w, void* y, bool copy_own,
                        const SplitKWorkspace& split, kernels::AllGatherRankParams* rp) {
  const int64_t rows = problem.rows_per_rank(), k = problem.k;
  const AllGatherSchedule schedule(all_gather_shape(problem, config, rank.rank));
  // The mainloop's own operands are this rank's: X_r (rows_per_rank x k) and W_r.
  Problem gemm;
  gemm.m = rows;
  gemm.n = problem.n_per_rank;
  gemm.k_per_rank = k;
  gemm.weight_layout = problem.weight_layout;
  TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(gemm, x, w, schedule, &rp->mainloop));
  kernels::AllGatherEpilogue::Params& e = rp->epilogue;
  e.rank = rank.rank;
  e.world_size = comm.world_size;
  e.rows_per_rank = int(rows);
  e.k = int(k);
  e.sources_per_band = config.sources_per_band;
  // Bands of two 64-row blocks load a tile's halves from their blocks; a band of more blocks (of
  // fewer rows each) reads this rank's block from its gathered buffer too.
  e.halves_by_block = config.sources_per_band == 2 && rows == kSlabRows && Config::kBlockM == 2 * kSlabRows;
  e.copy_own = copy_own || (config.sources_per_band > 1 && !e.halves_by_block);
  // A step's K blocks: a split's where every tile is split (a split tail is past the first wave).
  const int step_splits = schedule.whole_tiles() > 0 ? 1 : schedule.num_splits();
  const double step_k_blocks = double(rp->mainloop.num_k_blocks) / step_splits * Config::kBlockN / 256.0;
  e.copy = copy_plan(rows, k, config.gemm.num_ctas, schedule.num_tiles(), step_k_blocks,
                     e.copy_own ? comm.world_size : comm.world_size - 1, config.idle_copiers);
  // Y and the gathered buffers as bands (layers) of G blocks: a box is clipped at its band's end.
  const int64_t bands = comm.world_size / config.sources_per_band, band_rows = rows * config.sources_per_band;
  const int64_t parity_elems = int64_t(comm.parity.data_bytes / 2);
  TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(y, bands, band_rows, problem.n_per_rank, 1,
                                                 band_rows * problem.n_per_rank, kChunkRows, kChunkCols, &e.y));
  TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(x, 1, rows, k, 1, rows * k, Config::kBlockM, Config::kBlockK, &e.own_x));
  TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(rank.data, bands, band_rows, k, 2, parity_elems, Config::kBlockM,
                                                 Config::kBlockK, &e.gathered));
  if (e.halves_by_block) {
    TPFUSE_RETURN_IF_ERROR(
        make_layered_tensor_map(x, 1, rows, k, 1, rows * k, kSlabRows, Config::kBlockK, &e.own_x_half));
    TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(rank.data, comm.world_size, rows, k, 2, parity_elems, kSlabRows,
                                                   Config::kBlockK, &e.gathered_half));
  }
  e.x = static_cast<const uint16_t*>(x);
  for (int r = 0; r < comm.world_size; ++r) {
    e.gathered_at[r] = static_cast<uint16_t*>(rank.data_at[r]);
    e.flags_at[r] = rank.flags_at[r];
    e.counts_at[r] = rank.counts_at[r];
  }
  e.parity_elems = size_t(parity_elems);
  e.flags_parity_words = comm.parity.flag_words;
  e.counts_parity_words = comm.parity.count_words;
  e.calls = rank.calls;
  e.failed = rank.failed;
  e.error = rank.error_device;
  e.timeout_ns = comm.timeout_ns;
  e.split_partials = split.partials;
  e.splits_done = split.splits_done;
  rp->mainloop.a = e.gathered;  // prefetched by the kernel; every load goes through a_load's maps
  rp->calls = rank.calls;
  return Status::Ok();
}

template <class Config, int kLocalRanks>
Status launch_kernel(const kernels::AllGatherLaunch<kLocalRanks>& launch, int num_ranks, size_t smem, bool cooperative,
                     bool debug, cudaStream_t stream) {
  const auto kernel = kernels::all_gather_kernel<Config, kLocalRanks>;
  if (debug) {
    std::fprintf(stderr, "tpfuse: all_gather_gemm launch %d rank(s) x %d CTAs x %d threads, %zu B smem%s\n",
                 num_ranks, launch.ctas_per_rank, Config::kThreads, smem, cooperative ? ", cooperative" : "");
  }
  return launch_persistent<Config>(kernel, launch, launch.ctas_per_rank * num_ranks, smem, cooperative, stream);
}

// The gathered X of the call just queued on `stream`, into `out` (m x k).
Status copy_gathered(const Communicator& comm, const RankState& rank, const AllGatherProblem& problem, void* out,
                     cudaStream_t stream) {
  TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
  const size_t elems = size_t(problem.m) * size_t(problem.k);
  const int blocks = int(std::min<size_t>((elems / 8 + 255) / 256, 2048));
  kernels::copy_gathered_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint16_t*>(rank.data),
                                                            comm.parity.data_bytes / 2, rank.calls,
                                                            static_cast<uint16_t*>(out), elems);
  TPFUSE_CUDA_TRY(cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status launch_all_gather(Communicator* comm, const AllGatherProblem& problem, const std::vector<int>& local_ranks,
                         const void* const* x, const void* const* w, void* const* y, void* const* gathered_x,
                         const cudaStream_t* streams, const ConfigOverrides& overrides) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  TPFUSE_RETURN_IF_ERROR(check_call(*comm, problem, local_ranks, x, w, y, gathered_x, streams));
  bool debug = false;
  TPFUSE_RETURN_IF_ERROR(debug_logging(&debug));
  const int num_ranks = int(local_ranks.size());
  const RankState& first = comm->ranks[local_ranks[0]];
  bool one_device = true;
  for (int i : local_ranks) one_device = one_device && comm->ranks[i].device == first.device;
  auto wants_gathered = [&](int i) { return gathered_x != nullptr && gathered_x[i] != nullptr; };

  TPFUSE_CUDA_TRY(cudaSetDevice(first.device));
  DeviceInfo device;
  TPFUSE_RETURN_IF_ERROR(current_device_info(&device));
  AllGatherConfig config;
  TPFUSE_RETURN_IF_ERROR(select_all_gather_config(problem, device, overrides, &config));
  if (debug) {
    std::fprintf(stderr, "tpfuse: all_gather_gemm %s, overrides %s -> %s\n", problem.to_string().c_str(),
                 overrides.to_string().c_str(), config.to_string().c_str());
  }

  // A rank's CTAs as launched (emulated ranks share the grid). Split K holds a step per CTA of a rank
  // (one wave, a workspace slot each): fewer splits where the rank has fewer CTAs than the config
  // planned, and a split tail is the tail past the last full wave of those CTAs.
  AllGatherShape unsplit = all_gather_shape(problem, config, 0);
  unsplit.num_splits = 1;
  const int64_t tiles = AllGatherSchedule(unsplit).num_tiles();
  const auto config_that_fits = [&](int ctas_per_rank) {
    AllGatherConfig c = config;
    c.gemm.num_ctas = ctas_per_rank;
    const SplitPlan plan = split_plan(tiles, config.gemm.split_k, config.gemm.whole_tiles > 0, ctas_per_rank);
    c.gemm.split_k = plan.splits;
    c.gemm.whole_tiles = plan.whole_tiles;
    return c;
  };
  const Status launched =
      with_variant<CopyStages>(config.gemm.variant, problem.weight_layout, [&](auto mainloop_config) -> Status {
        using Config = decltype(mainloop_config);
        size_t smem = 0;
        TPFUSE_RETURN_IF_ERROR(kernel_smem_bytes<Config>(config.gemm, &smem));
        if (num_ranks > 1 && one_device) {
          // Ranks emulated on one GPU: one cooperative launch, the SMs split evenly among them.
          kernels::AllGatherLaunch<kMaxWorldSize> launch{};
          int ctas = 0;
          TPFUSE_RETURN_IF_ERROR((resident_grid<Config>(kernels::all_gather_kernel<Config, kMaxWorldSize>, smem,
                                                        config.gemm.num_ctas, &ctas)));
          launch.ctas_per_rank = ctas / num_ranks;
          if (launch.ctas_per_rank == 0) {
            return Status::InvalidArgument(std::to_string(num_ranks) + " emulated ranks do not fit on one GPU's " +
                                           std::to_string(ctas) + " resident CTAs");
          }
          const AllGatherConfig rank_config = config_that_fits(launch.ctas_per_rank);
          SplitKWorkspace split;
          // Sized for the device's SMs, as the plain GEMM's on the same stream (the two share it).
          if (rank_config.gemm.split_k > 1) {
            TPFUSE_RETURN_IF_ERROR(split_k_workspace(streams[0], device.num_sms, &split));
          }
          for (int i = 0; i < num_ranks; ++i) {
            TPFUSE_RETURN_IF_ERROR(make_rank_params<Config>(*comm, comm->ranks[local_ranks[i]], problem, rank_config,
                                                            x[i], w[i], y[i], wants_gathered(i),
                                                            emulated_rank_part(split, i, launch.ctas_per_rank),
                                                            &launch.ranks[i]));
          }
          return launch_kernel<Config>(launch, num_ranks, smem, /*cooperative=*/true, debug, streams[0]);
        }
        // One rank per GPU: a persistent grid of its own on each.
        for (int i = 0; i < num_ranks; ++i) {
          const RankState& rank = comm->ranks[local_ranks[i]];
          TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
          kernels::AllGatherLaunch<1> launch{};
          TPFUSE_RETURN_IF_ERROR((resident_grid<Config>(kernels::all_gather_kernel<Config, 1>, smem,
                                                        config.gemm.num_ctas, &launch.ctas_per_rank)));
          const AllGatherConfig rank_config = config_that_fits(launch.ctas_per_rank);
          SplitKWorkspace split;
          if (rank_config.gemm.split_k > 1) {
            TPFUSE_RETURN_IF_ERROR(split_k_workspace(streams[i], device.num_sms, &split));
          }
          TPFUSE_RETURN_IF_ERROR(make_rank_params<Config>(*comm, rank, problem, rank_config, x[i], w[i], y[i],
                                                          wants_gathered(i), split, &launch.ranks[0]));
          TPFUSE_RETURN_IF_ERROR(launch_kernel<Config>(launch, 1, smem, /*cooperative=*/false, debug, streams[i]));
        }
        return Status::Ok();
      });
  TPFUSE_RETURN_IF_ERROR(launched);
  // Emulated ranks share the first stream; each rank's copy follows its launch on its stream.
  for (int i = 0; i < num_ranks; ++i) {
    if (!wants_gathered(i)) continue;
    const cudaStream_t stream = num_ranks > 1 && one_device ? streams[0] : streams[i];
    TPFUSE_RETURN_IF_ERROR(copy_gathered(*comm, comm->ranks[local_ranks[i]], problem, gathered_x[i], stream));
  }
  return Status::Ok();
}

void* gathered_buffer(const Communicator& comm, int local_rank, int parity) {
  return static_cast<uint8_t*>(comm.ranks[local_rank].data) + size_t(parity) * comm.parity.data_bytes;
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

Status all_gather_gemm(Communicator* comm, const AllGatherProblem& problem, const void* x, const void* w, void* y,
                       void* gathered_x, cudaStream_t stream, const ConfigOverrides& overrides) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  if (comm->ranks.size() != 1) {
    return Status::InvalidArgument("this communicator runs " + std::to_string(comm->ranks.size()) +
                                   " local ranks: use all_gather_gemm_local");
  }
  return launch_all_gather(comm, problem, {0}, &x, &w, &y, &gathered_x, &stream, overrides);
}

Status all_gather_gemm_local(Communicator* comm, const AllGatherProblem& problem, const void* const* x,
                             const void* const* w, void* const* y, void* const* gathered_x,
                             const cudaStream_t* streams, const ConfigOverrides& overrides) {
  if (comm == nullptr) return Status::InvalidArgument("comm must not be null");
  std::vector<int> all(comm->ranks.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = int(i);
  return launch_all_gather(comm, problem, all, x, w, y, gathered_x, streams, overrides);
}

}  // namespace tpfuse
