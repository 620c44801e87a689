// The benchmark's command line: defaults, the docs/SPEC.md sweep, explicit shapes, and errors that name the
// bad option instead of running.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cli.h"

namespace tpfuse::bench {
namespace {

const std::vector<std::string> kModes = {"baseline", "gemm", "proxy", "fused"};

TEST(BenchCli, DefaultsAreTheSpecSweep) {
  const ParseResult r = parse_args({}, kModes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.iters, 200);
  EXPECT_GT(r.options.warmup, 0);
  EXPECT_EQ(r.options.tp, 8);
  EXPECT_TRUE(r.options.gate);
  EXPECT_TRUE(r.options.sensors);
  EXPECT_FALSE(r.options.separate_loops);
  ASSERT_EQ(r.options.shapes.size(), 16u);
  // M in {512, 2048, 8192, 32768} for each projection; K per rank = K_total / 8.
  int down_proj = 0;
  for (const Shape& s : r.options.shapes) {
    EXPECT_TRUE(s.m == 512 || s.m == 2048 || s.m == 8192 || s.m == 32768) << s.m;
    if (s.n == 8192 && s.k_per_rank == 28672 / 8) {
      EXPECT_EQ(s.projection, "llama3-70b.down_proj");
      ++down_proj;
    }
  }
  EXPECT_EQ(down_proj, 4);
}

TEST(BenchCli, ExplicitShapesAndOptions) {
  const ParseResult r = parse_args({"--mode", "proxy", "--iters=50", "--warmup", "3", "--check", "--layout", "nk",
                                    "--shapes", "1024,8192,1024;64,264,72", "--tp", "4", "--no-sensors", "--separate-loops"},
                                   kModes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.mode, "proxy");
  EXPECT_EQ(r.options.iters, 50);
  EXPECT_EQ(r.options.warmup, 3);
  EXPECT_TRUE(r.options.check);
  EXPECT_FALSE(r.options.sensors);
  EXPECT_TRUE(r.options.separate_loops);
  EXPECT_EQ(r.options.weight_layout, WeightLayout::kNxK);
  ASSERT_EQ(r.options.shapes.size(), 2u);
  EXPECT_EQ(r.options.shapes[1].m, 64);
  EXPECT_EQ(r.options.shapes[1].n, 264);
  EXPECT_EQ(r.options.shapes[1].k_per_rank, 72);
}

TEST(BenchCli, BadArgumentsAreNamed) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--mode", "nonsense"}, "--mode"},
      {{"--iters", "zero"}, "--iters"},
      {{"--layout", "xy"}, "--layout"},
      {{"--shapes", "1024,8192"}, "--shapes"},
      {{"--frobnicate"}, "--frobnicate"},
      {{"--no-sensors=1"}, "--no-sensors"},
      {{"--separate-loops=yes"}, "--separate-loops"},
  };
  for (const auto& [args, name] : bad) {
    const ParseResult r = parse_args(args, kModes);
    EXPECT_EQ(r.outcome, ParseOutcome::kError) << args[0];
    EXPECT_NE(r.error.find(name), std::string::npos) << "error \"" << r.error << "\" does not name " << name;
  }
  EXPECT_EQ(parse_args({"--help"}, kModes).outcome, ParseOutcome::kHelp);
}

// --compare split_k=1 times the unsplit GEMM beside the config's split in one run.
TEST(BenchCli, OverridesByName) {
  ConfigOverrides o;
  std::string error;
  ASSERT_TRUE(parse_overrides("split_k=1,group_rows=4", &o, &error)) << error;
  EXPECT_EQ(o.split_k, 1);
  EXPECT_EQ(o.group_rows, 4);
  EXPECT_FALSE(parse_overrides("split_k=-1", &o, &error));
  EXPECT_NE(error.find("overrides.split_k = -1"), std::string::npos) << error;
  EXPECT_FALSE(parse_overrides("splits=2", &o, &error));
  EXPECT_NE(error.find("split_k"), std::string::npos) << "the error lists the fields: " << error;
}

