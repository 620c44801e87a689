// tpfuse_bench: the benchmark CLI (nccl-tests style). Parses the options, runs one mode over the
// shapes, prints the table as it goes, and writes JSON and CSV. Exit status: 0 all good, 1 a wrong
// result or a failed call, 2 bad arguments.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "meta.h"
#include "modes.h"
#include "report.h"

namespace tpfuse::bench {
namespace {

struct Mode {
  const char* name;
  ModeFn run;
  int max_gpus;  // 0: every GPU it is given
};

constexpr Mode kModes[] = {
    {"baseline", run_baseline, 0},
    {"gemm", run_gemm, 1},
    {"proxy", run_proxy, 1},
    {"fused", run_fused, 0},
    {"ag", run_fused, 0},  // fused --op ag
    {"ag-proxy", run_proxy, 1},  // proxy --op ag
    {"p2p", run_p2p, 2},
};

std::vector<std::string> mode_names() {
  std::vector<std::string> names;
  for (const Mode& mode : kModes) names.push_back(mode.name);
  return names;
}

// The parser accepts only the names of kModes.
const Mode& find_mode(const std::string& name) {
  for (const Mode& mode : kModes) {
    if (name == mode.name) return mode;
  }
  return kModes[0];
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
  file.close();
  if (!file) std::fprintf(stderr, "tpfuse_bench: could not write %s\n", path.c_str());
  return bool(file);
}

std::string text_of(const Fields& fields, const std::string& key) {
  for (const auto& [name, value] : fields) {
    if (name == key) {
      if (const auto* text = std::get_if<std::string>(&value)) return *text;
    }
  }
  return "?";
}

// "1980 MHz"; "unknown" where the metadata has no number under `key`.
std::string number_text(const Fields& fields, const std::string& key, const char* unit) {
  for (const auto& [name, value] : fields) {
    if (const auto* number = std::get_if<double>(&value); name == key && number != nullptr) {
      char text[32];
      std::snprintf(text, sizeof(text), "%.0f %s", *number, unit);
      return text;
    }
  }
  return "unknown";
}

int run(int argc, char** argv) {
  const std::vector<std::string> names = mode_names();
  ParseResult parsed = parse_args(std::vector<std::string>(argv + 1, argv + argc), names);
  if (parsed.outcome == ParseOutcome::kHelp) {
    std::fputs(usage(names).c_str(), stdout);
    return 0;
  }
  if (parsed.outcome == ParseOutcome::kError) {
    std::fprintf(stderr, "tpfuse_bench: %s\nRun 'tpfuse_bench --help' for the options.\n", parsed.error.c_str());
    return 2;
  }
  Options options = parsed.options;
  // Fresh inputs on every run unless a seed is given; below 2^32, so exact in the JSON.
  if (!options.seed) options.seed = std::random_device{}();

  int visible = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&visible); err != cudaSuccess || visible == 0) {
    std::fprintf(stderr, "tpfuse_bench: no CUDA GPU visible (%s)\n",
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 1;
  }
  if (options.gpus > visible) {
    std::fprintf(stderr, "tpfuse_bench: --gpus %d: only %d GPU(s) visible\n", options.gpus, visible);
    return 2;
  }
  if (options.gpus == 0) options.gpus = visible;
  const Mode& mode = find_mode(options.mode);
  if (mode.max_gpus > 0 && options.gpus > mode.max_gpus) options.gpus = mode.max_gpus;

  Report report(stdout);
  bool call_failed = false;
  Fields meta;
  try {
    meta = collect_meta(options.gpus);
    report.add_note("tpfuse_bench " + text_of(meta, "git_commit") + " on " + text_of(meta, "hostname") + ", " +
                    std::to_string(options.gpus) + " x " + text_of(meta, "gpu") + "; CUDA driver API " +
                    text_of(meta, "cuda_driver_api") + ", runtime " + text_of(meta, "cuda_runtime") + ", cuBLAS " +
                    text_of(meta, "cublas") + ", NCCL " + text_of(meta, "nccl"));
    const std::string nvml = text_of(meta, "nvml");
    report.add_note("GPU 0: max SM clock " + number_text(meta, "sm_clock_max_mhz", "MHz") + ", power limit " +
                    number_text(meta, "power_limit_w", "W") + (nvml == "ok" ? "" : " (" + nvml + ")"));
    report.add_note("mode " + options.mode + ", --tp " + std::to_string(options.tp) + " (K/P = K/" +
                    std::to_string(options.tp) + "), layout " +
                    layout_flag(options.weight_layout) + ", warmup " + std::to_string(options.warmup) + ", iters " +
                    std::to_string(options.iters) + (options.check ? ", check" : "") +
                    (options.gate ? "" : ", no gate") + ", seed " + std::to_string(*options.seed));
    mode.run(options, report);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tpfuse_bench: %s\n", e.what());
    call_failed = true;
  }

  // What was measured is written even after a failure.
  bool written = true;
  if (!options.json_path.empty()) written &= write_file(options.json_path, report.json(meta, options_fields(options)));
  if (!options.csv_path.empty()) written &= write_file(options.csv_path, report.csv());
  return call_failed || !written || report.failures() > 0 ? 1 : 0;
}

}  // namespace
}  // namespace tpfuse::bench

int main(int argc, char** argv) { return tpfuse::bench::run(argc, argv); }
