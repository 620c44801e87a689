// Mode baseline: the unfused path on every GPU. T_gemm = cuBLAS alone, T_comm = NCCL reduce-scatter
// of the m x n BF16 partial alone, T_seq = both on one stream; with --check, the errors of the GEMM
// and of the reduce-scatter against FP32 references.
#include <cmath>
#include <string>

#include "baselines.h"
#include "check.h"
#include "modes.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kA, kW, kPartial };

// One GPU's buffers, one of each per input set.
struct RankBuffers {
  std::vector<DeviceBuffer> a;        // m x k_per_rank
  std::vector<DeviceBuffer> w;        // k_per_rank x n or n x k_per_rank
  std::vector<DeviceBuffer> partial;  // m x n: the GEMM's output, the reduce-scatter's input
  std::vector<DeviceBuffer> out;      // m/G x n: the reduce-scatter's output (empty without it)
};

struct ShapeErrors {
  ErrorSums gemm;
  ErrorSums reduce_scatter;
};

std::vector<Column> baseline_columns(bool check) {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"t_gemm_ms", "T_gemm(ms)", 10, Format::kFixed, 4},
      {"tflops_gemm", "TFLOP/s", 8, Format::kFixed, 1},
      {"t_comm_ms", "T_comm(ms)", 10, Format::kFixed, 4},
      {"algbw_gbps", "algbw(GB/s)", 11, Format::kFixed, 1, false},
      {"busbw_gbps", "busbw(GB/s)", 11, Format::kFixed, 1},
      {"t_seq_ms", "T_seq(ms)", 10, Format::kFixed, 4},
  });
  if (check) {
    columns.insert(columns.end(), {
        {"gemm_max_rel", "gemm_maxrel", 11, Format::kScientific, 2},
        {"gemm_norm_rel", "gemm_l2rel", 10, Format::kScientific, 2},
        {"rs_max_rel", "rs_maxrel", 10, Format::kScientific, 2},
        {"rs_norm_rel", "rs_l2rel", 10, Format::kScientific, 2},
        {"wrong", "#wrong", 7, Format::kInteger},
    });
  }
  columns.insert(columns.end(), {
      {"comm_gpus", "P_comm", 6, Format::kInteger, 0, false},
      {"input_sets", "sets", 4, Format::kInteger, 0, false},
      {"note", "note", 0, Format::kText},
  });
  return columns;
}

void gemm_all(GpuSet& gpus, std::vector<RankBuffers>& ranks, const Problem& problem, int set) {
  for (int g = 0; g < gpus.size(); ++g) {
    BENCH_CHECK(cudaSetDevice(gpus[g].device));
    cublas_gemm(gpus[g].cublas, problem, ranks[g].a[set].get(), ranks[g].w[set].get(), ranks[g].partial[set].get());
  }
}

void reduce_scatter_all(GpuSet& gpus, std::vector<RankBuffers>& ranks, size_t partial_count, int set) {
  BENCH_CHECK(ncclGroupStart());
  for (int g = 0; g < gpus.size(); ++g) {
    nccl_reduce_scatter(gpus[g].comm, ranks[g].partial[set].get(), ranks[g].out[set].get(), partial_count,
                        gpus.size(), gpus[g].stream);
  }
  BENCH_CHECK(ncclGroupEnd());
}