// One proxy mode for both ops: --op, and --mode ag-proxy as its alias; --timeline for the push timeline.
TEST(BenchCli, ProxyOpAndTimeline) {
  const std::vector<std::string> modes = {"proxy", "ag-proxy", "gemm"};
  ParseResult r = parse_args({"--mode", "proxy", "--timeline"}, modes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.op, FusedOp::kReduceScatter);
  EXPECT_TRUE(r.options.timeline);
  r = parse_args({"--op", "ag", "--mode", "proxy"}, modes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.op, FusedOp::kAllGather);
  EXPECT_FALSE(r.options.timeline);
  r = parse_args({"--mode", "ag-proxy"}, modes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.op, FusedOp::kAllGather);
  EXPECT_STREQ(op_flag(r.options.op), "ag");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--mode", "ag-proxy", "--op", "rs"}, {"--mode", "gemm", "--op", "ag"}, {"--mode", "proxy", "--op", "xy"},
           {"--timeline=1"}}) {
    r = parse_args(args, modes);
    EXPECT_EQ(r.outcome, ParseOutcome::kError) << args.back();
    EXPECT_NE(r.error.find(args.back() == "--timeline=1" ? "--timeline" : "--op"), std::string::npos) << r.error;
  }
}

// One multi-GPU mode for both ops, as the proxy: mode fused takes --op, and --mode ag is its alias.
TEST(BenchCli, FusedOp) {
  const std::vector<std::string> modes = {"fused", "ag", "proxy", "baseline"};
  ParseResult r = parse_args({"--mode", "fused"}, modes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.op, FusedOp::kReduceScatter);
  r = parse_args({"--mode", "fused", "--op", "ag"}, modes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.op, FusedOp::kAllGather);
  r = parse_args({"--mode", "ag", "--check"}, modes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.mode, "ag") << "the mode as given, for the record";
  EXPECT_EQ(r.options.op, FusedOp::kAllGather);
  r = parse_args({"--mode", "ag", "--op", "ag"}, modes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--mode", "ag", "--op", "rs"}, {"--mode", "baseline", "--op", "ag"}}) {
    r = parse_args(args, modes);
    EXPECT_EQ(r.outcome, ParseOutcome::kError) << args[1];
    EXPECT_NE(r.error.find("--op"), std::string::npos) << r.error;
  }
}

