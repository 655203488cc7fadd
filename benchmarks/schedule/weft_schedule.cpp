// weft-schedule: prints a pipeline schedule of weft's generators, its statistics, or the
// simulated timeline as a Chrome trace (open it in Perfetto or chrome://tracing).
//
//   weft-schedule --schedule 1f1b --stages 4 --microbatches 8
//   weft-schedule --schedule interleaved --stages 8 --microbatches 64 --chunks 2 --format json
//   weft-schedule --schedule zb-h1 --stages 4 --microbatches 8 --format trace > zb.json
//
// Exit status: 0, 2 for bad arguments (the message says which and what it takes), 1 when a
// generated schedule fails validation (a bug in weft).
#include <weft/pipeline.hpp>

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace {

namespace pl = weft::pipeline;

constexpr std::string_view usage_text =
    R"(usage: weft-schedule --schedule NAME --stages P --microbatches M [options]

  --schedule NAME      1f1b | gpipe | interleaved | zb-h1
  --stages P           pipeline stages (ranks), at least 1
  --microbatches M     microbatches per step, at least 1
  --chunks V           model chunks per rank (interleaved only; default 2 there, 1 elsewhere)
  --group G            interleaved: microbatches per group (default P)
  --format FORMAT      text (default): "rank R: F0.0 B0.0 ..." per stage
                       json: the same with statistics
                       trace: Chrome trace-event JSON of the simulated step, idle time shown
  --costs F,B,W        per-microbatch costs of forward, input-gradient and weight-gradient work
                       of a whole stage, in microseconds (default 1,1,1); unsplit schedules
                       run B and W as one backward
  --latency L          microseconds from a send to its receive (default 0)
  --bytes N            bytes of each activation and gradient message (default 0)
  -h, --help           this text
)";

enum class format { text, json, trace };

struct config {
  pl::schedule_kind kind = pl::schedule_kind::one_f_one_b;
  int stages = 0;
  int microbatches = 0;
  std::optional<int> chunks;
  int group = 0;
  format fmt = format::text;
  pl::costs cost;
  std::size_t bytes = 0;
  bool help = false;
};

template <class T>
T number(std::string_view flag, std::string_view text, const char* what) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw weft::error("weft-schedule: " + std::string(flag) + " takes " + what + ", not '" +
                      std::string(text) + "'");
  }
  return value;
}

int count(std::string_view flag, std::string_view text) {
  const int n = number<int>(flag, text, "a whole number");
  if (n < 1) {
    throw weft::error("weft-schedule: " + std::string(flag) + " must be at least 1, not " +
                      std::string(text));
  }
  return n;
}

double microseconds(std::string_view flag, std::string_view text) {
  const double t = number<double>(flag, text, "a number of microseconds");
  if (!(t >= 0) || t > 1e300) {
    throw weft::error("weft-schedule: " + std::string(flag) +
                      " takes non-negative finite microseconds, not " + std::string(text));
  }
  return t;
}

