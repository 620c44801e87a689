// Mode gemm: tpfuse::gemm against cuBLAS on each per-rank shape, on GPU 0, in the same run. With
// --check, both against the FP32 reference, and SPEC's rule: each of ours' errors <= 1.1x cuBLAS's.
#include <cmath>
#include <string>

#include "baselines.h"
#include "check.h"
#include "modes.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kA, kW };

constexpr double kErrorFactor = 1.1;

struct Buffers {
  std::vector<DeviceBuffer> a, w, c_cublas, c_ours;  // one per input set
};

std::vector<Column> gemm_columns(bool check) {
  std::vector<Column> columns = shape_columns();
  columns.insert(columns.end(), {
      {"t_cublas_ms", "T_cublas(ms)", 12, Format::kFixed, 4},
      {"t_ours_ms", "T_ours(ms)", 10, Format::kFixed, 4},
      {"tflops_cublas", "TF_cublas", 9, Format::kFixed, 1},
      {"tflops_ours", "TF_ours", 8, Format::kFixed, 1},
      {"cublas_over_ours", "cublas/ours", 11, Format::kFixed, 3},
  });
  if (check) {
    columns.insert(columns.end(), {
        {"cublas_max_rel", "cub_maxrel", 10, Format::kScientific, 2},
        {"cublas_norm_rel", "cub_l2rel", 10, Format::kScientific, 2},
        {"ours_max_rel", "our_maxrel", 10, Format::kScientific, 2},
        {"ours_norm_rel", "our_l2rel", 10, Format::kScientific, 2},
        {"rule", "rule", 4, Format::kText},
    });
  }
  columns.insert(columns.end(), {
      {"wrong", "#wrong", 9, Format::kInteger},
      {"input_sets", "sets", 4, Format::kInteger, 0, false},
      {"status", "status", 0, Format::kText},
  });
  return columns;
}

// Ours on input set `set`; a bad Status becomes OpFailed.
void run_ours(const Problem& problem, Buffers& buffers, int set, cudaStream_t stream) {
  check_op(tpfuse::gemm(problem, buffers.a[set].get(), buffers.w[set].get(), buffers.c_ours[set].get(), stream));
}

Row run_shape(Gpu& gpu, GpuSet& gpus, const Options& options, size_t shape_index, Report& report) {
  const Shape& shape = options.shapes[shape_index];
  const Problem problem = make_problem(shape, options);
  Row row = shape_row(shape);

  const size_t a_count = size_t(problem.m) * size_t(problem.k_per_rank);
  const size_t w_count = size_t(problem.k_per_rank) * size_t(problem.n);
  const size_t c_count = size_t(problem.m) * size_t(problem.n);
  const size_t set_bytes = (a_count + w_count + 2 * c_count) * sizeof(bf16);
  const int num_sets = rotation_sets(set_bytes, gpu.l2_bytes, rotation_budget_bytes(gpu.device));

  Buffers buffers;
  const uint64_t seed = *options.seed;
  buffers.a = random_bf16_sets(gpu, a_count, num_sets, tensor_seed(seed, shape_index, 0, 0, kA));
  buffers.w = random_bf16_sets(gpu, w_count, num_sets, tensor_seed(seed, shape_index, 0, 0, kW));
  buffers.c_cublas = poisoned_bf16_sets(gpu, c_count, num_sets);
  buffers.c_ours = poisoned_bf16_sets(gpu, c_count, num_sets);
  gpus.synchronize();

  std::string failure;  // ours' error, if it failed
  uint64_t wrong = 0;
  bool rule_failed = false;
  if (options.check) {
    // Set 0's outputs are still poisoned: one call of each, then both against the reference.
    cublas_gemm(gpu.cublas, problem, buffers.a[0].get(), buffers.w[0].get(), buffers.c_cublas[0].get());
    try {
      run_ours(problem, buffers, 0, gpu.stream);
    } catch (const OpFailed& e) {
      failure = e.what();
    }
    DeviceBuffer ref(gpu.device, c_count * sizeof(float));
    reference_gemm(problem, buffers.a[0].as<bf16>(), buffers.w[0].as<bf16>(), ref.as<float>(), gpu.stream);
    const ErrorSums cublas = measure_error(buffers.c_cublas[0].as<bf16>(), ref.as<float>(), c_count, gpu.stream);
    const ErrorSums ours = measure_error(buffers.c_ours[0].as<bf16>(), ref.as<float>(), c_count, gpu.stream);
    const ErrorStats cublas_stats = cublas.stats(), ours_stats = ours.stats();
    row["cublas_max_rel"] = cublas_stats.max_rel;
    row["cublas_norm_rel"] = cublas_stats.norm_rel;
    row["ours_max_rel"] = ours_stats.max_rel;
    row["ours_norm_rel"] = ours_stats.norm_rel;
    const bool pass = within_tolerance(ours_stats, cublas_stats, kErrorFactor);
    row["rule"] = std::string(pass ? "pass" : "FAIL");
    rule_failed = !pass;
    wrong = cublas.num_nonfinite + ours.num_nonfinite;
  }

  const TimingOptions timing = timing_options(options);
  const double t_cublas = time_median_ms(gpus, timing, [&](int i) {
    const int set = i % num_sets;
    cublas_gemm(gpu.cublas, problem, buffers.a[set].get(), buffers.w[set].get(), buffers.c_cublas[set].get());
  });
  row["t_cublas_ms"] = t_cublas;
  row["tflops_cublas"] = tflops(problem.flops_per_rank(), t_cublas);
  if (failure.empty()) {
    try {
      const double t_ours =
          time_median_ms(gpus, timing, [&](int i) { run_ours(problem, buffers, i % num_sets, gpu.stream); });
      row["t_ours_ms"] = t_ours;
      row["tflops_ours"] = tflops(problem.flops_per_rank(), t_ours);
      row["cublas_over_ours"] = t_cublas / t_ours;
    } catch (const OpFailed& e) {
      failure = e.what();
    }
  }

  // Without --check a failed call's output was never measured: all of it counts as wrong.
  if (!failure.empty() && !options.check) wrong = c_count;
  if (!failure.empty() || wrong > 0 || rule_failed) report.count_failure();
  row["wrong"] = double(wrong);
  row["status"] = failure.empty() ? std::string("ok") : failure;
  row["input_sets"] = double(num_sets);
  return row;
}

}  // namespace