// --fp8: E4M3 inputs for modes gemm and proxy (either op), N x K weights, promoted unless --fast-accum;
// blockwise (either op) promoted only, on shapes of M a multiple of 4 and K per rank of 128.
TEST(BenchCli, Fp8) {
  const ParseResult rowwise = parse_args({"--mode", "proxy", "--layout", "nk", "--fp8", "rowwise"}, kModes);
  ASSERT_EQ(rowwise.outcome, ParseOutcome::kRun) << rowwise.error;
  EXPECT_EQ(rowwise.options.scaling, Scaling::kRowwise);
  EXPECT_EQ(rowwise.options.accumulation, Accumulation::kPromoted);
  const ParseResult fast = parse_args({"--mode", "gemm", "--layout", "nk", "--fp8", "tensorwise", "--fast-accum"}, kModes);
  ASSERT_EQ(fast.outcome, ParseOutcome::kRun) << fast.error;
  EXPECT_EQ(fast.options.scaling, Scaling::kTensorwise);
  EXPECT_EQ(fast.options.accumulation, Accumulation::kFast);
  EXPECT_EQ(parse_args({}, kModes).options.scaling, Scaling::kNone);
  EXPECT_NE(usage(kModes).find("blockwise (A's per row and 128 of K, W's per 128 x 128 block"), std::string::npos);
  for (const auto& [args, op] : std::vector<std::pair<std::vector<std::string>, FusedOp>>{
           {{"--mode", "gemm", "--layout", "nk", "--fp8", "blockwise"}, FusedOp::kReduceScatter},
           {{"--mode", "proxy", "--layout", "nk", "--fp8", "blockwise"}, FusedOp::kReduceScatter},
           {{"--mode", "proxy", "--op", "rs", "--layout", "nk", "--fp8", "blockwise"}, FusedOp::kReduceScatter},
           {{"--mode", "proxy", "--op", "ag", "--layout", "nk", "--fp8", "blockwise"}, FusedOp::kAllGather},
           {{"--mode", "ag-proxy", "--layout", "nk", "--fp8", "blockwise"}, FusedOp::kAllGather}}) {
    const ParseResult blockwise = parse_args(args, {"gemm", "proxy", "ag-proxy"});
    ASSERT_EQ(blockwise.outcome, ParseOutcome::kRun) << args[1] << ": " << blockwise.error;
    EXPECT_EQ(blockwise.options.scaling, Scaling::kBlockwise);
    EXPECT_EQ(blockwise.options.accumulation, Accumulation::kPromoted);
    EXPECT_EQ(blockwise.options.op, op) << args[1];
  }
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--mode", "proxy", "--op", "ag", "--layout", "nk", "--fp8", "rowwise", "--fast-accum"},
           {"--mode", "ag-proxy", "--layout", "nk", "--fp8", "rowwise", "--fast-accum"}}) {
    const ParseResult ag = parse_args(args, {"proxy", "ag-proxy"});
    ASSERT_EQ(ag.outcome, ParseOutcome::kRun) << args[1] << ": " << ag.error;
    EXPECT_EQ(ag.options.op, FusedOp::kAllGather);
    EXPECT_EQ(ag.options.scaling, Scaling::kRowwise);
    EXPECT_EQ(ag.options.accumulation, Accumulation::kFast);
  }
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--mode", "gemm", "--fp8", "rowwise"}, "--fp8: E4M3 weights are N x K (--layout nk)"},
           {{"--mode", "gemm", "--layout", "nk", "--fp8", "channelwise"},
            "--fp8: expected tensorwise, rowwise or blockwise, got 'channelwise'"},
           {{"--mode", "gemm", "--layout", "nk", "--fp8", "blockwise", "--fast-accum"},
            "--fast-accum: blockwise scales are promoted only"},
           {{"--mode", "ag-proxy", "--layout", "nk", "--fp8", "blockwise", "--fast-accum"},
            "--fast-accum: blockwise scales are promoted only"},
           {{"--mode", "proxy", "--op", "ag", "--layout", "nk", "--fp8", "blockwise", "--shapes",
             "512,1280,8192;512,1280,8200"},
            "--fp8 blockwise: shape 512,1280,8200 needs M a multiple of 4 and K per rank one of 128"},
           {{"--mode", "proxy", "--fp8", "blockwise"}, "--fp8: E4M3 weights are N x K (--layout nk)"},
           {{"--mode", "gemm", "--layout", "nk", "--fp8", "blockwise", "--shapes", "512,8192,1024;6,8192,1024"},
            "--fp8 blockwise: shape 6,8192,1024 needs M a multiple of 4 and K per rank one of 128"},
           {{"--mode", "proxy", "--layout", "nk", "--fp8", "blockwise", "--shapes", "512,8192,1088"},
            "--fp8 blockwise: shape 512,8192,1088 needs M a multiple of 4 and K per rank one of 128"},
           {{"--mode", "fused", "--layout", "nk", "--fp8", "rowwise"}, "--fp8: modes gemm and proxy only"},
           {{"--mode", "fused", "--op", "ag", "--layout", "nk", "--fp8", "rowwise"},
            "--fp8: modes gemm and proxy only"},
           {{"--mode", "proxy", "--op", "ag", "--fp8", "rowwise"}, "--fp8: E4M3 weights are N x K (--layout nk)"},
           {{"--mode", "gemm", "--fast-accum"}, "--fast-accum: only with --fp8"}}) {
    const ParseResult r = parse_args(args, {"baseline", "gemm", "proxy", "ag-proxy", "fused"});
    EXPECT_EQ(r.outcome, ParseOutcome::kError) << args.back();
    EXPECT_NE(r.error.find(message), std::string::npos) << r.error;
  }
}

// The sweep comes from python/tpfuse/shapes.json, as the Python benchmark's does.
TEST(BenchCli, SweepsFromTheShapeTable) {
  std::string error;
  const std::vector<Shape> column = all_gather_sweep_shapes(8, &error);
  ASSERT_EQ(column.size(), 16u) << error;
  EXPECT_EQ(column[0].projection, "llama3-70b.qkv_proj");
  EXPECT_EQ(column[0].n, 10240 / 8);
  EXPECT_EQ(projection_name(6144, 16384), "mixtral-8x22b.down_proj");
}

TEST(BenchCli, SweepNeedsTpToDivideK) {
  std::string error;
  EXPECT_EQ(sweep_shapes(8, &error).size(), 16u) << error;
  EXPECT_TRUE(sweep_shapes(5, &error).empty());
  EXPECT_FALSE(error.empty());
}

}  // namespace
}  // namespace tpfuse::bench
