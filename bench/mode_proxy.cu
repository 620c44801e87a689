// Mode proxy: the solo-rank proxy of a fused op, on GPU 0 (--op rs, the GEMM + reduce-scatter, or
// --op ag, the all-gather + GEMM; --mode ag-proxy is --mode proxy --op ag). P ranks of a local
// communicator are emulated on GPU 0, rank 0's incoming data is preset as delivered (random numbers,
// flags raised for every call), and rank 0 runs alone on the full grid. T_fused_solo against T_gemm
// (tpfuse::gemm on the same product, its operands already in place) is the cost of the op's own work
// without NVLink. T_cublas is there for reference.
//
//   rs  rank 0 computes all of A_0 @ W_0: segment-steps 0 .. P-2 push the rows of owners 1 .. P-1
//       into their receive buffers (on the same GPU); segment-step P-1 adds the P-1 preset partials
//       to its own rows -> out (m/P x n). T_gemm: the same per-rank GEMM. Target fused/gemm <= 1.05.
//       --timeline also records one more call's pushes (bench/timeline.h).
//   ag  rank 0 multiplies its own block of X, pushes it into the peers' gathered buffers, and
//       multiplies the preset blocks -> Y (m x n/P). Shapes M, N/P, K (the default sweep is the
//       column-parallel layers'); T_gemm: the gathered X (m x k) times W_0. Target fused/gemm <= 1.03.
//   ranks 1 .. P-1 never run
// --fp8 (both ops, every scaling): E4M3 inputs with their scales in the input sets, and T_cublas is
// cuBLASLt's scaled GEMM; the all-gather's preset blocks are E4M3 too, and rowwise and blockwise their
// rows' scales are preset with them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gemm_sets.h"
#include "local_comm.h"
#include "modes.h"
#include "testing/emulated_ranks.h"
#include "testing/gpu_check.h"
#include "testing/solo_rank.h"
#include "timeline.h"
#include "tpfuse/tpfuse.h"

namespace tpfuse::bench {

namespace {

enum Tensor { kPreset = 4, kPresetScales };  // seeds: the input sets' are tensors 0 .. 3 (gemm_sets.cu)

// Rank 0 sums (or multiplies) in FP32 and rounds once to BF16: every element is within half a BF16
// ulp (at most 2^-8 of its value) of the FP32 reference. The check allows twice that on the largest
// element, and 2^-8 on the L2 norm (the RMS of one rounding is well below it); a missing partial or
// block exceeds the L2 bound several times over.
constexpr double kMaxRelBound = 1.0 / 128;
constexpr double kNormRelBound = 1.0 / 256;

// The GEMM + reduce-scatter: rank 0's rows of the sum, m/P x n.
struct ReduceScatterOp {
  using OpProblem = Problem;
  static constexpr const char* kName = "rs";
  static constexpr double kTargetRatio = 1.05;
  static constexpr bool kHasTimeline = true;

  static OpProblem problem(const Shape& shape, const Options& options) { return make_problem(shape, options); }
  static Problem gemm(const OpProblem& p) { return p; }
  static size_t out_count(const OpProblem& p) { return size_t(p.rows_per_rank()) * size_t(p.n); }

  // Random non-zero partials in every rank's receive buffer, the same numbers in both parity halves
  // (a call's parity depends on the device's epoch: rank 0 then reduces the same partials whichever
  // it is), and rank 0's incoming flags raised for every future call.
  static void preset(const LocalCommunicator& comm, const OpProblem&, Gpu& gpu, uint64_t run_seed,
                     size_t shape_index) {
    Communicator* c = comm.get();
    const size_t parity_elems = c->parity.data_bytes / sizeof(bf16);
    for (int r = 0; r < c->world_size; ++r) {
      const uint64_t seed = tensor_seed(run_seed, shape_index, r, 0, kPreset);
      for (int parity = 0; parity < 2; ++parity) {
        fill_random_bf16(static_cast<bf16*>(parity_data(*c, r, parity)), parity_elems, seed, gpu.stream);
      }
    }
    check_op(preset_incoming_flags(c, 0));
  }

  // Rank 0 on input set `set`; its pushes recorded into `timeline` where one is given.
  static void run(const LocalCommunicator& comm, const OpProblem& problem, const GemmSets& sets,
                  const std::vector<DeviceBuffer>& out, int set, cudaStream_t stream, const ConfigOverrides& overrides,
                  PushTimeline* timeline = nullptr) {
    const void* a = sets.a[set].get();
    const void* w = sets.w[set].get();
    void* o = out[set].get();
    const InputScales scales = sets.scales(set);
    check_op(launch_gemm_rs(comm.get(), problem, {0}, &a, &w, nullptr, &o, &stream, overrides, timeline, &scales));
  }

