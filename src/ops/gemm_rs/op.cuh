// The fused GEMM + reduce-scatter's traits for the shared launch path (ops/launch.cuh): checks,
// config, kernel, parameters. The library launches them one rank per device
// (gemm_reduce_scatter.cu); the testing library also emulates ranks that share a device.
#pragma once

#include "gemm/split_k.h"
#include "ops/gemm_rs/config.h"
#include "ops/gemm_rs/kernel.cuh"
#include "ops/gemm_rs/push_timeline.h"
#include "ops/launch.cuh"

namespace tpfuse {

// The staged epilogue's two instantiations, each by whether it records its pushes.
template <bool kRecordsPushes>
using PushReduceOfSharedTiles = kernels::PushReduceEpilogue<true, kRecordsPushes>;
template <bool kRecordsPushes>
using PushReduceOfOwnerTiles = kernels::PushReduceEpilogue<false, kRecordsPushes>;

// The kernel of a mainloop config and an epilogue class (by whether it records its pushes: only the
// testing library's kernels do, into the operands' timeline).
template <class MainloopConfig, template <bool> class EpilogueOf>
struct GemmRsKernel : OpKernel<MainloopConfig, kernels::GemmRsLaunch> {
  template <int kLocalRanks, bool kRecordsPushes = false>
  static auto kernel() { return kernels::gemm_rs_kernel<MainloopConfig, kLocalRanks, EpilogueOf<kRecordsPushes>>; }
};

struct GemmRsOp {
  using Problem = tpfuse::Problem;
  using Config = GemmRsConfig;
  struct Operands {
    const void* const* a;
    const void* const* w;
    const void* const* bias;  // may be null, or any of its entries: no bias
    void* const* out;
    const InputScales* scales = nullptr;  // E4M3 inputs' (tpfuse/problem.h), a rank's each; null for BF16
    // The benchmark's record of the pushes (push_timeline.h): read only by the testing library's
    // recording kernels (testing/recorded_gemm_rs.cu), which need it; null otherwise.
    PushTimeline* timeline = nullptr;
  };
  static constexpr const char* kName = "gemm_reduce_scatter";

  static Status check(const Communicator& comm, const Problem& problem, size_t num_ranks, const Operands& operands,
                      const cudaStream_t* streams) {
    if (problem.m > comm.options.max_m || problem.n > comm.options.max_n) {
      return Status::InvalidArgument("problem " + problem.to_string() + " exceeds the communicator's capacity (max_m " +
                                     std::to_string(comm.options.max_m) + ", max_n " +
                                     std::to_string(comm.options.max_n) + ")");
    }
    return check_operands(
        {{operands.a, "a"}, {operands.w, "w"}, {operands.bias, "bias", /*optional=*/true}, {operands.out, "out"}},
        streams, num_ranks);
  }

  static Status select_config(const Problem& problem, const DeviceInfo& device, const ConfigOverrides& overrides,
                              Config* config) {
    return select_gemm_rs_config(problem, device, overrides, config);
  }

  // Split K holds a step per CTA of a rank (one wave: a tile's last split waits for the others):
  // fewer splits where the rank has fewer CTAs than the config planned (emulated ranks).
  static Config config_that_fits(const Problem& problem, const Config& config, int ctas_per_rank) {
    Config c = config;
    if (config.gemm.split_k > 1) {
      const int tiles = TileSchedule(schedule_shape(problem, config, 0)).num_tiles() / config.gemm.split_k;
      c.gemm.split_k = splits_that_fit(tiles, config.gemm.split_k, ctas_per_rank);
    }
    return c;
  }

  template <class Fn>
  static Status with_kernel(const Problem& problem, const Config& config, Fn&& fn) {
    return with_variant<PushReduceSync>(config.gemm.variant, problem.weight_layout, [&](auto mainloop_config) -> Status {
      using Mainloop = decltype(mainloop_config);
      if (config.register_epilogue) return fn(GemmRsKernel<Mainloop, kernels::SharedTileEpilogue>{});
      // The staged epilogues hand both slabs of a tile on: variants of two consumers only.
      if constexpr (Mainloop::kConsumers == kConsumers) {
        if (config.shared_tiles) return fn(GemmRsKernel<Mainloop, PushReduceOfSharedTiles>{});
        return fn(GemmRsKernel<Mainloop, PushReduceOfOwnerTiles>{});
      } else {
        return Status::Internal("kernel variant " + std::to_string(config.gemm.variant) +
                                " (one consumer) takes the register epilogue only");
      }
    });
  }

  template <class Config>
  static Status make_rank_params(const Communicator& comm, const RankState& rank, const Problem& problem,
                                 const GemmRsConfig& config, const Operands& operands, int i,
                                 const SplitKWorkspace& split, kernels::GemmRsRankParams* rp) {
    const TileSchedule schedule(schedule_shape(problem, config, rank.rank));
    TPFUSE_RETURN_IF_ERROR(make_mainloop_params<Config>(problem, operands.a[i], operands.w[i],
                                                       operands.scales != nullptr ? operands.scales[i] : InputScales{},
                                                       schedule, &rp->mainloop));
    kernels::PushReduceParams& e = rp->epilogue;
    set_call_params(comm, rank, &e);
    e.rows_per_rank = int(problem.rows_per_rank());
    e.n = int(problem.n);
    e.col_tiles = schedule.col_tiles();
    e.tiles_per_band = schedule.tiles_per_band();
    // Shared tiles move a segment's rows as one box (ops/gemm_rs/epilogue.cuh), or from registers
    // without tensor maps (ops/gemm_rs/shared_tiles.cuh); the others a chunk.
    e.box_rows = config.shared_tiles ? int(problem.rows_per_rank()) : kChunkRows;
    const int64_t parity_elems = int64_t(comm.parity.data_bytes / element_bytes(kOutputDType));
    for (int owner = 0; owner < comm.world_size; ++owner) {
      if (!config.register_epilogue) {
        TPFUSE_RETURN_IF_ERROR(make_layered_tensor_map(kOutputDType, rank.data_at[owner], comm.world_size,
                                                       problem.rows_per_rank(), problem.n, 2, parity_elems,
                                                       e.box_rows, kChunkCols, &e.recv_at[owner]));
      }
      e.recv[owner] = static_cast<uint16_t*>(rank.data_at[owner]);
      e.flags_at[owner] = rank.flags_at[owner];
    }
    e.recv_parity_elems = size_t(parity_elems);
    e.out_rows = static_cast<uint16_t*>(operands.out[i]);
    e.bias = operands.bias != nullptr ? static_cast<const uint16_t*>(operands.bias[i]) : nullptr;
    e.sequences = SequenceRows(problem.batch, problem.rows_per_rank(), comm.world_size);
    if (!config.register_epilogue) {
      TPFUSE_RETURN_IF_ERROR(make_tensor_map(kOutputDType, operands.out[i], problem.rows_per_rank(), problem.n,
                                             problem.n, e.box_rows, kChunkCols, &e.out));
    }
    e.flags_parity_words = comm.parity.flag_words;
    e.partial_rounds = config.partial_rounds;
    e.num_k_blocks = rp->mainloop.num_k_blocks;
    e.split_partials = split.partials;
    e.splits_done = split.splits_done;
    e.timeline = operands.timeline;
    rp->calls = rank.calls;
    return Status::Ok();
  }

  static Status after_launch(const Communicator&, const Problem&, const std::vector<int>&, const Operands&,
                             const cudaStream_t*, bool) {
    return Status::Ok();
  }
};

}  // namespace tpfuse
