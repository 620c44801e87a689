#include "core/env.h"

#include <cerrno>
#include <cstdlib>
#include <string>

namespace tpfuse {
namespace {

// A variable's value as an integer in [min, max]; `fallback` when unset.
Status read_int(const char* name, int64_t min, int64_t max, int64_t fallback, int64_t* value) {
  const char* text = std::getenv(name);
  if (text == nullptr) {
    *value = fallback;
    return Status::Ok();
  }
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || errno != 0 || parsed < min || parsed > max) {
    return Status::InvalidArgument(std::string(name) + " = '" + text + "' is not an integer in " +
                                   std::to_string(min) + ".." + std::to_string(max));
  }
  *value = parsed;
  return Status::Ok();
}

struct Setting {
  Status status;
  int64_t value = 0;
};

const Setting& debug_setting() {
  static const Setting setting = [] {
    Setting s;
    s.status = read_int("TPFUSE_DEBUG", 0, 1, 0, &s.value);
    return s;
  }();
  return setting;
}

}  // namespace

Status debug_logging(bool* enabled) {
  const Setting& s = debug_setting();
  *enabled = s.status.ok() && s.value == 1;
  return s.status;
}

bool debug_enabled() {
  bool enabled = false;
  return debug_logging(&enabled).ok() && enabled;
}

Status default_peer_timeout_ms(int64_t* ms) {
  static const Setting setting = [] {
    Setting s;
    s.status = read_int("TPFUSE_PEER_TIMEOUT_MS", 1, int64_t(1) << 40, 10000, &s.value);
    return s;
  }();
  *ms = setting.value;
  return setting.status;
}

}  // namespace tpfuse
