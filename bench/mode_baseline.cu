// Mode baseline: the unfused path on every GPU. T_gemm = cuBLAS alone, T_comm = NCCL reduce-scatter
// of the m x n BF16 partial alone, T_seq = both on one stream; with --check, the errors of the GEMM
// and of the reduce-scatter against FP32 references.
#include <cmath>
#include <string>

#include "modes.h"
#include "unfused.h"

namespace tpfuse::bench {

namespace {

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
    add_error_columns(columns, "gemm", "gemm");
    add_error_columns(columns, "rs", "rs");
    columns.push_back({"wrong", "#wrong", 7, Format::kInteger});
  }
  columns.insert(columns.end(), {
      {"comm_gpus", "P_comm", 6, Format::kInteger, 0, false},
      {"input_sets", "sets", 4, Format::kInteger, 0, false},
      {"note", "note", 0, Format::kText},
  });
  return columns;
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

  const RankCounts counts = rank_counts(problem, num_gpus, with_comm);
  const int num_sets = rotation_sets(counts.bf16_bytes(), gpus[0].l2_bytes, rotation_budget_bytes(gpus[0].device));
  UnfusedBuffers buffers = make_unfused_buffers(gpus, counts, num_sets, *options.seed, shape_index);
  gpus.synchronize();

  if (options.check) {
    const UnfusedErrors errors = check_unfused(gpus, buffers, problem, make_references(gpus, buffers, problem));
    set_errors(row, "gemm", errors.gemm.stats());
    if (with_comm) set_errors(row, "rs", errors.reduce_scatter.stats());
    const uint64_t wrong = errors.gemm.num_nonfinite + errors.reduce_scatter.num_nonfinite;
    row["wrong"] = double(wrong);
    if (wrong > 0) report.count_failure();
  }

  const UnfusedTimes times = time_unfused(gpus, buffers, problem, timing_options(options));
  row["t_gemm_ms"] = times.gemm;
  row["tflops_gemm"] = tflops(problem.flops_per_rank(), times.gemm);
  if (with_comm) {
    // nccl-tests' reduce-scatter bandwidths: algbw over the whole m x n buffer, busbw = algbw (G-1)/G.
    const double algbw = double(counts.partial * sizeof(bf16)) / (times.comm * 1e-3) / 1e9;
    row["t_comm_ms"] = times.comm;
    row["algbw_gbps"] = algbw;
    row["busbw_gbps"] = algbw * (num_gpus - 1) / num_gpus;
    row["t_seq_ms"] = times.seq;
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
