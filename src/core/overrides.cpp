#include "tpfuse/overrides.h"

#include <string>

namespace tpfuse {

std::string ConfigOverrides::to_string() const {
  std::string s;
  auto add = [&s](const char* name, int value) { s += (s.empty() ? "" : " ") + std::string(name) + "=" + std::to_string(value); };
  if (block_n != 0) add("block_n", block_n);
  if (group_rows != 0) add("group_rows", group_rows);
  if (split_k != 0) add("split_k", split_k);
  if (swap_ab != -1) add("swap_ab", swap_ab);
  if (own_lag != -1) add("own_lag", own_lag);
  if (partial_rounds != -1) add("partial_rounds", partial_rounds);
  if (shared_tiles != -1) add("shared_tiles", shared_tiles);
  if (register_epilogue != -1) add("register_epilogue", register_epilogue);
  if (idle_copiers != -1) add("idle_copiers", idle_copiers);
  return s.empty() ? "none" : s;
}

Status validate(const ConfigOverrides& o) {
  constexpr int kMaxRounds = 1 << 30;
  constexpr int kMaxSplitK = 1024;  // more than any device's SMs: a call's steps are at most its SMs
  if (o.block_n != 0 && o.block_n != 64 && o.block_n != 128 && o.block_n != 192 && o.block_n != 256) {
    return Status::InvalidArgument("overrides.block_n = " + std::to_string(o.block_n) +
                                   " must be 64, 128, 192 or 256 (or 0: the config's choice)");
  }
  if (o.group_rows < 0) {
    return Status::InvalidArgument("overrides.group_rows = " + std::to_string(o.group_rows) +
                                   " must be positive (or 0: the config's choice)");
  }
  if (o.split_k < 0 || o.split_k > kMaxSplitK) {
    return Status::InvalidArgument("overrides.split_k = " + std::to_string(o.split_k) +
                                   " must be 0 (the config's choice), 1 (never split K) or a number of splits 2.." +
                                   std::to_string(kMaxSplitK));
  }
  if (o.swap_ab < -1 || o.swap_ab > 1) {
    return Status::InvalidArgument("overrides.swap_ab = " + std::to_string(o.swap_ab) +
                                   " must be 1 (wherever m <= 64), 0 (never) or -1 (the config's choice)");
  }
  if (o.own_lag < -1 || o.own_lag > kMaxRounds) {
    return Status::InvalidArgument("overrides.own_lag = " + std::to_string(o.own_lag) + " must be a number of rounds in 0.." +
                                   std::to_string(kMaxRounds) + " (or -1: the config's choice)");
  }
  if (o.partial_rounds < -1) {
    return Status::InvalidArgument("overrides.partial_rounds = " + std::to_string(o.partial_rounds) +
                                   " must be a number of rounds >= 0 (or -1: the config's choice)");
  }
  if (o.shared_tiles < -1 || o.shared_tiles > 1) {
    return Status::InvalidArgument("overrides.shared_tiles = " + std::to_string(o.shared_tiles) +
                                   " must be 1 (share), 0 (never) or -1 (the config's choice)");
  }
  if (o.register_epilogue < -1 || o.register_epilogue > 1) {
    return Status::InvalidArgument("overrides.register_epilogue = " + std::to_string(o.register_epilogue) +
                                   " must be 1 (from registers), 0 (staged) or -1 (the config's choice)");
  }
  if (o.idle_copiers < -1 || o.idle_copiers > 1) {
    return Status::InvalidArgument("overrides.idle_copiers = " + std::to_string(o.idle_copiers) +
                                   " must be 1 (whenever a CTA has no tile), 0 (never) or -1 (the config's choice)");
  }
  return Status::Ok();
}

}  // namespace tpfuse
