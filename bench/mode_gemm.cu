// Mode gemm: tpfuse::gemm against cuBLAS on each per-rank shape, on GPU 0, in the same run. With
// --check, both against the FP32 reference, and docs/SPEC.md's rule: each of ours' errors <= 1.1x cuBLAS's.
#include <algorithm>
#include <cmath>
#include <string>

#include "testing/gpu_check.h"
#include "gemm_sets.h"
#include "modes.h"

namespace tpfuse::bench {

namespace {

// The roofline a per-rank GEMM is held to: reading W once at the HBM's rate, or the multiply at the
// dense BF16 rate, whichever is longer (H200).
constexpr double kHbmBytesPerSecond = 4.2e12;
constexpr double kBf16FlopsPerSecond = 750e12;

double roofline_ms(const Problem& problem) {
  const double w_bytes = 2.0 * double(problem.n) * double(problem.k_per_rank);
  return 1e3 * std::max(w_bytes / kHbmBytesPerSecond, problem.flops_per_rank() / kBf16FlopsPerSecond);
}

// The timed calls, in the loop's order.
std::vector<TimedCall> gemm_calls(bool compare) {
  std::vector<TimedCall> calls = {{"cublas", "cublas", "cub"}, {"ours", "ours", "our"}};
  if (compare) calls.push_back({"ours_b", "ours_b", "our_b", /*variant=*/true});
  return calls;
}

std::vector<Column> gemm_columns(bool check, bool compare, bool separate_loops) {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"cublas_over_ours", "cublas/ours", 11, Format::kFixed, 3},
      {"roofline_ms", "roof(ms)", 8, Format::kFixed, 4},
      {"ours_over_roofline", "ours/roof", 9, Format::kFixed, 2},
  });
  if (compare) columns.push_back({"b_over_ours", "b/ours", 7, Format::kFixed, 3});
  add_call_columns(columns, gemm_calls(compare), separate_loops);
  add_loop_sensor_columns(columns);
  if (check) {
    add_error_columns(columns, "cublas", "cub");
    add_error_columns(columns, "ours", "our");
  }
  add_outcome_columns(columns, check);
  return columns;
}

Row run_shape(Gpu& gpu, GpuSet& gpus, const Options& options, size_t shape_index, Report& report) {
  const Shape& shape = options.shapes[shape_index];
  const Problem problem = make_problem(shape, options);
  Row row = shape_row(shape);
  GemmSets sets = make_gemm_sets(gpu, problem, 0, *options.seed, shape_index);
  const size_t c_count = sets.c_count;
  gpus.synchronize();

  Outcome outcome;
  if (options.check) {
    // Set 0's outputs are still poisoned: one call of each, then both against the reference.
    cublas_on_set(gpu, problem, sets, 0);
    attempt([&] { ours_on_set(gpu, problem, sets, 0, options.overrides); }, &outcome.failure);
    DeviceBuffer ref(gpu.device, c_count * sizeof(float));
    reference_on_set(gpu, problem, sets, 0, ref.as<float>());
    const ErrorSums cublas = measure_error(sets.c_cublas[0].as<bf16>(), ref.as<float>(), c_count, gpu.stream);
    const ErrorSums ours = measure_error(sets.c_ours[0].as<bf16>(), ref.as<float>(), c_count, gpu.stream);
    const ErrorStats cublas_stats = cublas.stats(), ours_stats = ours.stats();
    set_errors(row, "cublas", cublas_stats);
    set_errors(row, "ours", ours_stats);
    const bool pass = within_tolerance(ours_stats, cublas_stats);
    row["rule"] = std::string(pass ? "pass" : "FAIL");
    outcome.rule_failed = !pass;
    outcome.wrong = cublas.num_nonfinite + ours.num_nonfinite;
  }

  TimingOptions timing = timing_options(options);
  const LaunchFn cublas_call = [&](int i) { cublas_on_set(gpu, problem, sets, rotation_set(i, sets.num_sets)); };
  const LaunchFn ours_call = [&](int i) { ours_on_set(gpu, problem, sets, rotation_set(i, sets.num_sets), options.overrides); };
  std::vector<LaunchFn> calls{cublas_call, ours_call};
  if (options.compare) {
    calls.push_back([&](int i) { ours_on_set(gpu, problem, sets, rotation_set(i, sets.num_sets), *options.compare); });
    timing.alternate = AlternatePair{1, 2};  // the compared two trade places every other pass (loop_order.h)
  }
  // Timed together (time_loop); cuBLAS alone where ours fails.
  LoopTiming loop;
  const bool ours_ok =
      outcome.failure.empty() && attempt([&] { loop = time_loop(gpus, timing, calls); }, &outcome.failure);
  if (!ours_ok) {
    timing.alternate.reset();
    loop = time_loop(gpus, timing, {cublas_call});
  }
  const std::vector<TimedCall> timed = gemm_calls(options.compare.has_value());
  for (size_t i = 0; i < loop.launches.size(); ++i) set_call(row, timed[i], loop, i, problem.flops_per_rank());
  const auto& times = loop.launches;
  const double roof_ms = roofline_ms(problem);
  row["roofline_ms"] = roof_ms;
  if (ours_ok) {
    row["ours_over_roofline"] = times[1].median_ms / roof_ms;
    row["cublas_over_ours"] = times[0].median_ms / times[1].median_ms;
    if (options.compare) row["b_over_ours"] = times[2].median_ms / times[1].median_ms;
  }
  set_loop_sensors(row, loop.sensors);
  finish_row(row, report, options, outcome, c_count, sets.num_sets);
  return row;
}

}  // namespace

void run_gemm(const Options& options, Report& report) {
  GpuSet gpus(1, /*with_nccl=*/false);
  report.set_columns(gemm_columns(options.check, options.compare.has_value(), options.separate_loops));
  report.add_note("GPU 0 only; times in ms: median of " + std::to_string(options.iters) + " iterations after " +
                  std::to_string(options.warmup) +
                  " warm-up, cuBLAS's and ours " + call_order(options) + "; cublas/ours = T_cublas / T_ours (above 1: ours is faster); "
                  "ours with overrides " + options.overrides.to_string() +
                  (options.compare ? ", ours_b with " + options.compare->to_string() : std::string()));
  report.add_note("roof = max(W's bytes / 4.2 TB/s, 2MNK / 750 TFLOP/s): reading W once at the HBM's rate or the "
                  "multiply at the dense BF16 rate of an H200");
  report.add_note(timing_columns_note(options, gpus.sensors(), /*multi_gpu=*/false));
  if (options.check) {
    report.add_note("rule: each of ours' errors (max and L2, relative to the FP32 reference) <= 1.1x cuBLAS's");
  }
  report.print_header();

  const std::vector<Row> rows = run_shapes(options.shapes.size(), gpus, report, [&](size_t i) {
    return run_shape(gpus[0], gpus, options, i, report);
  });

  const ColumnSpread ratio = column_spread(rows, "cublas_over_ours");
  std::string line = "gemm: ours ran on " + std::to_string(ratio.count()) + " of " +
                     std::to_string(options.shapes.size()) + " shapes";
  Row summary = {{"shapes", double(options.shapes.size())}, {"ours_ran", double(ratio.count())}};
  add_geomean(ratio, "cublas_over_ours", "cublas/ours", /*with_max=*/false, line, summary);
  add_geomean(column_spread(rows, "b_over_ours"), "b_over_ours", "b/ours", /*with_max=*/false, line, summary);
  OutcomeTally(rows).summarize(options, line, summary);
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
