// The push timeline's summary (bench/timeline.h): shares by quarter of the call, bins, own stores.
#include <gtest/gtest.h>

#include "timeline.h"

namespace tpfuse::bench {
namespace {

TEST(BenchTimeline, SharesByQuarterOfTheCall) {
  // A call of 1000 ns from 5000; pushes of 100 B at 100, 300, 550 and 800 ns; an own store at 900 ns.
  const std::vector<PushEvent> events = {
      {5100, 100, 1}, {5300, 100, 2}, {5550, 100, 3}, {5800, 100, 1}, {5900, 400, 0}};
  const TimelineSummary s = summarize_timeline(5000, 6000, events, 5, /*rank=*/0);
  EXPECT_DOUBLE_EQ(s.call_us, 1.0);
  EXPECT_EQ(s.pushes, 4);
  EXPECT_DOUBLE_EQ(s.pushed_bytes, 400);
  EXPECT_DOUBLE_EQ(s.share[0], 0.25);
  EXPECT_DOUBLE_EQ(s.share[1], 0.5);
  EXPECT_DOUBLE_EQ(s.share[2], 0.75);
  EXPECT_DOUBLE_EQ(s.first_push, 0.1);
  EXPECT_DOUBLE_EQ(s.last_push, 0.8);
  EXPECT_DOUBLE_EQ(s.last_own, 0.9);
  EXPECT_EQ(s.dropped, 0u);
  // Bins over [0, 0.8]: 0.1 -> 12, 0.3 -> 37, 0.55 -> 68, the last push in the last bin.
  ASSERT_EQ(int(s.bins.size()), kTimelineBins);
  EXPECT_DOUBLE_EQ(s.bins[12], 0.25);
  EXPECT_DOUBLE_EQ(s.bins[37], 0.25);
  EXPECT_DOUBLE_EQ(s.bins[68], 0.25);
  EXPECT_DOUBLE_EQ(s.bins[kTimelineBins - 1], 0.25);
}

TEST(BenchTimeline, DroppedEventsAndEmptyCalls) {
  const TimelineSummary s = summarize_timeline(0, 1000, {{500, 64, 1}}, 3, 0);
  EXPECT_EQ(s.dropped, 2u);
  EXPECT_EQ(s.pushes, 1);
  EXPECT_DOUBLE_EQ(s.bins[kTimelineBins - 1], 1.0);
  const TimelineSummary none = summarize_timeline(0, 1000, {}, 0, 0);
  EXPECT_EQ(none.pushes, 0);
  EXPECT_DOUBLE_EQ(none.last_own, -1);
  EXPECT_EQ(bins_text({0.5, 0.25}), "0.50000 0.25000");
}

}  // namespace
}  // namespace tpfuse::bench
