#include "timeline.h"

#include <algorithm>
#include <cstdio>

namespace tpfuse::bench {

TimelineSummary summarize_timeline(uint64_t start_ns, uint64_t end_ns, const std::vector<PushEvent>& events,
                                   uint32_t count, int rank) {
  TimelineSummary s;
  s.bins.assign(kTimelineBins, 0.0);
  s.dropped = count > events.size() ? count - events.size() : 0;
  if (end_ns <= start_ns) return s;
  const double call_ns = double(end_ns - start_ns);
  s.call_us = call_ns * 1e-3;
  const auto fraction = [&](const PushEvent& e) { return double(e.issue_ns - std::min(e.issue_ns, start_ns)) / call_ns; };

  double first = 1, last = 0;
  for (const PushEvent& e : events) {
    const double t = fraction(e);
    if (e.owner == rank) {
      s.last_own = std::max(s.last_own, t);
      continue;
    }
    s.pushed_bytes += e.bytes;
    ++s.pushes;
    first = std::min(first, t);
    last = std::max(last, t);
    for (int q = 0; q < 3; ++q) {
      if (t <= 0.25 * (q + 1)) s.share[q] += e.bytes;
    }
  }
  if (s.pushes == 0) return s;
  s.first_push = first;
  s.last_push = last;
  for (const PushEvent& e : events) {
    if (e.owner == rank) continue;
    const int bin = last > 0 ? std::min(kTimelineBins - 1, int(fraction(e) / last * kTimelineBins)) : 0;
    s.bins[bin] += e.bytes / s.pushed_bytes;
  }
  for (double& share : s.share) share /= s.pushed_bytes;
  return s;
}

std::string bins_text(const std::vector<double>& bins) {
  std::string text;
  for (const double share : bins) {
    char cell[24];
    std::snprintf(cell, sizeof(cell), "%s%.5f", text.empty() ? "" : " ", share);
    text += cell;
  }
  return text;
}

}  // namespace tpfuse::bench