  // The FP32 reference of rank 0's rows: its rows of A_0 @ W_0 plus the preset partials.
  static void reference(Gpu& gpu, const LocalCommunicator& comm, const OpProblem& problem, const GemmSets& sets,
                        float* ref) {
    const size_t count = out_count(problem);
    Problem own_rows = problem;  // rank 0 owns rows [0, m/P): the first rows of A_0
    own_rows.m = problem.rows_per_rank();
    reference_on_set(gpu, own_rows, sets, 0, ref);
    // recv[parity 0][source][m/P][n]: the partials of sources 1 .. P-1 follow source 0's slot.
    const bf16* recv = static_cast<const bf16*>(parity_data(*comm.get(), 0, 0));
    for (int source = 1; source < problem.world_size; ++source) {
      add_bf16_to_ref(ref, recv + size_t(source) * count, count, gpu.stream);
    }
  }
};

// The all-gather + GEMM: rank 0's Y, m x n/P.
struct AllGatherOp {
  using OpProblem = AllGatherProblem;
  static constexpr const char* kName = "ag";
  static constexpr double kTargetRatio = 1.03;
  static constexpr bool kHasTimeline = false;

  // The shape's n is this rank's columns, its k_per_rank all of K; the inputs as --fp8 and
  // --fast-accum say (make_problem).
  static OpProblem problem(const Shape& shape, const Options& options) {
    const Problem inputs = make_problem(shape, options);
    AllGatherProblem p{shape.m, shape.n, shape.k_per_rank, options.tp, options.weight_layout};
    p.dtype = inputs.dtype;
    p.scaling = inputs.scaling;
    p.accumulation = inputs.accumulation;
    return p;
  }
  // The whole product as a plain GEMM of the same inputs: the gathered X (m x k) times W_0 (E4M3: with
  // the m rows' scales, or X's one scale, and W_0's).
  static Problem gemm(const OpProblem& p) {
    Problem gathered = gathered_gemm(p);
    gathered.dtype = p.dtype;
    gathered.scaling = p.scaling;
    gathered.accumulation = p.accumulation;
    return gathered;
  }
  static size_t out_count(const OpProblem& p) { return size_t(p.m) * size_t(p.n_per_rank); }

  // Rowwise and blockwise E4M3: the gathered rows' scales in parity half `parity` of rank 0's gathered
  // buffer, FP32 [source][m/P] (blockwise [source][m/P][k/128]) right behind the m x k bytes of the
  // gathered X (ops/ag_gemm/op.cuh: scales_offset); as many as the gathered product's A has.
  static bool gathers_scales(const OpProblem& p) {
    return p.dtype == DType::kE4M3 && (p.scaling == Scaling::kRowwise || p.scaling == Scaling::kBlockwise);
  }
  static float* gathered_scales(const Communicator& c, const OpProblem& p, int parity) {
    return reinterpret_cast<float*>(static_cast<uint8_t*>(parity_data(c, 0, parity)) + size_t(p.m) * size_t(p.k));
  }

  // Random blocks of X in rank 0's gathered buffer (of X's dtype; rowwise and blockwise E4M3 with their
  // rows' scales), the same in both parity halves, and the peers' flags raised there for every future
  // call.
  static void preset(const LocalCommunicator& comm, const OpProblem& problem, Gpu& gpu, uint64_t run_seed,
                     size_t shape_index) {
    Communicator* c = comm.get();
    const size_t count = size_t(problem.m) * size_t(problem.k);  // gathered[source][m/P][k]
    const uint64_t seed = tensor_seed(run_seed, shape_index, 0, 0, kPreset);
    const uint64_t scales_seed = tensor_seed(run_seed, shape_index, 0, 0, kPresetScales);
    for (int parity = 0; parity < 2; ++parity) {
      void* gathered = parity_data(*c, 0, parity);
      if (problem.dtype == DType::kE4M3) {
        fill_random_e4m3(static_cast<uint8_t*>(gathered), count, seed, gpu.stream);
        if (gathers_scales(problem)) {
          fill_random_scales(gathered_scales(*c, problem, parity), scale_shapes(gemm(problem)).a.count(), scales_seed,
                             gpu.stream);
        }
      } else {
        fill_random_bf16(static_cast<bf16*>(gathered), count, seed, gpu.stream);
      }
    }
    check_op(preset_peer_blocks(c, 0, problem));
  }