config parse(const std::vector<std::string_view>& args) {
  config cfg;
  bool has_schedule = false;
  bool has_group = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view flag = args[i];
    if (flag == "-h" || flag == "--help") {
      cfg.help = true;
      continue;
    }
    std::optional<std::string_view> inline_value;
    if (const auto eq = flag.find('='); flag.starts_with("--") && eq != std::string_view::npos) {
      inline_value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    constexpr std::array known = {"--schedule", "--stages", "--microbatches", "--chunks", "--group",
                                  "--format",   "--costs",  "--latency",      "--bytes"};
    bool is_known = false;
    for (const char* k : known)
      is_known = is_known || flag == k;
    if (!is_known) {
      throw weft::error("weft-schedule: unknown option '" + std::string(args[i]) +
                        "' (see weft-schedule --help)");
    }
    if (!inline_value && i + 1 == args.size()) {
      throw weft::error("weft-schedule: " + std::string(flag) + " needs a value");
    }
    const std::string_view value = inline_value ? *inline_value : args[++i];
    if (flag == "--schedule") {
      has_schedule = true;
      if (value == "1f1b") {
        cfg.kind = pl::schedule_kind::one_f_one_b;
      } else if (value == "gpipe") {
        cfg.kind = pl::schedule_kind::gpipe;
      } else if (value == "interleaved") {
        cfg.kind = pl::schedule_kind::interleaved;
      } else if (value == "zb-h1") {
        cfg.kind = pl::schedule_kind::zero_bubble_h1;
      } else {
        throw weft::error("weft-schedule: unknown schedule '" + std::string(value) +
                          "' (1f1b, gpipe, interleaved or zb-h1)");
      }
    } else if (flag == "--stages") {
      cfg.stages = count(flag, value);
    } else if (flag == "--microbatches") {
      cfg.microbatches = count(flag, value);
    } else if (flag == "--chunks") {
      cfg.chunks = count(flag, value);
    } else if (flag == "--group") {
      cfg.group = count(flag, value);
      has_group = true;
    } else if (flag == "--format") {
      if (value == "text") {
        cfg.fmt = format::text;
      } else if (value == "json") {
        cfg.fmt = format::json;
      } else if (value == "trace") {
        cfg.fmt = format::trace;
      } else {
        throw weft::error("weft-schedule: unknown format '" + std::string(value) +
                          "' (text, json or trace)");
      }
    } else if (flag == "--costs") {
      std::vector<double> parts;
      std::size_t from = 0;
      for (;;) {
        const std::size_t comma = value.find(',', from);
        parts.push_back(microseconds(flag, value.substr(from, comma - from)));
        if (comma == std::string_view::npos) break;
        from = comma + 1;
      }
      if (parts.size() != 3) {
        throw weft::error("weft-schedule: --costs takes three costs F,B,W such as 1,1,1, not '" +
                          std::string(value) + "'");
      }
      cfg.cost.forward = parts[0];
      cfg.cost.backward = parts[1];
      cfg.cost.weight = parts[2];
    } else if (flag == "--latency") {
      cfg.cost.p2p_latency = microseconds(flag, value);
    } else if (flag == "--bytes") {
      cfg.bytes = number<std::size_t>(flag, value, "a number of bytes");
    }
  }
  if (cfg.help) return cfg;
  if (!has_schedule) throw weft::error("weft-schedule: --schedule is required (see --help)");
  if (cfg.stages == 0) throw weft::error("weft-schedule: --stages is required (see --help)");
  if (cfg.microbatches == 0)
    throw weft::error("weft-schedule: --microbatches is required (see --help)");
  if (cfg.kind != pl::schedule_kind::interleaved &&
      (has_group || (cfg.chunks && *cfg.chunks != 1))) {
    throw weft::error("weft-schedule: --chunks and --group apply to --schedule interleaved only");
  }
  return cfg;
}

// --- output ---------------------------------------------------------------------------------

std::string num(double x) {
  std::array<char, 32> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), x);
  return ec == std::errc() ? std::string(buf.data(), end) : std::string("0");
}

// Tokens and schedule names hold no character JSON must escape.
std::string quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::string json(const config& cfg, const pl::schedule& s, const pl::statistics& st) {
  std::string o = "{\n";
  o += "  \"schedule\": " + quoted(s.name) + ",\n";
  o += "  \"stages\": " + std::to_string(s.stages) + ",\n";
  o += "  \"microbatches\": " + std::to_string(s.microbatches) + ",\n";
  o += "  \"chunks\": " + std::to_string(s.chunks) + ",\n";
  o += "  \"split_backward\": " + std::string(s.split_backward ? "true" : "false") + ",\n";
  if (cfg.kind == pl::schedule_kind::interleaved) {
    o += "  \"group_size\": " + std::to_string(cfg.group == 0 ? s.stages : cfg.group) + ",\n";
  }
  o += "  \"costs_us\": {\"forward\": " + num(cfg.cost.forward) +
       ", \"backward\": " + num(cfg.cost.backward) + ", \"weight\": " + num(cfg.cost.weight) +
       ", \"p2p_latency\": " + num(cfg.cost.p2p_latency) + "},\n";
  o += "  \"ranks\": [\n";
  for (int r = 0; r < s.stages; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    o += "    {\"rank\": " + std::to_string(r) + ", \"busy_us\": " + num(st.busy[ur]) +
         ", \"idle_us\": " + num(st.step_time - st.busy[ur]) +
         ", \"peak_in_flight\": " + std::to_string(st.peak_in_flight[ur]) +
         ",\n     \"actions\": [";
    bool first = true;
    for (const pl::action& a : s.compute(r)) {
      o += (first ? "" : ", ") + quoted(pl::token(a));
      first = false;
    }
    o += "]}" + std::string(r + 1 < s.stages ? "," : "") + "\n";
  }
  o += "  ],\n";
  o += "  \"statistics\": {\"step_time_us\": " + num(st.step_time) +
       ", \"ideal_time_us\": " + num(st.ideal_time) +
       ", \"bubble_over_ideal\": " + num(st.bubble_over_ideal) +
       ", \"idle_fraction\": " + num(st.idle_fraction) +
       ", \"p2p_messages\": " + std::to_string(st.p2p_messages) +
       ", \"p2p_bytes\": " + std::to_string(st.p2p_bytes) + "}\n";
  o += "}\n";
  return o;
}

