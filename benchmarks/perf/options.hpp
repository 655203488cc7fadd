#pragma once
// weft-perf's command line: nccl-tests' flags (-b -e -f -n -w -c -g) plus weft's own (-o op,
// -r redop, -a algorithm, -t transport, --topology, --json). Parsing only: every mistake is a
// weft::error saying which flag and what it accepts, and main turns it into exit status 2.
#include <weft/comm/plan.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/core/error.hpp>
#include <weft/core/types.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::perf {

enum class redop : std::uint8_t { sum, prod, min, max, avg, none };
enum class algorithm : std::uint8_t {
  ring,
  tree,
  halving_doubling,
  recursive_doubling,
  direct,
  pairwise,
  hierarchical,           // hierarchical<ring, ring>
  hierarchical_ring_tree, // hierarchical<ring, tree>
  hierarchical_direct_ring,
  automatic,
};
enum class transport_kind : std::uint8_t { local, mpi };

inline constexpr std::array all_collectives = {collective::all_reduce, collective::reduce_scatter,
                                               collective::all_gather, collective::broadcast,
                                               collective::reduce,     collective::all_to_all};
inline constexpr std::array all_dtypes = {dtype::float32,  dtype::float64, dtype::float16,
                                          dtype::bfloat16, dtype::int32,   dtype::int64};
inline constexpr std::array all_redops = {redop::sum, redop::prod, redop::min, redop::max,
                                          redop::avg};
// What `-a all` means: one of each kind; the other hierarchical pairings by name only.
inline constexpr std::array all_algorithms = {algorithm::ring,
                                              algorithm::tree,
                                              algorithm::halving_doubling,
                                              algorithm::recursive_doubling,
                                              algorithm::direct,
                                              algorithm::pairwise,
                                              algorithm::hierarchical,
                                              algorithm::automatic};

constexpr std::string_view name_of(redop r) noexcept {
  switch (r) {
    case redop::sum: return "sum";
    case redop::prod: return "prod";
    case redop::min: return "min";
    case redop::max: return "max";
    case redop::avg: return "avg";
    case redop::none: return "none";
  }
  return "?";
}

/// The name -a takes (and the table header shows); the library's own name may differ.
constexpr std::string_view name_of(algorithm a) noexcept {
  switch (a) {
    case algorithm::ring: return "ring";
    case algorithm::tree: return "tree";
    case algorithm::halving_doubling: return "halving_doubling";
    case algorithm::recursive_doubling: return "recursive_doubling";
    case algorithm::direct: return "direct";
    case algorithm::pairwise: return "pairwise";
    case algorithm::hierarchical: return "hierarchical";
    case algorithm::hierarchical_ring_tree: return "hierarchical<ring,tree>";
    case algorithm::hierarchical_direct_ring: return "hierarchical<direct,ring>";
    case algorithm::automatic: return "automatic";
  }
  return "?";
}

constexpr std::string_view name_of(transport_kind t) noexcept {
  return t == transport_kind::local ? "local" : "mpi";
}

/// Whether the collective combines values (and so takes a redop).
constexpr bool reduces(collective c) noexcept {
  return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::reduce;
}
constexpr bool rooted(collective c) noexcept {
  return c == collective::broadcast || c == collective::reduce;
}

struct config {
  std::size_t min_bytes = 8;
  std::size_t max_bytes = std::size_t{64} << 20;
  std::size_t factor = 2;
  std::vector<collective> ops{collective::all_reduce};
  std::vector<dtype> dtypes{dtype::float32};
  std::vector<redop> redops{redop::sum};
  std::vector<algorithm> algorithms{algorithm::automatic};
  transport_kind transport = transport_kind::local;
  int ranks = 4;
  bool ranks_given = false;
  int root = 0;
  int iters = 20;
  int warmup = 5;
  int min_time_ms = 0; // 0: -n calls a row; else about this long a row at least (more calls)
  bool check = true;
  std::optional<bool> measured;                 // unset: the transport's default
  std::optional<local::thread_binding> binding; // unset: WEFT_BINDING where set, else automatic
  std::string topology_spec;                    // as given; empty: one node of `ranks`
  std::optional<topology::cluster> cluster;     // parsed --topology
  std::string json_path;
  bool help = false;

  /// The sizes to run, nccl-tests' way: min, min*f, ... while <= max.
  [[nodiscard]] std::vector<std::size_t> sizes() const {
    std::vector<std::size_t> s;
    for (std::size_t b = min_bytes; b <= max_bytes; b *= factor) {
      s.push_back(b);
      if (b > max_bytes / factor) break; // the next step would overflow or pass max
    }
    return s;
  }
};

