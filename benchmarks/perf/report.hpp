#pragma once
// weft-perf's output: nccl-tests' layout (a header of options and ranks, then per table the
// size / count / type / redop / root / time / algbw / busbw / #wrong columns, closing with the
// out-of-bounds count and the average bus bandwidth), plus weft's model(us) and the algorithm
// that ran; and the same rows as JSON for plot scripts.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "options.hpp"

namespace weft::perf {

struct row {
  collective op;
  dtype type;
  redop rop;          // none for ops that do not reduce
  algorithm algo;     // what -a asked for
  std::string chosen; // what ran (automatic's pick; hierarchical's full name)
  std::size_t bytes;
  std::size_t count;
  int root; // -1 for unrooted ops, as nccl-tests prints
  double time_us;
  double algbw; // GB/s
  double busbw; // GB/s
  double model_us;
  std::int64_t wrong; // -1 when not checked
  int iters;          // timed calls (-n, or more under --min_time_ms)
};

class reporter {
public:
  explicit reporter(const config& cfg) : cfg_(cfg) {}

  /// The opening lines: options, then where each rank runs (`cpus`: the CPUs each rank's
  /// thread is bound to, empty where the threads run free or the ranks are processes).
  void header(const topology::cluster& cluster, const std::vector<int>& devices, bool emulated,
              const std::vector<std::vector<int>>& cpus = {}) const {
    std::printf(
        "# weft-perf  transport: %s  ranks: %zu  minBytes %zu  maxBytes %zu  step: %zu(factor)  "
        "warmup iters: %d  iters: %d  validation: %d\n",
        std::string(name_of(cfg_.transport)).c_str(), devices.size(), cfg_.min_bytes,
        cfg_.max_bytes, cfg_.factor, cfg_.warmup, cfg_.iters, cfg_.check ? 1 : 0);
    if (cfg_.min_time_ms > 0)
      std::printf(
          "# min time: %d ms a row (iters: more where -n calls of the fastest algorithm "
          "take less)\n",
          cfg_.min_time_ms);
    std::printf(
        "# topology: %s  (links %s)\n", cluster.to_string().c_str(),
        emulated ? "emulated: transfers paced at these figures" : "not emulated: model only");
    std::printf("#\n# Using devices\n");
    for (std::size_t r = 0; r < devices.size(); ++r) {
      std::string where = cfg_.transport == transport_kind::local ? "thread" : "process";
      if (cfg_.transport == transport_kind::local)
        where += r < cpus.size() ? ", CPU " + weft::detail::cpu_list(cpus[r]) : ", free";
      std::printf("#  Rank %3zu on node %3d device %3d (%s)\n", r, cluster.node_of(devices[r]),
                  devices[r], where.c_str());
    }
    std::fflush(stdout);
  }

  /// Algorithms left out of some tables, so that a missing table is explained.
  void skipped(const std::vector<std::string>& notes) const {
    if (notes.empty()) return;
    std::printf("#\n");
    for (const std::string& n : notes)
      std::printf("# skipped: %s\n", n.c_str());
    std::fflush(stdout);
  }

