#include "timeline.h"

#include <algorithm>
#include <cstdio>
#include <map>

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

#if TPFUSE_PROBE_E1 >= 1
ProbeSummary summarize_probe(uint64_t start_ns, uint64_t end_ns, const std::vector<ProbeEvent>& events,
                             uint32_t count) {
  ProbeSummary s;
  s.dropped = count > events.size() ? count - events.size() : 0;
  if (end_ns <= start_ns) return s;
  const double call_ns = double(end_ns - start_ns);
  // Each CTA's stamps, by kind and (consumer, step).
  struct Cta {
    const ProbeEvent* start = nullptr;
    const ProbeEvent* end = nullptr;
    std::map<uint32_t, const ProbeEvent*> k_end[2], wait_begin[2], wait_end[2], sweep_start, sweep_end;
  };
  std::map<int, Cta> ctas;
  for (const ProbeEvent& e : events) {
    Cta& c = ctas[e.cta];
    const int sub = e.sub & 1;
    switch (ProbeKind(e.kind)) {
      case ProbeKind::kCtaStart: c.start = &e; break;
      case ProbeKind::kCtaEnd: c.end = &e; break;
      case ProbeKind::kKLoopEnd: c.k_end[sub][e.step] = &e; break;
      case ProbeKind::kSweepStart: c.sweep_start[e.step] = &e; break;
      case ProbeKind::kSweepEnd: c.sweep_end[e.step] = &e; break;
      case ProbeKind::kWaitBegin: c.wait_begin[sub][e.step] = &e; break;
      case ProbeKind::kWaitEnd: c.wait_end[sub][e.step] = &e; break;
    }
  }
  double step_sum = 0, sweep_sum = 0, wait_sum = 0, tail_sum = 0;
  int steps = 0;
  for (const auto& [cta, c] : ctas) {
    if (c.start == nullptr || c.end == nullptr || c.end->clk <= c.start->clk) continue;
    ++s.ctas;
    const double ns_per_clk = double(c.end->ns - c.start->ns) / double(c.end->clk - c.start->clk);
    const auto t = [&](const ProbeEvent* e) { return double(int64_t(e->clk - c.start->clk)) * ns_per_clk; };
    double last_k = 0;
    for (int sub = 0; sub < 2; ++sub) {
      for (const auto& [step, e] : c.k_end[sub]) {
        last_k = std::max(last_k, t(e));
        const auto before = c.k_end[sub].find(step - 1);
        if (step > 0 && before != c.k_end[sub].end()) {
          step_sum += t(e) - t(before->second);
          ++steps;
        }
      }
    }
    if (last_k > 0) {
      const double tail = (t(c.end) - last_k) / call_ns;
      s.tail_max = std::max(s.tail_max, tail);
      tail_sum += tail;
    }
    for (const auto& [step, e] : c.sweep_end) {
      const auto start = c.sweep_start.find(step);
      if (start != c.sweep_start.end()) {
        const double d = t(e) - t(start->second);
        ++s.sweeps;
        sweep_sum += d;
        s.sweep_max_ns = std::max(s.sweep_max_ns, d);
      }
      // The first consumer to need this sweep: the earliest wait to stage the next step.
      double needed = -1;
      for (int sub = 0; sub < 2; ++sub) {
        const auto w = c.wait_begin[sub].find(step + 1);
        if (w != c.wait_begin[sub].end()) needed = needed < 0 ? t(w->second) : std::min(needed, t(w->second));
      }
      if (needed >= 0) {
        ++s.late_of;
        if (t(e) > needed) {
          ++s.late;
          s.late_max_ns = std::max(s.late_max_ns, t(e) - needed);
        }
      }
    }
    for (int sub = 0; sub < 2; ++sub) {
      for (const auto& [step, b] : c.wait_begin[sub]) {
        const auto e = c.wait_end[sub].find(step);
        if (e == c.wait_end[sub].end()) continue;
        const double d = t(e->second) - t(b);
        ++s.waits;
        wait_sum += d;
        s.wait_max_ns = std::max(s.wait_max_ns, d);
        const auto k = c.k_end[sub].find(step), k_before = c.k_end[sub].find(step - 1);
        if (k != c.k_end[sub].end() && k_before != c.k_end[sub].end() && t(k->second) > t(k_before->second)) {
          s.wait_max_frac = std::max(s.wait_max_frac, d / (t(k->second) - t(k_before->second)));
        }
      }
    }
  }
  if (s.ctas > 0) s.tail_mean = tail_sum / s.ctas;
  if (steps > 0) s.step_ns = step_sum / steps;
  if (s.sweeps > 0) s.sweep_ns = sweep_sum / s.sweeps;
  if (s.waits > 0) s.wait_ns = wait_sum / s.waits;
  if (s.step_ns > 0) {
    s.sweep_frac = s.sweep_ns / s.step_ns;
    s.wait_frac = s.wait_ns / s.step_ns;
  }
  return s;
}
#endif

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
