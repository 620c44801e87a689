// The library's two environment variables (src/core/env.h): read once, strictly. Each variable is
// set by one test only (CTest runs every test in a process of its own; the values are cached).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/env.h"

namespace tpfuse {
namespace {

TEST(Environment, MalformedDebugIsAnErrorNotSilence) {
  ::setenv("TPFUSE_DEBUG", "yes", 1);
  bool enabled = true;
  const Status s = debug_logging(&enabled);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("TPFUSE_DEBUG = 'yes' is not an integer in 0..1"), std::string::npos) << s.message();
  EXPECT_FALSE(enabled);
  EXPECT_FALSE(debug_enabled());
}

TEST(Environment, MalformedPeerTimeoutIsAnError) {
  ::setenv("TPFUSE_PEER_TIMEOUT_MS", "10s", 1);
  int64_t ms = 0;
  const Status s = default_peer_timeout_ms(&ms);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("TPFUSE_PEER_TIMEOUT_MS = '10s'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tpfuse
