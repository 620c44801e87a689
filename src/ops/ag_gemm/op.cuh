// The fused all-gather + GEMM's traits for the shared launch path (ops/launch.cuh): checks, config,
// kernel, parameters, and the copy of the gathered X. The library launches them one rank per device
// (all_gather_gemm.cu); the testing library also emulates ranks that share a device.
#pragma once

#include <algorithm>

#include "ops/ag_gemm/config.h"
#include "ops/ag_gemm/kernel.cuh"
#include "ops/ag_gemm/workspace.h"
#include "ops/launch.cuh"

namespace tpfuse {

// The kernel of a mainloop config.
template <class MainloopConfig>
struct AllGatherKernel : OpKernel<MainloopConfig, kernels::AllGatherLaunch> {
  template <int kLocalRanks, bool kRecordsPushes = false>
  static auto kernel() {
    static_assert(!kRecordsPushes, "the all-gather records no push timeline");
    return kernels::all_gather_kernel<MainloopConfig, kLocalRanks>;
  }
};

struct AllGatherOp {
  using Problem = AllGatherProblem;
  using Config = AllGatherConfig;
  struct Operands {
    const void* const* x;
    const void* const* w;
    const void* const* bias;  // may be null, or any of its entries: no bias
    void* const* y;
    void* const* gathered_x;  // may be null, or any of its entries
    const InputScales* scales = nullptr;  // E4M3 inputs' (tpfuse/problem.h), a rank's each; null for BF16

    bool wants_gathered(int i) const { return gathered_x != nullptr && gathered_x[i] != nullptr; }
  };
  static constexpr const char* kName = "all_gather_gemm";

  static Status check(const Communicator& comm, const Problem& problem, size_t num_ranks, const Operands& operands,
                      const cudaStream_t* streams) {
    if (problem.m > comm.options.max_m || problem.n_per_rank > comm.options.max_n || problem.k > comm.options.max_k) {
      return Status::InvalidArgument("problem " + problem.to_string() + " exceeds the communicator's capacity (max_m " +
                                     std::to_string(comm.options.max_m) + ", max_n " +
                                     std::to_string(comm.options.max_n) + ", max_k " +
                                     std::to_string(comm.options.max_k) + ")");
    }
    return check_operands({{operands.x, "x"}, {operands.w, "w"}, {operands.bias, "bias", /*optional=*/true},
                           {operands.y, "y"}, {operands.gathered_x, "gathered_x", /*optional=*/true}},
                          streams, num_ranks);
  }

  static Status select_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                              Config* config) {
    return select_all_gather_config(problem, device, overrides, config);
  }

  // A rank's CTAs as launched (emulated ranks share the grid). Split K holds a step per CTA of a rank
  // (one wave, a workspace slot each): fewer splits where the rank has fewer CTAs than the config
  // planned, and a split tail is the tail past the last full wave of those CTAs.
  static Config config_that_fits(const Problem& problem, const Config& config, int ctas_per_rank) {
    AllGatherShape unsplit = all_gather_shape(problem, config, 0);
    unsplit.num_splits = 1;
    const int64_t tiles = AllGatherSchedule(unsplit).num_tiles();
    Config c = config;
    c.gemm.num_ctas = ctas_per_rank;
    const SplitPlan plan = split_plan(tiles, config.gemm.split_k, config.gemm.whole_tiles > 0, ctas_per_rank);
    c.gemm.split_k = plan.splits;
    c.gemm.whole_tiles = plan.whole_tiles;
    return c;
  }

  template <class Fn>
  static Status with_kernel(const Problem& problem, const Config& config, Fn&& fn) {
    return with_variant<CopyStages>(config.gemm.variant, problem.weight_layout, [&](auto mainloop_config) -> Status {
      return fn(AllGatherKernel<decltype(mainloop_config)>{});
    });
  }