inline constexpr std::string_view usage_text =
    R"(usage: weft-perf [options]
  nccl-tests-style timing and checking of weft's collectives.

  -b, --minbytes SIZE     smallest message (default 8); SIZE is bytes, or with K, M, G (x1024)
  -e, --maxbytes SIZE     largest message (default 64M)
  -f, --stepfactor N      multiply the size by N between rows (default 2)
  -o, --op LIST           all_reduce reduce_scatter all_gather broadcast reduce all_to_all, or all
                          (default all_reduce)
  -d, --datatype LIST     float double half bfloat16 int32 int64, or all (default float)
  -r, --redop LIST        sum prod min max avg, or all (default sum; reducing ops only)
  -a, --algorithm LIST    ring tree halving_doubling recursive_doubling direct pairwise hierarchical
                          hierarchical<ring,tree> hierarchical<direct,ring> automatic, or all
                          (default automatic); combinations an algorithm does not serve are skipped
  -t, --transport T       local (ranks as threads) or mpi (one rank per process, under mpirun)
  -g, --ranks N           local ranks (default 4; with --topology, its size); with -t mpi the
                          ranks are mpirun's processes, and -g, if given, must equal their number
      --root R            root of broadcast and reduce (default 0)
  -n, --iters N           timed iterations per size (default 20)
  -w, --warmup_iters N    untimed iterations first (default 5)
      --min_time_ms N     about N ms of timed calls in each row at least: every row of a size
                          makes more than -n calls where the fastest algorithm's timed warm-up
                          calls (after one more untimed) say -n would take less; slower rows
                          take longer (default 0: -n calls)
  -c, --check 0|1         verify every result and count wrong elements (default 1)
  -m, --measured 0|1      automatic picks by prices measured on this machine at its first call
                          (local::options::automatic, default 1; under mpirun
                          mpi::options::measured_automatic, MPI's own collective among the
                          candidates, default 0; 0: the cost model's)
  -B, --binding B         where local ranks' threads run: automatic (default: one CPU each,
                          round robin, where they outnumber the CPUs; else free), cpu (always
                          bound), none (free); WEFT_BINDING where -B is not given. Bound, which
                          ranks share a core stays put, and with it the fastest algorithm
      --topology SPEC     emulated cluster, e.g. "2x4,intra=shm:8GB/s:2us,inter=net:0.5GB/s:20us";
                          local ranks become its devices and transfers are paced by its links
      --json FILE         also write every row as JSON
  -h, --help              this text
  LIST: comma-separated names. size is bytes per rank (all_gather, reduce_scatter, all_to_all:
  count x ranks). time: mean over -n iterations, the slowest rank's. model: weft's cost model.
  Memory: two buffers of maxBytes per rank. With -c 1, inputs are small integers whose
  reductions are exact in every type, and outputs are compared exactly with a serial reference.
  Exit status: 0 all right, 1 a wrong result or an error, 2 bad options.
)";

namespace detail {

[[noreturn]] inline void bad(const std::string& what) {
  throw error("weft-perf: " + what + " (see weft-perf -h)");
}

inline std::string lower(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != ' ') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

inline std::uint64_t parse_unsigned(std::string_view flag, std::string_view text,
                                    std::string_view* rest = nullptr) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc{} || end == text.data() ||
      (rest == nullptr && end != text.data() + text.size())) {
    bad(std::string(flag) + " takes a non-negative whole number, not '" + std::string(text) + "'");
  }
  if (rest != nullptr) *rest = text.substr(static_cast<std::size_t>(end - text.data()));
  return v;
}

inline int parse_int(std::string_view flag, std::string_view text, int lo, int hi) {
  const std::uint64_t v = parse_unsigned(flag, text);
  if (v < static_cast<std::uint64_t>(lo) || v > static_cast<std::uint64_t>(hi)) {
    bad(std::string(flag) + " must be between " + std::to_string(lo) + " and " +
        std::to_string(hi) + ", not " + std::string(text));
  }
  return static_cast<int>(v);
}

} // namespace detail

/// "8", "1K", "16M", "2G", "4KB", "4KiB": bytes, the suffixes powers of 1024 as nccl-tests reads
/// them.
inline std::size_t parse_size(std::string_view flag, std::string_view text) {
  std::string_view rest;
  const std::uint64_t v = detail::parse_unsigned(flag, text, &rest);
  const std::string unit = detail::lower(rest);
  int shift = 0;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    shift = 10;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    shift = 20;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    shift = 30;
  } else {
    detail::bad(std::string(flag) + " takes bytes such as 8, 1K, 16M or 2G, not '" +
                std::string(text) + "'");
  }
  if (v > (std::uint64_t{1} << (62 - shift)))
    detail::bad(std::string(flag) + " is too large: " + std::string(text));
  return static_cast<std::size_t>(v << shift);
}