void run_gemm(const Options& options, Report& report) {
  GpuSet gpus(1, /*with_nccl=*/false);
  report.set_columns(gemm_columns(options.check));
  report.add_note("GPU 0 only; times in ms: median of " + std::to_string(options.iters) + " iterations after " +
                  std::to_string(options.warmup) +
                  " warm-up; cublas/ours = T_cublas / T_ours (above 1: ours is faster)");
  if (options.check) {
    report.add_note("rule: each of ours' errors (max and L2, relative to the FP32 reference) <= 1.1x cuBLAS's");
  }
  report.print_header();

  double log_ratio_sum = 0;
  int num_ours = 0;
  uint64_t total_wrong = 0;
  int failed_rules = 0;
  for (size_t i = 0; i < options.shapes.size(); ++i) {
    const Row row = run_shape(gpus[0], gpus, options, i, report);
    if (const auto it = row.find("cublas_over_ours"); it != row.end()) {
      log_ratio_sum += std::log(std::get<double>(it->second));
      ++num_ours;
    }
    if (const auto it = row.find("rule"); it != row.end() && std::get<std::string>(it->second) != "pass") {
      ++failed_rules;
    }
    total_wrong += uint64_t(std::get<double>(row.at("wrong")));
    report.add_row(row);
  }

  const size_t num_shapes = options.shapes.size();
  std::string line = "gemm: ours ran on " + std::to_string(num_ours) + " of " + std::to_string(num_shapes) + " shapes";
  Row summary = {{"shapes", double(num_shapes)}, {"ours_ran", double(num_ours)}, {"wrong", double(total_wrong)}};
  if (num_ours > 0) {
    const double geomean = std::exp(log_ratio_sum / num_ours);
    char text[64];
    std::snprintf(text, sizeof(text), "; cublas/ours geomean %.3f", geomean);
    line += text;
    summary["cublas_over_ours_geomean"] = geomean;
  }
  if (options.check) {
    line += "; rule failures " + std::to_string(failed_rules);
    summary["rule_failures"] = double(failed_rules);
  }
  line += "; #wrong " + std::to_string(total_wrong);
  report.set_summary(line, summary);
}

}  // namespace tpfuse::bench