  template <class Config>
  static Status make_rank_params(const Communicator& comm, const RankState& rank, const Problem& problem,
                                 const AllGatherConfig& config, const Operands& operands, int i,
                                 const SplitKWorkspace& split, kernels::AllGatherRankParams* rp) {
    const void* x = operands.x[i];
    void* y = operands.y[i];
    const int64_t rows = problem.rows_per_rank(), k = problem.k;
    const AllGatherSchedule schedule(all_gather_shape(problem, config, rank.rank));
    // The mainloop's own operands are this rank's: X_r (rows_per_rank x k) and W_r.
    tpfuse::Problem gemm;
    gemm.m = rows;
    gemm.n = problem.n_per_rank;
    gemm.k_per_rank = k;
    gemm.weight_layout = problem.weight_layout;
    gemm.dtype = problem.dtype;
    gemm.scaling = problem.scaling;
    gemm.accumulation = problem.accumulation;
    const InputScales scales = operands.scales != nullptr ? operands.scales[i] : InputScales{};
    TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(gemm, x, operands.w[i], scales, schedule, &rp->mainloop));
    kernels::AllGatherEpilogue::Params& e = rp->epilogue;
    set_call_params(comm, rank, &e);
    e.rows_per_rank = int(rows);
    e.k = int(k);
    e.sources_per_band = config.sources_per_band;
    // Bands of two 64-row blocks load a tile's halves from their blocks; a band of more blocks (of
    // fewer rows each) reads this rank's block from its gathered buffer too.
    e.halves_by_block = config.sources_per_band == 2 && rows == kSlabRows && Config::kBlockM == 2 * kSlabRows;
    e.copy_own = operands.wants_gathered(i) || (config.sources_per_band > 1 && !e.halves_by_block);
    // A step's K blocks: a split's where every tile is split (a split tail is past the first wave).
    const int step_splits = schedule.whole_tiles() > 0 ? 1 : schedule.num_splits();
    const double step_k_blocks = double(rp->mainloop.num_k_blocks) / step_splits * Config::kBlockN / 256.0;
    e.copy = copy_plan(rows, k, problem.dtype, config.gemm.num_ctas, schedule.num_tiles(), step_k_blocks,
                       e.copy_own ? comm.world_size : comm.world_size - 1, config.idle_copiers);
    // Y and the gathered buffers as bands (layers) of G blocks: a box is clipped at its band's end.
    // With several sequences (G = 1) a band's rows in Y are its shards of the sequences
    // (ops/sequence_rows.h): Y's map has a layer per band and shard, a sequence's P shards apart.
    const int64_t bands = comm.world_size / config.sources_per_band, band_rows = rows * config.sources_per_band;
    const DType dtype = problem.dtype;  // of X, gathered
    const int64_t parity_elems = int64_t(comm.parity.data_bytes / element_bytes(dtype));
    e.sequences = SequenceRows(problem.batch, band_rows, int(bands));
    const int64_t shard_rows = e.sequences.shard_rows();
    TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(kOutputDType, y, bands, shard_rows, problem.n_per_rank,
                                                   problem.batch, bands * shard_rows * problem.n_per_rank, kChunkRows,
                                                   kChunkCols, &e.y));
    e.bias = operands.bias != nullptr ? static_cast<const uint16_t*>(operands.bias[i]) : nullptr;
    TPFUSE_RETURN_IF_ERROR(
        make_layered_tensor_map(dtype, x, 1, rows, k, 1, rows * k, Config::kBlockM, Config::kBlockK, &e.own_x));
    TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(dtype, rank.data, bands, band_rows, k, 2, parity_elems,
                                                   Config::kBlockM, Config::kBlockK, &e.gathered));
    if (e.halves_by_block) {
      TPFUSE_RETURN_IF_ERROR(
          make_layered_tensor_map(dtype, x, 1, rows, k, 1, rows * k, kSlabRows, Config::kBlockK, &e.own_x_half));
      TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(dtype, rank.data, comm.world_size, rows, k, 2, parity_elems,
                                                     kSlabRows, Config::kBlockK, &e.gathered_half));
    }
    e.x = static_cast<const uint8_t*>(x);
    // Rowwise and blockwise scales are gathered behind the gathered X (E4M3 takes half of the bytes
    // sized for BF16; a row's blockwise scales are 1/32 of its bytes).
    const bool row_scales = problem.scaling == Scaling::kRowwise || problem.scaling == Scaling::kBlockwise;
    e.x_scales = row_scales ? scales.a : nullptr;
    e.scales_per_row = problem.scaling == Scaling::kBlockwise ? int(k / kScaleBlock) : 1;
    e.scales_offset = size_t(problem.m) * size_t(k) * element_bytes(dtype);
    const size_t scales_bytes = size_t(problem.m) * size_t(e.scales_per_row) * sizeof(float);
    if (e.x_scales != nullptr && e.scales_offset + scales_bytes > comm.parity.data_bytes) {
      return Status::Internal("the gathered rows' scales do not fit the workspace");
    }
    // A row block's scales start at a multiple of kCopyRows rows; the last one ends at rows_per_rank.
    const size_t rank_scales_bytes = size_t(rows) * size_t(e.scales_per_row) * sizeof(float);
    e.scales_by_bulk = e.x_scales != nullptr && reinterpret_cast<uintptr_t>(e.x_scales) % 16 == 0 &&
                       rank_scales_bytes % 16 == 0 && e.scales_offset % 16 == 0 &&
                       (size_t(parity_elems) * element_bytes(dtype)) % 16 == 0;
    for (int r = 0; r < comm.world_size; ++r) {
      e.gathered_at[r] = static_cast<uint8_t*>(rank.data_at[r]);
      e.flags_at[r] = rank.flags_at[r];
      e.counts_at[r] = rank.counts_at[r];
    }
    e.parity_elems = size_t(parity_elems);
    e.flags_parity_words = comm.parity.flag_words;
    e.counts_parity_words = comm.parity.count_words;
    e.split_partials = split.partials;
    e.splits_done = split.splits_done;
    rp->mainloop.a = e.gathered;  // prefetched by the kernel; every load goes through a_load's maps
    rp->calls = rank.calls;
    return Status::Ok();
  }

  // The gathered X of the call just queued on `stream`, into `out` (m x k, the rows in sequence order).
  static Status copy_gathered(const Communicator& comm, const RankState& rank, const Problem& problem, void* out,
                              cudaStream_t stream) {
    TPFUSE_CUDA_TRY(cudaSetDevice(rank.device));
    // A block a row at a time, a thread per 16 bytes of it (up to 256).
    const int vectors = int(problem.k * element_bytes(problem.dtype) / 16);
    const int blocks = int(std::min<int64_t>(problem.m, 2048));
    const int threads = std::min(256, (vectors + 31) / 32 * 32);
    const SequenceRows sequences(problem.batch, problem.rows_per_rank(), comm.world_size);
    kernels::copy_gathered_kernel<<<blocks, threads, 0, stream>>>(
        static_cast<const uint8_t*>(rank.data), comm.parity.data_bytes, rank.calls, static_cast<uint8_t*>(out),
        int(problem.m), vectors, FastDivision(int(problem.rows_per_rank())), sequences);
    TPFUSE_CUDA_TRY(cudaGetLastError());
    return Status::Ok();
  }

  // Emulated ranks share the first stream; each rank's copy follows its launch on its stream.
  static Status after_launch(const Communicator& comm, const Problem& problem, const std::vector<int>& local_ranks,
                             const Operands& operands, const cudaStream_t* streams, bool emulated) {
    for (size_t i = 0; i < local_ranks.size(); ++i) {
      if (!operands.wants_gathered(int(i))) continue;
      const cudaStream_t stream = emulated ? streams[0] : streams[i];
      TPFUSE_RETURN_IF_ERROR(copy_gathered(comm, comm.ranks[local_ranks[i]], problem, operands.gathered_x[i], stream));
    }
    return Status::Ok();
  }
};

}  // namespace tpfuse