/// A comma-separated list of names from `table` (or "all", which gives `every`), in the order
/// given, without repeats.
template <class E, std::size_t N, std::size_t M>
std::vector<E> parse_list(std::string_view flag, std::string_view text,
                          const std::array<std::pair<std::string_view, E>, N>& table,
                          const std::array<E, M>& every) {
  std::vector<E> out;
  std::string accepted;
  for (const auto& [name, e] : table)
    accepted += (accepted.empty() ? "" : ", ") + std::string(name);
  // Split on commas outside <...>, so "hierarchical<ring,tree>" stays one name.
  std::vector<std::string_view> words;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || (text[i] == ',' && depth == 0)) {
      words.push_back(text.substr(start, i - start));
      start = i + 1;
    } else if (text[i] == '<') {
      ++depth;
    } else if (text[i] == '>') {
      --depth;
    }
  }
  for (std::string_view w : words) {
    const std::string word = detail::lower(w);
    if (word == "all") {
      for (E e : every) {
        if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
      }
      continue;
    }
    const auto it = std::find_if(table.begin(), table.end(),
                                 [&](const auto& entry) { return entry.first == word; });
    if (it == table.end()) {
      detail::bad("unknown " + std::string(flag) + " '" + std::string(w) + "'; expected " +
                  accepted + " or all");
    }
    if (std::find(out.begin(), out.end(), it->second) == out.end()) out.push_back(it->second);
  }
  return out;
}

inline constexpr std::array<std::pair<std::string_view, collective>, 6> collective_names{{
    {"all_reduce", collective::all_reduce},
    {"reduce_scatter", collective::reduce_scatter},
    {"all_gather", collective::all_gather},
    {"broadcast", collective::broadcast},
    {"reduce", collective::reduce},
    {"all_to_all", collective::all_to_all},
}};
inline constexpr std::array<std::pair<std::string_view, dtype>, 6> dtype_names{{
    {"float", dtype::float32},
    {"double", dtype::float64},
    {"half", dtype::float16},
    {"bfloat16", dtype::bfloat16},
    {"int32", dtype::int32},
    {"int64", dtype::int64},
}};
inline constexpr std::array<std::pair<std::string_view, redop>, 5> redop_names{{
    {"sum", redop::sum},
    {"prod", redop::prod},
    {"min", redop::min},
    {"max", redop::max},
    {"avg", redop::avg},
}};
inline constexpr std::array<std::pair<std::string_view, algorithm>, 10> algorithm_names{{
    {"ring", algorithm::ring},
    {"tree", algorithm::tree},
    {"halving_doubling", algorithm::halving_doubling},
    {"recursive_doubling", algorithm::recursive_doubling},
    {"direct", algorithm::direct},
    {"pairwise", algorithm::pairwise},
    {"hierarchical", algorithm::hierarchical},
    {"hierarchical<ring,tree>", algorithm::hierarchical_ring_tree},
    {"hierarchical<direct,ring>", algorithm::hierarchical_direct_ring},
    {"automatic", algorithm::automatic},
}};

