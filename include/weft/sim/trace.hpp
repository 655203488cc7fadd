#pragma once
// A simulated step as a Chrome trace (trace-event JSON; open it in Perfetto or
// chrome://tracing): one thread per pipeline rank with its forward, backward and weight work
// and its idle gaps, then the exposed DP reduction and the optimizer step. Times in us.
#include <weft/pipeline/schedule.hpp>
#include <weft/sim/step.hpp>

#include <array>
#include <charconv>
#include <string>
#include <string_view>

namespace weft::sim {

namespace detail {

inline std::string trace_number(double x) {
  std::array<char, 32> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), x);
  return ec == std::errc() ? std::string(buf.data(), end) : std::string("0");
}

} // namespace detail

/// The trace of `r`, titled `title` (which must hold no character JSON escapes).
[[nodiscard]] inline std::string to_chrome_trace(const step_result& r, std::string_view title) {
  namespace pl = weft::pipeline;
  const pl::schedule& s = r.schedule;
  const pl::timeline& t = r.timeline;
  const auto q = [](std::string_view x) { return "\"" + std::string(x) + "\""; };
  std::string o = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  o +=
      "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": " + q(title) +
      "}},\n";
  const auto event = [&](int rank, std::string_view name, std::string_view cat,
                         std::string_view colour, double start_s, double end_s) {
    o += "  {\"name\": " + q(name) + ", \"cat\": " + q(cat) + ", \"cname\": " + q(colour) +
         ", \"ph\": \"X\", \"pid\": 0, \"tid\": " + std::to_string(rank) +
         ", \"ts\": " + detail::trace_number(start_s * 1e6) +
         ", \"dur\": " + detail::trace_number((end_s - start_s) * 1e6) + "},\n";
  };
  for (int rank = 0; rank < s.stages; ++rank) {
    const auto ur = static_cast<std::size_t>(rank);
    o += "  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " +
         std::to_string(rank) + ", \"args\": {\"name\": \"pipeline rank " + std::to_string(rank) +
         "\"}},\n";
    double free_from = 0;
    const auto& list = s.ranks[ur];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const pl::action& a = list[i];
      if (!pl::is_compute(a.kind)) continue;
      const double start = t.start[ur][i];
      if (start > free_from) event(rank, "idle", "idle", "grey", free_from, start);
      const bool f = a.kind == pl::action_kind::forward;
      const bool b = a.kind == pl::action_kind::backward;
      event(rank, pl::token(a),
            f   ? "forward"
            : b ? "backward"
                : "weight",
            f   ? "good"
            : b ? "rail_response"
                : "yellow",
            start, t.end[ur][i]);
      free_from = t.end[ur][i];
    }
    if (r.pipeline_s > free_from) event(rank, "idle", "idle", "grey", free_from, r.pipeline_s);
    double at = r.pipeline_s;
    if (r.dp_exposed_s > 0) {
      event(rank, "dp reduction (exposed)", "dp", "bad", at, at + r.dp_exposed_s);
      at += r.dp_exposed_s;
    }
    if (r.optimizer_s > 0) event(rank, "optimizer", "optimizer", "olive", at, at + r.optimizer_s);
  }
  o.resize(o.size() - 2);
  o += "\n]}\n";
  return o;
}

} // namespace weft::sim
