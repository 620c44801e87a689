// The benchmark's --overrides and --compare: the library's ConfigOverrides from the command line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli.h"

namespace tpfuse::bench {
namespace {

const std::vector<std::string> kModes = {"gemm", "proxy"};

TEST(BenchOverrides, ParsedIntoTheLibrarysStruct) {
  const ParseResult r =
      parse_args({"--mode", "proxy", "--overrides", "own_lag=0,partial_rounds=2", "--compare=block_n=192"}, kModes);
  ASSERT_EQ(r.outcome, ParseOutcome::kRun) << r.error;
  EXPECT_EQ(r.options.overrides.own_lag, 0);
  EXPECT_EQ(r.options.overrides.partial_rounds, 2);
  EXPECT_EQ(r.options.overrides.block_n, 0) << "fields not named keep the config's choice";
  const ParseResult idle = parse_args({"--mode", "proxy", "--overrides", "idle_copiers=0"}, kModes);
  ASSERT_EQ(idle.outcome, ParseOutcome::kRun) << idle.error;
  EXPECT_EQ(idle.options.overrides.idle_copiers, 0);
  EXPECT_EQ(idle.options.overrides.to_string(), "idle_copiers=0");
  const ParseResult staged = parse_args({"--mode", "proxy", "--compare", "register_epilogue=0"}, kModes);
  ASSERT_EQ(staged.outcome, ParseOutcome::kRun) << staged.error;
  EXPECT_EQ(staged.options.compare->register_epilogue, 0);
  EXPECT_EQ(staged.options.compare->to_string(), "register_epilogue=0");
  const ParseResult tiled = parse_args({"--mode", "gemm", "--compare", "swap_ab=0"}, kModes);
  ASSERT_EQ(tiled.outcome, ParseOutcome::kRun) << tiled.error;
  ASSERT_TRUE(tiled.options.compare.has_value());
  EXPECT_EQ(tiled.options.compare->swap_ab, 0);
  EXPECT_EQ(tiled.options.compare->to_string(), "swap_ab=0");
  ASSERT_TRUE(r.options.compare.has_value());
  EXPECT_EQ(r.options.compare->block_n, 192);
  EXPECT_EQ(r.options.compare->to_string(), "block_n=192");
  const ParseResult none = parse_args({"--overrides", "none"}, kModes);
  ASSERT_EQ(none.outcome, ParseOutcome::kRun) << none.error;
  EXPECT_EQ(none.options.overrides.to_string(), "none");
  EXPECT_FALSE(none.options.compare.has_value());
}

TEST(BenchOverrides, BadOnesAreNamed) {
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--overrides", "lag=3"}, "'lag=3' is not FIELD=VALUE"},
           {{"--overrides", "own_lag"}, "'own_lag' is not FIELD=VALUE"},
           {{"--overrides", "own_lag=x"}, "'x' is not an integer"},
           {{"--compare", "block_n=100"}, "overrides.block_n = 100"},
           {{"--compare", "partial_rounds=-2"}, "--compare"},
           {{"--compare", "swap_ab=2"}, "overrides.swap_ab = 2"},
           {{"--overrides"}, "--overrides: missing value"},
       }) {
    const ParseResult r = parse_args(args, kModes);
    EXPECT_EQ(r.outcome, ParseOutcome::kError) << args[0];
    EXPECT_NE(r.error.find(message), std::string::npos) << r.error;
  }
}

}  // namespace
}  // namespace tpfuse::bench