/// Reads argv (without argv[0]). Throws weft::error naming the flag for anything it cannot use.
inline config parse_args(const std::vector<std::string_view>& args) {
  config cfg;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view flag = args[i];
    std::string_view value;
    bool inline_value = false;
    // --flag=value as well as --flag value
    if (flag.starts_with("--")) {
      if (const auto eq = flag.find('='); eq != std::string_view::npos) {
        value = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
        inline_value = true;
      }
    }
    if (flag == "-h" || flag == "--help") {
      cfg.help = true;
      continue;
    }
    static constexpr std::array<std::string_view, 34> known = {"-b",
                                                               "--minbytes",
                                                               "-e",
                                                               "--maxbytes",
                                                               "-f",
                                                               "--stepfactor",
                                                               "-o",
                                                               "--op",
                                                               "-d",
                                                               "--datatype",
                                                               "-r",
                                                               "--redop",
                                                               "-a",
                                                               "--algorithm",
                                                               "-t",
                                                               "--transport",
                                                               "-g",
                                                               "--ranks",
                                                               "--root",
                                                               "-n",
                                                               "--iters",
                                                               "-w",
                                                               "--warmup_iters",
                                                               "--min_time_ms",
                                                               "-c",
                                                               "--check",
                                                               "-m",
                                                               "--measured",
                                                               "-B",
                                                               "--binding",
                                                               "--topology",
                                                               "--json",
                                                               "-h",
                                                               "--help"};
    if (std::find(known.begin(), known.end(), flag) == known.end()) {
      detail::bad("unknown option '" + std::string(args[i]) + "'");
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) detail::bad(std::string(flag) + " needs a value");
      value = args[++i];
    }
    if (flag == "-b" || flag == "--minbytes") {
      cfg.min_bytes = parse_size(flag, value);
    } else if (flag == "-e" || flag == "--maxbytes") {
      cfg.max_bytes = parse_size(flag, value);
    } else if (flag == "-f" || flag == "--stepfactor") {
      cfg.factor = detail::parse_unsigned(flag, value);
    } else if (flag == "-o" || flag == "--op") {
      cfg.ops = parse_list("op", value, collective_names, all_collectives);
    } else if (flag == "-d" || flag == "--datatype") {
      cfg.dtypes = parse_list("datatype", value, dtype_names, all_dtypes);
    } else if (flag == "-r" || flag == "--redop") {
      cfg.redops = parse_list("redop", value, redop_names, all_redops);
    } else if (flag == "-a" || flag == "--algorithm") {
      cfg.algorithms = parse_list("algorithm", value, algorithm_names, all_algorithms);
    } else if (flag == "-t" || flag == "--transport") {
      const std::string t = detail::lower(value);
      if (t == "local") {
        cfg.transport = transport_kind::local;
      } else if (t == "mpi") {
        cfg.transport = transport_kind::mpi;
      } else {
        detail::bad("unknown transport '" + std::string(value) + "'; expected local or mpi");
      }
    } else if (flag == "-g" || flag == "--ranks") {
      cfg.ranks = detail::parse_int(flag, value, 1, 4096);
      cfg.ranks_given = true;
    } else if (flag == "--root") {
      cfg.root = detail::parse_int(flag, value, 0, 1 << 30);
    } else if (flag == "-n" || flag == "--iters") {
      cfg.iters = detail::parse_int(flag, value, 1, 1 << 30);
    } else if (flag == "-w" || flag == "--warmup_iters") {
      cfg.warmup = detail::parse_int(flag, value, 0, 1 << 30);
    } else if (flag == "--min_time_ms") {
      cfg.min_time_ms = detail::parse_int(flag, value, 0, 3600000);
    } else if (flag == "-c" || flag == "--check") {
      cfg.check = detail::parse_int(flag, value, 0, 1) == 1;
    } else if (flag == "-m" || flag == "--measured") {
      cfg.measured = detail::parse_int(flag, value, 0, 1) == 1;
    } else if (flag == "-B" || flag == "--binding") {
      const std::string b = detail::lower(value);
      cfg.binding.reset();
      for (const auto& [name, binding] : weft::detail::thread_binding_names)
        if (b == name) cfg.binding = binding;
      if (!cfg.binding) {
        detail::bad("unknown binding '" + std::string(value) +
                    "'; expected none, automatic or cpu");
      }
    } else if (flag == "--topology") {
      cfg.topology_spec = std::string(value);
      try {
        cfg.cluster = topology::parse(value);
      } catch (const error& e) {
        detail::bad(std::string("--topology: ") + e.what());
      }
    } else if (flag == "--json") {
      if (value.empty()) detail::bad("--json needs a file name");
      cfg.json_path = std::string(value);
    }
  }
  if (cfg.help) return cfg;
  if (cfg.min_bytes < 1) detail::bad("-b must be at least 1 byte");
  if (cfg.min_bytes > cfg.max_bytes) {
    detail::bad("-b " + std::to_string(cfg.min_bytes) + " is larger than -e " +
                std::to_string(cfg.max_bytes));
  }
  if (cfg.factor < 2) detail::bad("-f must be at least 2, not " + std::to_string(cfg.factor));
  if (cfg.cluster) {
    if (cfg.ranks_given && cfg.ranks != cfg.cluster->size()) {
      detail::bad("-g " + std::to_string(cfg.ranks) + " disagrees with --topology, which has " +
                  std::to_string(cfg.cluster->size()) + " devices");
    }
    cfg.ranks = cfg.cluster->size();
  }
  if (!cfg.binding) {
    try { // WEFT_BINDING, as local::run will read it: a bad one is a bad option here
      (void)weft::detail::thread_binding_of({});
    } catch (const error& e) {
      detail::bad(e.what());
    }
  }
  if (cfg.transport == transport_kind::mpi && cfg.binding) {
    detail::bad(
        "-B binds ranks that run as threads (-t local); under mpirun, its own binding "
        "places the processes (--bind-to)");
  }
  if (cfg.transport == transport_kind::local && cfg.root >= cfg.ranks) {
    detail::bad("--root " + std::to_string(cfg.root) + " is not a rank of " +
                std::to_string(cfg.ranks));
  }
  return cfg;
}

} // namespace weft::perf
