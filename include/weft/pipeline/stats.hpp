#pragma once
// What a schedule costs: its simulated step time given per-action costs, its bubble, the
// activation memory it holds and the bytes it moves.
//
// The simulation is validate()'s abstract model with durations: each rank runs its list in
// order; a compute action takes its cost; a send takes no time of the rank (it is posted, as
// an executor posts it early) and its message arrives p2p_latency + bytes / p2p_bandwidth
// later; a receive waits until then. Links are not shared, so messages never queue.
//
//   rank 0  F0 F1 F2 F3 .. .. B0 B1 B2 B3     GPipe, p = 2, m = 4, T_F = T_B = 1, no latency:
//   rank 1  .. F0 F1 F2 F3 B0 B1 B2 B3 ..     each rank idles (p-1)(T_F + T_B) = 2
//
// Costs are per microbatch for a rank's whole share of the model: with V chunks, an action
// of one chunk costs 1/V of it. In a schedule without a split backward, B is the whole
// backward and costs backward + weight.
//
// The bubble, in the two conventions in use:
//   bubble_over_ideal  (step time - ideal) / ideal, ideal being the busiest rank's compute:
//                      (p-1)/m for GPipe and 1F1B at equal costs (Narayanan et al. 2021),
//                      (p-1)/(m V) interleaved
//   idle_fraction      the ranks' idle time over the ranks' total time, p * step time:
//                      (p-1)/(m+p-1) for 1F1B
#include <weft/core/error.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/validate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace weft::pipeline {

/// The cost of each kind of action, in any unit of time (weft-schedule's trace reads them as
/// microseconds).
struct costs {
  double forward = 1;       // one microbatch forward through the rank's whole share of the model
  double backward = 1;      // its input gradient (B of a split schedule)
  double weight = 1;        // its weight gradient (W)
  double p2p_latency = 0;   // from a send to its receive, per message
  double p2p_bandwidth = 0; // bytes per unit of time; 0: messages cost their latency only
};

/// When each action of each rank runs, parallel to schedule::ranks; a receive's span is the
/// time its rank waits for the message.
struct timeline {
  std::vector<std::vector<double>> start;
  std::vector<std::vector<double>> end;
  double step_time = 0; // when the last rank finishes
};

/// How long a compute action of `s` takes under `c`.
constexpr double duration(const schedule& s, const costs& c, action_kind k) noexcept {
  const double v = static_cast<double>(s.chunks);
  switch (k) {
    case action_kind::forward: return c.forward / v;
    case action_kind::backward: return (s.split_backward ? c.backward : c.backward + c.weight) / v;
    case action_kind::weight: return c.weight / v;
    default: return 0;
  }
}

/// Validates `s`, then simulates one step of it under `c`.
inline timeline simulate(const schedule& s, const costs& c = {}) {
  const auto check = [](const char* what, double x) {
    if (!std::isfinite(x) || x < 0) {
      throw error("weft: pipeline simulate: the " + std::string(what) +
                  " cost must be finite and non-negative, not " + std::to_string(x));
    }
  };
  check("forward", c.forward);
  check("backward", c.backward);
  check("weight", c.weight);
  check("p2p latency", c.p2p_latency);
  check("p2p bandwidth", c.p2p_bandwidth);
  validate(s);
  auto t = detail::run(
      s, "simulating schedule " + s.name,
      [&](int, const action& a) { return duration(s, c, a.kind); },
      [&](const action& a) {
        return c.p2p_latency +
               (c.p2p_bandwidth > 0 ? static_cast<double>(a.bytes) / c.p2p_bandwidth : 0.0);
      });
  timeline out{std::move(t.start), std::move(t.end), 0.0};
  for (const auto& ends : out.end)
    if (!ends.empty()) out.step_time = std::max(out.step_time, ends.back());
  return out;
}

struct statistics {
  double step_time = 0;         // simulated
  double ideal_time = 0;        // the busiest rank's compute: the step time without bubble
  double bubble_over_ideal = 0; // (step_time - ideal_time) / ideal_time
  double idle_fraction = 0;     // idle time of all ranks / (stages * step_time)
  std::vector<double> busy;     // compute time of each rank
  // The most (microbatch, chunk) pairs each rank holds activations of at once: from its F
  // until its B (W, when the backward is split) has run. A chunk's pair holds 1/V of a
  // microbatch's activations on that rank.
  std::vector<int> peak_in_flight;
  std::size_t p2p_messages = 0;
  std::size_t p2p_bytes = 0;
};

/// Validates `s` and measures it; see the header comment for the conventions.
inline statistics analyze(const schedule& s, const costs& c = {}) {
  const timeline t = simulate(s, c);
  statistics out;
  out.step_time = t.step_time;
  const auto p = static_cast<std::size_t>(s.stages);
  out.busy.assign(p, 0.0);
  out.peak_in_flight.assign(p, 0);
  double idle = 0;
  for (std::size_t r = 0; r < p; ++r) {
    int held = 0;
    for (const action& a : s.ranks[r]) {
      if (is_send(a.kind)) {
        ++out.p2p_messages;
        out.p2p_bytes += a.bytes;
      }
      if (!is_compute(a.kind)) continue;
      out.busy[r] += duration(s, c, a.kind);
      if (a.kind == action_kind::forward) {
        out.peak_in_flight[r] = std::max(out.peak_in_flight[r], ++held);
      } else if (a.kind == (s.split_backward ? action_kind::weight : action_kind::backward)) {
        --held;
      }
    }
    out.ideal_time = std::max(out.ideal_time, out.busy[r]);
    idle += t.step_time - out.busy[r];
  }
  if (out.ideal_time > 0) out.bubble_over_ideal = (out.step_time - out.ideal_time) / out.ideal_time;
  if (out.step_time > 0) out.idle_fraction = idle / (static_cast<double>(p) * out.step_time);
  return out;
}

} // namespace weft::pipeline
