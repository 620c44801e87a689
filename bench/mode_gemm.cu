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

std::vector<Column> gemm_columns(bool check, bool compare, bool separate_loops) {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"t_cublas_ms", "T_cublas(ms)", 12, Format::kFixed, 4},
      {"t_ours_ms", "T_ours(ms)", 10, Format::kFixed, 4},
      {"tflops_cublas", "TF_cublas", 9, Format::kFixed, 1},
      {"tflops_ours", "TF_ours", 8, Format::kFixed, 1},
      {"cublas_over_ours", "cublas/ours", 11, Format::kFixed, 3},
      {"roofline_ms", "roof(ms)", 8, Format::kFixed, 4},
      {"ours_over_roofline", "ours/roof", 9, Format::kFixed, 2},
  });
  if (compare) {
    columns.insert(columns.end(), {
        {"t_ours_b_ms", "T_ours_b(ms)", 12, Format::kFixed, 4},
        {"b_over_ours", "b/ours", 7, Format::kFixed, 3},
    });
  }
  columns.insert(columns.end(), {
      {"host_cublas_us", "H_cub(us)", 9, Format::kFixed, 1},
      {"host_ours_us", "H_our(us)", 9, Format::kFixed, 1},
      {"mhz_cublas", "MHz_cub", 7, Format::kInteger},
      {"mhz_ours", "MHz_our", 7, Format::kInteger},
      {"power_cublas_w", "W_cub", 5, Format::kInteger, 0, separate_loops},
      {"power_ours_w", "W_our", 5, Format::kInteger, 0, separate_loops},
  });
  if (compare) {
    columns.insert(columns.end(), {
        {"host_ours_b_us", "H_our_b(us)", 11, Format::kFixed, 1, false},
        {"mhz_ours_b", "MHz_our_b", 9, Format::kInteger, 0, false},
        {"power_ours_b_w", "W_our_b", 7, Format::kInteger, 0, false},
    });
  }
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
    reference_gemm(problem, sets.a[0].as<bf16>(), sets.w[0].as<bf16>(), ref.as<float>(), gpu.stream);
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

  const TimingOptions timing = timing_options(options);
  const LaunchFn cublas_call = [&](int i) { cublas_on_set(gpu, problem, sets, rotation_set(i, sets.num_sets)); };
  const LaunchFn ours_call = [&](int i) { ours_on_set(gpu, problem, sets, rotation_set(i, sets.num_sets), options.overrides); };
  std::vector<LaunchFn> calls{cublas_call, ours_call};
  if (options.compare) {
    calls.push_back([&](int i) { ours_on_set(gpu, problem, sets, rotation_set(i, sets.num_sets), *options.compare); });
  }
  // Timed together (time_loop); cuBLAS alone where ours fails.
  LoopTiming loop;
  const bool ours_ok =
      outcome.failure.empty() && attempt([&] { loop = time_loop(gpus, timing, calls); }, &outcome.failure);
  if (!ours_ok) loop = time_loop(gpus, timing, {cublas_call});
  const auto& times = loop.launches;
  const auto& mhz = loop.sensors.sm_clock_mhz;
  const auto& watts = loop.sensors.launch_power_w;
  row["t_cublas_ms"] = times[0].median_ms;
  row["tflops_cublas"] = tflops(problem.flops_per_rank(), times[0].median_ms);
  row["host_cublas_us"] = times[0].host_us;
  set_if_read(row, "mhz_cublas", mhz[0]);
  set_if_read(row, "power_cublas_w", watts[0]);
  const double roof_ms = roofline_ms(problem);
  row["roofline_ms"] = roof_ms;
  if (ours_ok) {
    row["t_ours_ms"] = times[1].median_ms;
    row["ours_over_roofline"] = times[1].median_ms / roof_ms;
    row["tflops_ours"] = tflops(problem.flops_per_rank(), times[1].median_ms);
    row["cublas_over_ours"] = times[0].median_ms / times[1].median_ms;
    row["host_ours_us"] = times[1].host_us;
    set_if_read(row, "mhz_ours", mhz[1]);
    set_if_read(row, "power_ours_w", watts[1]);
    if (options.compare) {
      row["t_ours_b_ms"] = times[2].median_ms;
      row["b_over_ours"] = times[2].median_ms / times[1].median_ms;
      row["host_ours_b_us"] = times[2].host_us;
      set_if_read(row, "mhz_ours_b", mhz[2]);
      set_if_read(row, "power_ours_b_w", watts[2]);
    }
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

  double log_ratio_sum = 0, log_b_sum = 0;
  int num_ours = 0;
  OutcomeTally tally;
  for (size_t i = 0; i < options.shapes.size(); ++i) {
    const Row row = run_shape(gpus[0], gpus, options, i, report);
    note_sensor_failures(report, gpus.sensors());
    if (const double* ratio = number_in(row, "cublas_over_ours")) {
      log_ratio_sum += std::log(*ratio);
      ++num_ours;
    }
    if (const double* b = number_in(row, "b_over_ours")) log_b_sum += std::log(*b);
    tally.add(row);
    report.add_row(row);
  }

  const size_t num_shapes = options.shapes.size();
  std::string line = "gemm: ours ran on " + std::to_string(num_ours) + " of " + std::to_string(num_shapes) + " shapes";
  Row summary = {{"shapes", double(num_shapes)}, {"ours_ran", double(num_ours)}};
  if (num_ours > 0) {
    const double geomean = std::exp(log_ratio_sum / num_ours);
    char text[64];
    std::snprintf(text, sizeof(text), "; cublas/ours geomean %.3f", geomean);
    line += text;
    summary["cublas_over_ours_geomean"] = geomean;
    if (options.compare) {
      const double b = std::exp(log_b_sum / num_ours);
      std::snprintf(text, sizeof(text), "; b/ours geomean %.3f", b);
      line += text;
      summary["b_over_ours_geomean"] = b;
    }
  }
  tally.summarize(options, line, summary);
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