  // Rank 0 on input set `set`: its block of X is the first m/P rows of the set's A (E4M3: its rows'
  // scales the first m/P rows of the set's, or the set's one scale).
  static void run(const LocalCommunicator& comm, const OpProblem& problem, const GemmSets& sets,
                  const std::vector<DeviceBuffer>& out, int set, cudaStream_t stream, const ConfigOverrides& overrides,
                  PushTimeline* = nullptr) {
    const void* x = sets.a[set].get();
    const void* w = sets.w[set].get();
    void* y = out[set].get();
    void* gathered = nullptr;
    const InputScales scales = sets.scales(set);
    check_op(
        launch_all_gather(comm.get(), problem, {0}, &x, &w, nullptr, &y, &gathered, &stream, overrides, &scales));
  }

  // The FP32 reference of the gathered X rank 0 multiplied: its own rows of A, then the preset blocks;
  // E4M3 dequantized with the rows' scales likewise (rowwise and blockwise: its own from the set's, the
  // peers' preset; tensorwise: X_0's one scale serves every row).
  static void reference(Gpu& gpu, const LocalCommunicator& comm, const OpProblem& problem, const GemmSets& sets,
                        float* ref) {
    const size_t element = size_t(element_bytes(problem.dtype));
    const size_t block = size_t(problem.rows_per_rank()) * size_t(problem.k) * element;  // bytes
    const size_t total = size_t(problem.m) * size_t(problem.k) * element;
    DeviceBuffer gathered(gpu.device, total);
    TESTING_CHECK(cudaMemcpyAsync(gathered.get(), sets.a[0].get(), block, cudaMemcpyDeviceToDevice, gpu.stream));
    // gathered[parity 0][source][m/P][k]: the blocks of sources 1 .. P-1 follow source 0's slot.
    const uint8_t* preset = static_cast<const uint8_t*>(parity_data(*comm.get(), 0, 0));
    TESTING_CHECK(cudaMemcpyAsync(gathered.as<uint8_t>() + block, preset + block, total - block,
                                  cudaMemcpyDeviceToDevice, gpu.stream));
    InputScales scales = sets.scales(0);
    DeviceBuffer row_scales;
    if (gathers_scales(problem)) {
      // scales[parity 0][source][m/P][1 or k/128] likewise.
      const ScaleShape shape = scale_shapes(gemm(problem)).a;
      const size_t own = size_t(problem.rows_per_rank()) * size_t(shape.cols);
      row_scales = DeviceBuffer(gpu.device, shape.count() * sizeof(float));
      TESTING_CHECK(cudaMemcpyAsync(row_scales.get(), scales.a, own * sizeof(float), cudaMemcpyDeviceToDevice,
                                    gpu.stream));
      TESTING_CHECK(cudaMemcpyAsync(row_scales.as<float>() + own, gathered_scales(*comm.get(), problem, 0) + own,
                                    (shape.count() - own) * sizeof(float), cudaMemcpyDeviceToDevice, gpu.stream));
      scales.a = row_scales.as<const float>();
    }
    if (problem.dtype == DType::kE4M3) {
      reference_gemm_e4m3(gemm(problem), gathered.as<uint8_t>(), sets.w[0].as<uint8_t>(), scales, ref, gpu.stream);
    } else {
      reference_gemm(gemm(problem), gathered.as<bf16>(), sets.w[0].as<bf16>(), ref, gpu.stream);
    }
    TESTING_CHECK(cudaStreamSynchronize(gpu.stream));  // before `gathered` and `row_scales` are freed
  }
};

// The timed calls, in the loop's order.
std::vector<TimedCall> proxy_calls(bool compare) {
  std::vector<TimedCall> calls = {
      {"cublas", "cublas", "cub"}, {"gemm", "gemm", "gemm"}, {"fused_solo", "fused_solo", "solo"}};
  if (compare) calls.push_back({"fused_solo_b", "solo_b", "solo_b", /*variant=*/true});
  return calls;
}

std::vector<Column> proxy_columns(const Options& options, bool timeline) {
  std::vector<Column> columns = shape_columns();
  columns.push_back({"fused_over_gemm", "fused/gemm", 10, Format::kFixed, 3});
  if (options.compare) columns.push_back({"fused_b_over_gemm", "b/gemm", 7, Format::kFixed, 3});
  add_call_columns(columns, proxy_calls(options.compare.has_value()), options.separate_loops);
  if (timeline) {
    columns.insert(columns.end(), {
        {"tl_share_25", "push@25%", 8, Format::kFixed, 3},
        {"tl_share_50", "push@50%", 8, Format::kFixed, 3},
        {"tl_share_75", "push@75%", 8, Format::kFixed, 3},
        {"tl_last_push", "last_push", 9, Format::kFixed, 3},
        {"tl_call_us", "tl_call_us", 10, Format::kFixed, 1, false},
        {"tl_pushes", "tl_pushes", 9, Format::kInteger, 0, false},
        {"tl_pushed_bytes", "tl_bytes", 12, Format::kInteger, 0, false},
        {"tl_dropped", "tl_dropped", 10, Format::kInteger, 0, false},
        {"tl_first_push", "first_push", 10, Format::kFixed, 4, false},
        {"tl_last_own", "last_own", 8, Format::kFixed, 4, false},
        {"tl_bins", "tl_bins", 0, Format::kText, 0, false},
    });
  }
  add_loop_sensor_columns(columns);
  if (options.check) add_error_columns(columns, "solo", "solo");
  add_outcome_columns(columns, options.check);
  return columns;
}

// Rank 0 once on input set 0 into a poisoned output, against the op's FP32 reference.
template <class Op>
ErrorSums check_solo(Gpu& gpu, const LocalCommunicator& comm, const typename Op::OpProblem& problem,
                     const GemmSets& sets, const std::vector<DeviceBuffer>& out, const ConfigOverrides& overrides) {
  const size_t count = Op::out_count(problem);
  poison_bf16(out[0].as<bf16>(), count, gpu.stream);
  Op::run(comm, problem, sets, out, 0, gpu.stream, overrides);
  TESTING_CHECK(cudaStreamSynchronize(gpu.stream));
  comm.check_status();
  DeviceBuffer ref(gpu.device, count * sizeof(float));
  Op::reference(gpu, comm, problem, sets, ref.as<float>());
  return measure_error(out[0].as<bf16>(), ref.as<float>(), count, gpu.stream);
}

// Events a recorded call may store: 16 MB of them, more than the largest sweep shape's hand-offs.
constexpr uint32_t kTimelineCapacity = 1u << 20;

// One more call of rank 0 on input set 0, its pushes recorded (after the timed loop: the timed
// calls record nothing), summed up into the row's tl_* columns.
void record_timeline(Gpu& gpu, const LocalCommunicator& comm, const Problem& problem, const GemmSets& sets,
                     const std::vector<DeviceBuffer>& out, const ConfigOverrides& overrides, Row& row) {
  DeviceBuffer events(gpu.device, size_t(kTimelineCapacity) * sizeof(PushEvent));
  DeviceBuffer header(gpu.device, sizeof(PushTimeline));
  PushTimeline timeline{~0ull, 0, 0, kTimelineCapacity, events.as<PushEvent>()};
  TESTING_CHECK(cudaMemcpyAsync(header.get(), &timeline, sizeof(timeline), cudaMemcpyHostToDevice, gpu.stream));
  ReduceScatterOp::run(comm, problem, sets, out, 0, gpu.stream, overrides, header.as<PushTimeline>());
  TESTING_CHECK(cudaMemcpyAsync(&timeline, header.get(), sizeof(timeline), cudaMemcpyDeviceToHost, gpu.stream));
  TESTING_CHECK(cudaStreamSynchronize(gpu.stream));
  std::vector<PushEvent> recorded(std::min(timeline.count, kTimelineCapacity));
  TESTING_CHECK(cudaMemcpy(recorded.data(), events.get(), recorded.size() * sizeof(PushEvent), cudaMemcpyDeviceToHost));
  comm.check_status();

  const TimelineSummary s = summarize_timeline(timeline.start_ns, timeline.end_ns, recorded, timeline.count, 0);
  row["tl_call_us"] = s.call_us;
  row["tl_pushes"] = double(s.pushes);
  row["tl_pushed_bytes"] = s.pushed_bytes;
  row["tl_dropped"] = double(s.dropped);
  row["tl_share_25"] = s.share[0];
  row["tl_share_50"] = s.share[1];
  row["tl_share_75"] = s.share[2];
  row["tl_first_push"] = s.first_push;
  row["tl_last_push"] = s.last_push;
  if (s.last_own >= 0) row["tl_last_own"] = s.last_own;
  row["tl_bins"] = bins_text(s.bins);
}

template <class Op>
Row run_shape(GpuSet& gpus, const Options& options, const Shape& shape, size_t shape_index, Report& report) {
  Gpu& gpu = gpus[0];
  const typename Op::OpProblem problem = Op::problem(shape, options);
  const Problem gemm = Op::gemm(problem);
  Row row = shape_row(shape);

  // The communicator first: its buffers come out of the rotation's budget.
  Outcome outcome;
  LocalCommunicator comm;
  bool solo_ok = attempt(
      [&] {
        comm.create(std::vector<int>(problem.world_size, gpu.device), problem);
        Op::preset(comm, problem, gpu, *options.seed, shape_index);
        // NOTE: the communicator's own setup and the preset are not on gpu.stream: wait for all of it.
        TESTING_CHECK(cudaDeviceSynchronize());
      },
      &outcome.failure);

  // The GEMM's input sets and the solo call's outputs, rotated alike.
  const size_t out_count = Op::out_count(problem);
  const GemmSets sets = make_gemm_sets(gpu, gemm, out_count * sizeof(bf16), *options.seed, shape_index);
  const int num_sets = sets.num_sets;
  const std::vector<DeviceBuffer> out = poisoned_bf16_sets(gpu, out_count, num_sets);
  gpus.synchronize();

  if (options.check && solo_ok) {
    ErrorSums solo;
    solo_ok = attempt([&] { solo = check_solo<Op>(gpu, comm, problem, sets, out, options.overrides); },
                      &outcome.failure);
    if (solo_ok && options.compare) {
      // The compared variant computes the same output, within the same bound.
      ErrorSums solo_b;
      solo_ok = attempt([&] { solo_b = check_solo<Op>(gpu, comm, problem, sets, out, *options.compare); },
                        &outcome.failure);
      solo.merge(solo_b);
    }
    if (solo_ok) {
      const ErrorStats stats = solo.stats();
      set_errors(row, "solo", stats);
      const bool pass = stats.max_rel <= kMaxRelBound && stats.norm_rel <= kNormRelBound;  // false for NaN
      row["rule"] = std::string(pass ? "pass" : "FAIL");
      outcome.rule_failed = !pass;
      outcome.wrong = solo.num_nonfinite;
    }
  }

  const LaunchFn cublas_call = [&](int i) { cublas_on_set(gpu, gemm, sets, rotation_set(i, num_sets)); };
  std::vector<LaunchFn> calls{cublas_call, [&](int i) {
                                ours_on_set(gpu, gemm, sets, rotation_set(i, num_sets), options.overrides);
                              }};
  if (solo_ok) {
    calls.push_back(
        [&](int i) { Op::run(comm, problem, sets, out, rotation_set(i, num_sets), gpu.stream, options.overrides); });
    if (options.compare) {
      calls.push_back(
          [&](int i) { Op::run(comm, problem, sets, out, rotation_set(i, num_sets), gpu.stream, *options.compare); });
    }
  }
  // Timed together (time_loop); cuBLAS alone where one of ours fails. The compared fused calls trade
  // places every other pass (loop_order.h): the second of the two finds the preset partials in L2.
  TimingOptions timing = timing_options(options);
  if (calls.size() == 4) timing.alternate = AlternatePair{2, 3};
  LoopTiming loop;
  const bool ours_ok = attempt(
      [&] {
        loop = time_loop(gpus, timing, calls);
        if (solo_ok) comm.check_status();
      },
      &outcome.failure);
  if (!ours_ok) {
    timing.alternate.reset();
    loop = time_loop(gpus, timing, {cublas_call});
  }
  const std::vector<TimedCall> timed = proxy_calls(options.compare.has_value());
  for (size_t i = 0; i < loop.launches.size(); ++i) set_call(row, timed[i], loop, i, problem.flops_per_rank());
  if (loop.launches.size() > 2) {
    row["fused_over_gemm"] = loop.launches[2].median_ms / loop.launches[1].median_ms;
    if (options.compare) row["fused_b_over_gemm"] = loop.launches[3].median_ms / loop.launches[1].median_ms;
  }
  set_loop_sensors(row, loop.sensors);
  if constexpr (Op::kHasTimeline) {
    if (options.timeline && solo_ok && ours_ok) {
      attempt([&] { record_timeline(gpu, comm, problem, sets, out, options.overrides, row); }, &outcome.failure);
    }
  }
  if (comm.get() != nullptr) attempt([&] { comm.destroy(); }, &outcome.failure);
  finish_row(row, report, options, outcome, out_count, num_sets);
  return row;
}

template <class Op>
void run_proxy_of(const Options& options, Report& report) {
  const std::vector<Shape> shapes = op_shapes(options);
  const bool timeline = Op::kHasTimeline && options.timeline;
  GpuSet gpus(1, /*with_nccl=*/false);
  report.set_columns(proxy_columns(options, timeline));
  report.add_note(std::string("op ") + Op::kName + ", GPU 0 only: rank 0 of P = " + std::to_string(options.tp) +
                  " emulated ranks runs alone on the full grid, its incoming data preset" +
                  (Op::kHasTimeline ? "" : "; shapes M, N/P, K") + "; times in ms: median of " +
                  std::to_string(options.iters) + " iterations after " + std::to_string(options.warmup) +
                  " warm-up, the calls " + call_order(options) + "; A and W rotate over the input sets, the preset "
                  "buffers do not");
  char target[64];
  std::snprintf(target, sizeof(target), "target fused/gemm <= %.2f", Op::kTargetRatio);
  report.add_note(std::string(Op::kHasTimeline ? "T_gemm = tpfuse::gemm, T_fused_solo = rank 0's fused call"
                                               : "T_gemm = tpfuse::gemm on the gathered X (M x K), T_fused_solo = "
                                                 "rank 0's all_gather_gemm") +
                  "; " + target + "; overrides " + options.overrides.to_string() +
                  (options.compare ? "; T_solo_b: rank 0's fused call with " + options.compare->to_string() : ""));
  report.add_note(timing_columns_note(options, gpus.sensors(), /*multi_gpu=*/false));
  if (timeline) {
    report.add_note("push timeline (--timeline): one more call of rank 0 after the timed loop, each push's issue "
                    "recorded by the sending thread (%globaltimer); push@25/50/75%: the share of the pushed bytes "
                    "issued by 25/50/75% of that call (first CTA's start to last CTA's end), last_push: the last "
                    "push's issue as a fraction of it; JSON: tl_bins, the pushed bytes' shares over 100 equal "
                    "parts of [start, last push], the input of bench/projection.py");
  } else if (options.timeline) {
    report.add_note("--timeline: the push timeline is the reduce-scatter's only (--op rs); none recorded");
  }
  if (options.check) {
    report.add_note("rule: rank 0's output against its FP32 reference (with the preset data): max_rel <= 1/128 and "
                    "L2 rel <= 1/256 (one BF16 rounding is at most 1/256)");
  }
  report.print_header();

  const std::vector<Row> rows = run_shapes(shapes.size(), gpus, report, [&](size_t i) {
    return run_shape<Op>(gpus, options, shapes[i], i, report);
  });

  const ColumnSpread ratio = column_spread(rows, "fused_over_gemm");
  const int num_meeting = ratio.count_if([](double value) { return value <= Op::kTargetRatio; });
  std::string line = options.mode + ": fused/gemm on " + std::to_string(ratio.count()) + " of " +
                     std::to_string(shapes.size()) + " shapes";
  Row summary = {{"shapes", double(shapes.size())},
                 {"fused_ran", double(ratio.count())},
                 {"meet_target", double(num_meeting)}};
  if (!ratio.empty()) {
    char text[128];
    std::snprintf(text, sizeof(text), ": max %.3f, geomean %.3f; %d meet <= %.2f", ratio.max(), ratio.geomean(),
                  num_meeting, Op::kTargetRatio);
    line += text;
    summary["fused_over_gemm_max"] = ratio.max();
    summary["fused_over_gemm_geomean"] = ratio.geomean();
    add_geomean(column_spread(rows, "fused_b_over_gemm"), "fused_b_over_gemm", "b/gemm", /*with_max=*/true, line,
                summary);
  }
  OutcomeTally(rows).summarize(options, line, summary);
  report.set_summary(line, summary);
}

}  // namespace

void run_proxy(const Options& options, Report& report) {
  if (options.op == FusedOp::kAllGather) {
    run_proxy_of<AllGatherOp>(options, report);
  } else {
    run_proxy_of<ReduceScatterOp>(options, report);
  }
}

}  // namespace tpfuse::bench