// Runs the unfused path once on input set 0 into poisoned outputs and measures it against FP32
// references: each GPU's GEMM against its own, each reduce-scatter output against the sum of the
// references' rows it owns.
ShapeErrors check_shape(GpuSet& gpus, std::vector<RankBuffers>& ranks, const Problem& problem, bool with_comm) {
  const int num_gpus = gpus.size();
  const size_t partial_count = size_t(problem.m) * size_t(problem.n);
  const size_t out_count = partial_count / size_t(num_gpus);
  for (int g = 0; g < num_gpus; ++g) {
    BENCH_CHECK(cudaSetDevice(gpus[g].device));
    poison_bf16(ranks[g].partial[0].as<bf16>(), partial_count, gpus[g].stream);
    if (with_comm) poison_bf16(ranks[g].out[0].as<bf16>(), out_count, gpus[g].stream);
  }
  gemm_all(gpus, ranks, problem, 0);
  if (with_comm) reduce_scatter_all(gpus, ranks, partial_count, 0);

  std::vector<DeviceBuffer> partial_refs;
  for (int g = 0; g < num_gpus; ++g) {
    partial_refs.emplace_back(gpus[g].device, partial_count * sizeof(float));
    BENCH_CHECK(cudaSetDevice(gpus[g].device));
    reference_gemm(problem, ranks[g].a[0].as<bf16>(), ranks[g].w[0].as<bf16>(), partial_refs[g].as<float>(),
                   gpus[g].stream);
  }
  ShapeErrors errors;
  for (int g = 0; g < num_gpus; ++g) {
    BENCH_CHECK(cudaSetDevice(gpus[g].device));
    errors.gemm.merge(
        measure_error(ranks[g].partial[0].as<bf16>(), partial_refs[g].as<float>(), partial_count, gpus[g].stream));
  }
  if (!with_comm) return errors;

  std::vector<DeviceBuffer> out_refs;
  std::vector<const float*> partial_ptrs;
  std::vector<float*> out_ptrs;
  for (int g = 0; g < num_gpus; ++g) {
    out_refs.emplace_back(gpus[g].device, out_count * sizeof(float));
    partial_ptrs.push_back(partial_refs[g].as<float>());
    out_ptrs.push_back(out_refs[g].as<float>());
  }
  reference_reduce_scatter(gpus, partial_ptrs, out_ptrs, problem.m, problem.n);
  for (int g = 0; g < num_gpus; ++g) {
    BENCH_CHECK(cudaSetDevice(gpus[g].device));
    errors.reduce_scatter.merge(
        measure_error(ranks[g].out[0].as<bf16>(), out_refs[g].as<float>(), out_count, gpus[g].stream));
  }
  return errors;
}

Row run_shape(GpuSet& gpus, const Options& options, size_t shape_index, Report& report) {
  const Shape& shape = options.shapes[shape_index];
  const Problem problem = make_problem(shape, options);
  const int num_gpus = gpus.size();
  const bool with_comm = num_gpus >= 2 && shape.m % num_gpus == 0;
  Row row = shape_row(shape);
  if (num_gpus >= 2 && !with_comm) {
    row["note"] = "M not divisible by " + std::to_string(num_gpus) + " GPUs: no reduce-scatter";
  }

  const size_t a_count = size_t(problem.m) * size_t(problem.k_per_rank);
  const size_t w_count = size_t(problem.k_per_rank) * size_t(problem.n);
  const size_t partial_count = size_t(problem.m) * size_t(problem.n);
  const size_t out_count = with_comm ? partial_count / size_t(num_gpus) : 0;
  const size_t set_bytes = (a_count + w_count + partial_count + out_count) * sizeof(bf16);
  const int num_sets = rotation_sets(set_bytes, gpus[0].l2_bytes, rotation_budget_bytes(gpus[0].device));

  std::vector<RankBuffers> ranks(num_gpus);
  for (int g = 0; g < num_gpus; ++g) {
    const uint64_t seed = *options.seed;
    ranks[g].a = random_bf16_sets(gpus[g], a_count, num_sets, tensor_seed(seed, shape_index, g, 0, kA));
    ranks[g].w = random_bf16_sets(gpus[g], w_count, num_sets, tensor_seed(seed, shape_index, g, 0, kW));
    // Random partials: the reduce-scatter alone adds real numbers, not left-over memory.
    ranks[g].partial =
        random_bf16_sets(gpus[g], partial_count, num_sets, tensor_seed(seed, shape_index, g, 0, kPartial));
    if (with_comm) ranks[g].out = poisoned_bf16_sets(gpus[g], out_count, num_sets);
  }
  gpus.synchronize();

  if (options.check) {
    const ShapeErrors errors = check_shape(gpus, ranks, problem, with_comm);
    const ErrorStats gemm = errors.gemm.stats();
    row["gemm_max_rel"] = gemm.max_rel;
    row["gemm_norm_rel"] = gemm.norm_rel;
    if (with_comm) {
      const ErrorStats rs = errors.reduce_scatter.stats();
      row["rs_max_rel"] = rs.max_rel;
      row["rs_norm_rel"] = rs.norm_rel;
    }
    const uint64_t wrong = errors.gemm.num_nonfinite + errors.reduce_scatter.num_nonfinite;
    row["wrong"] = double(wrong);
    if (wrong > 0) report.count_failure();
  }

  const TimingOptions timing = timing_options(options);
  const double t_gemm = time_median_ms(gpus, timing, [&](int i) { gemm_all(gpus, ranks, problem, i % num_sets); });
  row["t_gemm_ms"] = t_gemm;
  row["tflops_gemm"] = tflops(problem.flops_per_rank(), t_gemm);
  if (with_comm) {
    const double t_comm = time_median_ms(
        gpus, timing, [&](int i) { reduce_scatter_all(gpus, ranks, partial_count, i % num_sets); });
    const double t_seq = time_median_ms(gpus, timing, [&](int i) {
      gemm_all(gpus, ranks, problem, i % num_sets);
      reduce_scatter_all(gpus, ranks, partial_count, i % num_sets);
    });
    // nccl-tests' reduce-scatter bandwidths: algbw over the whole m x n buffer, busbw = algbw (G-1)/G.
    const double algbw = double(partial_count * sizeof(bf16)) / (t_comm * 1e-3) / 1e9;
    row["t_comm_ms"] = t_comm;
    row["algbw_gbps"] = algbw;
    row["busbw_gbps"] = algbw * (num_gpus - 1) / num_gpus;
    row["t_seq_ms"] = t_seq;
    row["comm_gpus"] = double(num_gpus);
  }
  row["input_sets"] = double(num_sets);
  return row;
}

}  // namespace

