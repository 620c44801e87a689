// Mode baseline: the unfused path on every GPU. T_gemm = cuBLAS alone, T_comm = NCCL reduce-scatter
// of the m x n BF16 partial alone, on cudaMalloc'd buffers (T_comm_ring) and on NCCL symmetric
// windows (T_comm_sym), T_comm the faster, T_seq = both on one stream on the faster path; with
// --check, the errors of the GEMM and of both reduce-scatters against FP32 references, and the
// symmetric output against the ring's. On one GPU the reduce-scatter is NCCL's over one rank (a
// copy): it runs and is checked, and its times mean nothing for P >= 2.
#include <cmath>
#include <optional>
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
  });
  const std::vector<Column> comm = comm_columns();
  columns.insert(columns.end(), comm.begin(), comm.end());
  columns.insert(columns.end(), {
      {"algbw_gbps", "algbw(GB/s)", 11, Format::kFixed, 1, false},
      {"busbw_gbps", "busbw(GB/s)", 11, Format::kFixed, 1},
  });
  if (check) {
    add_error_columns(columns, "gemm", "gemm");
    add_error_columns(columns, "rs", "rs");
    add_symmetric_error_columns(columns);
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
  const bool with_comm = shape.m % num_gpus == 0;
  Row row = shape_row(shape);
  if (!with_comm) row["note"] = "M not divisible by " + std::to_string(num_gpus) + " GPUs: no reduce-scatter";

  const RankCounts counts = rank_counts(problem, num_gpus, with_comm);
  const size_t set_bytes = counts.bf16_bytes() + (with_comm ? symmetric_bytes_per_set(counts) : 0);
  const int num_sets = rotation_sets(set_bytes, gpus[0].l2_bytes, rotation_budget_bytes(gpus[0].device));
  UnfusedBuffers buffers = make_unfused_buffers(gpus, counts, num_sets, *options.seed, shape_index);
  std::optional<SymmetricBuffers> symmetric;
  if (with_comm) symmetric.emplace(gpus, buffers);
  if (symmetric && !symmetric->available()) row["note"] = "no symmetric window: " + symmetric->reason();
  gpus.synchronize();

  if (options.check) {
    const References refs = make_references(gpus, buffers, problem);
    const UnfusedErrors errors = check_unfused(gpus, buffers, problem, refs);
    set_errors(row, "gemm", errors.gemm.stats());
    uint64_t wrong = errors.gemm.num_nonfinite + errors.reduce_scatter.num_nonfinite;
    if (with_comm) set_errors(row, "rs", errors.reduce_scatter.stats());
    if (symmetric) wrong += check_symmetric_into(row, gpus, buffers, *symmetric, refs);
    row["wrong"] = double(wrong);
    if (wrong > 0) report.count_failure();
  }

  const UnfusedTimes times =
      time_unfused(gpus, buffers, problem, timing_options(options), symmetric ? &*symmetric : nullptr);
  row["t_gemm_ms"] = times.gemm;
  row["tflops_gemm"] = tflops(problem.flops_per_rank(), times.gemm);
  if (with_comm) {
    // nccl-tests' reduce-scatter bandwidths: algbw over the whole m x n buffer, busbw = algbw (G-1)/G.
    const double algbw = double(counts.partial * sizeof(bf16)) / (times.comm * 1e-3) / 1e9;
    set_comm_times(row, times);
    row["algbw_gbps"] = algbw;
    row["busbw_gbps"] = algbw * (num_gpus - 1) / num_gpus;
    row["comm_gpus"] = double(num_gpus);
  }
  row["input_sets"] = double(num_sets);
  return row;
}

}  // namespace

void run_baseline(const Options& options, Report& report) {
  const int num_gpus = options.gpus;
  GpuSet gpus(num_gpus, /*with_nccl=*/true);
  report.set_columns(baseline_columns(options.check));
  if (num_gpus == 1) {
    report.add_note("1 GPU in use (visible, or --gpus 1): the reduce-scatter is NCCL's over one rank (a copy), run "
                    "and checked only; T_comm, busbw and T_seq say nothing of P >= 2");
  } else if (num_gpus != options.tp) {
    report.add_note("the reduce-scatter runs over the " + std::to_string(num_gpus) + " GPUs (P_comm = " +
                    std::to_string(num_gpus) + "), while the GEMMs keep K/P of P = " + std::to_string(options.tp));
  }
  report.add_note("times in ms: median of " + std::to_string(options.iters) + " iterations after " +
                  std::to_string(options.warmup) + " warm-up, slowest GPU; busbw = (M*N*2 bytes / T_comm) * (G-1)/G");
  report.add_note(comm_note(options.check));
  report.print_header();

  const std::vector<Row> rows = run_shapes(options.shapes.size(), gpus, report, [&](size_t i) {
    return run_shape(gpus, options, i, report);
  });

  const ColumnSpread tflops = column_spread(rows, "tflops_gemm");
  std::string line = "baseline: " + std::to_string(options.shapes.size()) + " shapes on " + std::to_string(num_gpus) +
                     " GPU(s); cuBLAS GEMM geomean " + std::to_string(int(std::lround(tflops.geomean()))) + " TFLOP/s";
  Row summary = {{"shapes", double(options.shapes.size())}, {"gemm_tflops_geomean", tflops.geomean()}};
  if (options.check) {
    const uint64_t total_wrong = OutcomeTally(rows).wrong;
    line += "; #wrong " + std::to_string(total_wrong);
    summary["wrong"] = double(total_wrong);
  }
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