// Chrome's trace-event format: one complete ("X") event per compute action and per idle gap,
// one thread per rank, timestamps in microseconds.
std::string trace(const pl::schedule& s, const pl::timeline& t) {
  std::string o = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  const auto event = [&](int r, std::string_view name, std::string_view cat,
                         std::string_view colour, double start, double end) {
    o += "  {\"name\": " + quoted(name) + ", \"cat\": " + quoted(cat) +
         ", \"cname\": " + quoted(colour) +
         ", \"ph\": \"X\", \"pid\": 0, \"tid\": " + std::to_string(r) + ", \"ts\": " + num(start) +
         ", \"dur\": " + num(end - start) + "},\n";
  };
  o += "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": " +
       quoted("weft-schedule " + s.name + " p=" + std::to_string(s.stages) +
              " m=" + std::to_string(s.microbatches)) +
       "}},\n";
  for (int r = 0; r < s.stages; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    o += "  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": " + std::to_string(r) +
         ", \"args\": {\"name\": \"rank " + std::to_string(r) + "\"}},\n";
    double free_from = 0; // the end of the rank's last compute action
    const auto& list = s.ranks[ur];
    for (std::size_t i = 0; i < list.size(); ++i) {
      const pl::action& a = list[i];
      if (!pl::is_compute(a.kind)) continue;
      const double start = t.start[ur][i];
      if (start > free_from) event(r, "idle", "idle", "grey", free_from, start);
      const bool f = a.kind == pl::action_kind::forward;
      const bool b = a.kind == pl::action_kind::backward;
      event(r, pl::token(a),
            f   ? "forward"
            : b ? "backward"
                : "weight",
            f   ? "good"
            : b ? "rail_response"
                : "yellow",
            start, t.end[ur][i]);
      free_from = t.end[ur][i];
    }
    if (t.step_time > free_from) event(r, "idle", "idle", "grey", free_from, t.step_time);
  }
  o.resize(o.size() - 2); // the last event's ",\n"
  o += "\n]}\n";
  return o;
}

} // namespace

int main(int argc, char** argv) {
  config cfg;
  pl::schedule s;
  try {
    cfg = parse(std::vector<std::string_view>(argv + 1, argv + argc));
    if (cfg.help) {
      std::fputs(usage_text.data(), stdout);
      return 0;
    }
    const int chunks = cfg.chunks.value_or(cfg.kind == pl::schedule_kind::interleaved ? 2 : 1);
    s = pl::generate(
        cfg.kind, cfg.stages, cfg.microbatches, chunks,
        pl::options{
            .group_size = cfg.group, .activation_bytes = cfg.bytes, .gradient_bytes = cfg.bytes});
  } catch (const std::exception& e) { // bad arguments, or parameters the generator refuses
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  try {
    std::string out;
    switch (cfg.fmt) {
      case format::text:
        pl::validate(s);
        out = pl::to_text(s);
        break;
      case format::json: out = json(cfg, s, pl::analyze(s, cfg.cost)); break;
      case format::trace: out = trace(s, pl::simulate(s, cfg.cost)); break;
    }
    std::fputs(out.c_str(), stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-schedule: %s\n", e.what());
    return 1;
  }
}