void run_baseline(const Options& options, Report& report) {
  const int num_gpus = options.gpus;
  GpuSet gpus(num_gpus, /*with_nccl=*/num_gpus >= 2);
  report.set_columns(baseline_columns(options.check));
  if (num_gpus == 1) {
    report.add_note("1 GPU in use (visible, or --gpus 1): reduce-scatter needs 2 or more, so T_comm, busbw and "
                    "T_seq stay empty");
  } else if (num_gpus != options.tp) {
    report.add_note("the reduce-scatter runs over the " + std::to_string(num_gpus) + " GPUs (P_comm = " +
                    std::to_string(num_gpus) + "), while the GEMMs keep K/P of P = " + std::to_string(options.tp));
  }
  report.add_note("times in ms: median of " + std::to_string(options.iters) + " iterations after " +
                  std::to_string(options.warmup) + " warm-up, slowest GPU; busbw = (M*N*2 bytes / T_comm) * (G-1)/G");
  report.print_header();

  double log_tflops_sum = 0;
  uint64_t total_wrong = 0;
  for (size_t i = 0; i < options.shapes.size(); ++i) {
    const Row row = run_shape(gpus, options, i, report);
    log_tflops_sum += std::log(std::get<double>(row.at("tflops_gemm")));
    if (options.check) total_wrong += uint64_t(std::get<double>(row.at("wrong")));
    report.add_row(row);
  }

  const double geomean_tflops = std::exp(log_tflops_sum / double(options.shapes.size()));
  std::string line = "baseline: " + std::to_string(options.shapes.size()) + " shapes on " + std::to_string(num_gpus) +
                     " GPU(s); cuBLAS GEMM geomean " + std::to_string(int(std::lround(geomean_tflops))) + " TFLOP/s";
  Row summary = {{"shapes", double(options.shapes.size())}, {"gemm_tflops_geomean", geomean_tflops}};
  if (options.check) {
    line += "; #wrong " + std::to_string(total_wrong);
    summary["wrong"] = double(total_wrong);
  }
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