  void table_header(collective op, dtype type, redop rop, algorithm algo) const {
    std::printf("#\n# %s  %s  %s  algorithm %s\n", std::string(name_of(op)).c_str(),
                std::string(name_of(type)).c_str(), std::string(name_of(rop)).c_str(),
                std::string(name_of(algo)).c_str());
    std::printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s  %9s  %s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "model", "algorithm");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s  %9s\n", "(B)", "(elements)", "",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)");
    std::fflush(stdout);
  }

  void add(row r) {
    const std::string wrong = r.wrong < 0 ? "N/A" : std::to_string(r.wrong);
    std::printf("  %10zu  %12zu  %8s  %6s  %6d  %s  %7.2f  %7.2f  %6s  %s  %s\n", r.bytes, r.count,
                std::string(name_of(r.type)).c_str(), std::string(name_of(r.rop)).c_str(), r.root,
                format_time(r.time_us).c_str(), r.algbw, r.busbw, wrong.c_str(),
                format_time(r.model_us).c_str(), r.chosen.c_str());
    std::fflush(stdout);
    rows_.push_back(std::move(r));
  }

  /// A table that could not finish: its error, for the screen and the JSON.
  void failed(const std::string& what) {
    std::printf("# FAILED: %s\n", what.c_str());
    std::fflush(stdout);
    errors_.push_back(what);
  }

  [[nodiscard]] std::int64_t wrong() const {
    std::int64_t n = 0;
    for (const row& r : rows_)
      n += r.wrong > 0 ? r.wrong : 0;
    return n;
  }

  /// nccl-tests' closing lines.
  void summary() const {
    double sum = 0;
    for (const row& r : rows_)
      sum += r.busbw;
    std::printf("#\n# Out of bounds values : %lld %s\n", static_cast<long long>(wrong()),
                wrong() == 0 && errors_.empty() ? "OK" : "FAILED");
    std::printf("# Avg bus bandwidth    : %g \n#\n",
                rows_.empty() ? 0.0 : sum / static_cast<double>(rows_.size()));
    std::fflush(stdout);
  }

  /// Opens (and empties) the --json file before anything runs, so a path that cannot be written
  /// is found at once, not after every table. Throws weft::error naming the path.
  void open_json(const std::string& path) {
    json_path_ = path;
    json_.open(path);
    if (!json_) throw error("cannot write --json file '" + path + "': " + std::strerror(errno));
  }

  /// Writes the options and every row to the file open_json opened; throws weft::error if that
  /// fails.
  void write_json(const std::string& topology_text) {
    std::ofstream& f = json_;
    const auto list = [](const auto& items) {
      std::string s = "[";
      for (std::size_t i = 0; i < items.size(); ++i)
        s += (i ? ", " : "") + quote(name_of(items[i]));
      return s + "]";
    };
    f << "{\n  \"tool\": \"weft-perf\",\n  \"options\": {\n"
      << "    \"min_bytes\": " << cfg_.min_bytes << ",\n    \"max_bytes\": " << cfg_.max_bytes
      << ",\n    \"factor\": " << cfg_.factor << ",\n    \"ops\": " << list(cfg_.ops)
      << ",\n    \"dtypes\": " << list(cfg_.dtypes) << ",\n    \"redops\": " << list(cfg_.redops)
      << ",\n    \"algorithms\": " << list(cfg_.algorithms)
      << ",\n    \"transport\": " << quote(name_of(cfg_.transport))
      << ",\n    \"ranks\": " << cfg_.ranks << ",\n    \"root\": " << cfg_.root
      << ",\n    \"iters\": " << cfg_.iters << ",\n    \"min_time_ms\": " << cfg_.min_time_ms
      << ",\n    \"warmup\": " << cfg_.warmup
      << ",\n    \"check\": " << (cfg_.check ? "true" : "false")
      << ",\n    \"topology\": " << quote(topology_text) << "\n  },\n  \"rows\": [";
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      const row& r = rows_[i];
      f << (i ? ",\n" : "\n") << "    {\"op\": " << quote(name_of(r.op))
        << ", \"dtype\": " << quote(name_of(r.type)) << ", \"redop\": " << quote(name_of(r.rop))
        << ", \"algorithm\": " << quote(name_of(r.algo)) << ", \"chosen\": " << quote(r.chosen)
        << ", \"transport\": " << quote(name_of(cfg_.transport)) << ", \"ranks\": " << cfg_.ranks
        << ", \"topology\": " << quote(topology_text) << ", \"bytes\": " << r.bytes
        << ", \"count\": " << r.count << ", \"root\": " << r.root
        << ", \"time_us\": " << number(r.time_us) << ", \"algbw_GBps\": " << number(r.algbw)
        << ", \"busbw_GBps\": " << number(r.busbw) << ", \"model_us\": " << number(r.model_us)
        << ", \"wrong\": " << r.wrong << ", \"iters\": " << r.iters << "}";
    }
    f << "\n  ],\n  \"errors\": [";
    for (std::size_t i = 0; i < errors_.size(); ++i)
      f << (i ? ", " : "") << quote(errors_[i]);
    f << "]\n}\n";
    f.close();
    if (!f) throw error("writing --json file '" + json_path_ + "' failed");
  }

private:
  // nccl-tests' widths: fewer decimals as the time grows, so columns stay aligned.
  static std::string format_time(double us) {
    char buf[32];
    std::snprintf(buf, sizeof buf, us >= 1e4 ? "%9.0f" : (us >= 100 ? "%9.1f" : "%9.2f"), us);
    return buf;
  }
  static std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
  }
  static std::string quote(std::string_view s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        q += '\\';
        q += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x",
                      static_cast<unsigned>(static_cast<unsigned char>(c)));
        q += buf;
      } else {
        q += c;
      }
    }
    return q + "\"";
  }

  const config& cfg_;
  std::string json_path_;
  std::ofstream json_;
  std::vector<row> rows_;
  std::vector<std::string> errors_;
};

} // namespace weft::perf
