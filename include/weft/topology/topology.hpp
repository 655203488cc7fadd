#pragma once
// weft::topology: the model of a cluster that collectives route over and the simulator
// prices. A cluster is a list of nodes, each with some devices; ranks are numbered
// node-major (node 0's devices first). Two link classes connect them: the intra-node link
// (NVLink, PCIe, shared memory) between devices of one node, and the inter-node link
// (InfiniBand, Ethernet) between nodes, with `nics_per_node` NICs sharing a node's traffic.
// Each link is a latency and a bandwidth (per direction, per device; per NIC for
// inter-node), the alpha-beta model: sending n bytes once costs latency + n / bandwidth.
//
// Spec grammar, read by parse() and written by cluster::to_string():
//
//   spec   := shape { ',' option }             whitespace around any token is ignored
//   shape  := N                                one node of N devices          "8"
//           | N 'x' M                          N nodes of M devices each      "2x4"
//           | A '+' B { '+' C }                uneven nodes, in rank order    "3+5"
//   option := 'intra=' KIND [ ':' VALUES ]      the intra-node link: nvlink | pcie | shm
//           | 'inter=' KIND [ ':' VALUES ]      the inter-node link: ib | infiniband |
//                                               ethernet | eth | net  (net = ethernet)
//           | KIND '=' VALUES                  shorthand; the kind names its class
//           | 'nics=' N                        NICs per node
//           | 'reduce=' BW                     bandwidth of a local a[i] op= b[i] pass
//   VALUES := BW ':' LAT | BW | LAT            a lone value is a bandwidth if it ends in
//                                               "/s"; either side of "BW:LAT" may be empty.
//                                               What is left out keeps the kind's default.
//   BW     := number unit, unit in B/s KB/s MB/s GB/s TB/s (bytes, decimal: 1 GB = 1e9 B)
//                                  or Kb/s Mb/s Gb/s Tb/s  (bits: 400Gb/s = 50e9 B/s)
//   LAT    := number unit, unit in ns us ms s
//   number := digits [ '.' digits ] [ 'e' [sign] digits ]     "900", "0.5", "2.5", "1e3"
//
// Keys and kinds ignore case; units do not (Gb/s is not GB/s). Each key may be given
// once, and "intra=" and an intra-node shorthand ("nvlink=") set the same link, so
// giving both is a duplicate too. Omitted links default to shm 10GB/s:1us (intra) and
// ethernet 1.25GB/s:20us (inter); omitted nics to 1, reduce to 10GB/s.
//
//   "8"                                              one node, 8 ranks over shared memory
//   "2x4,shm=20GB/s:1us,net=2GB/s:20us"              two hosts of four ranks
//   "2x8,intra=nvlink:450GB/s:2us,inter=ib:400Gb/s:5us,nics=8,reduce=3.35TB/s"
//   "3+5,nvlink=300GB/s,ib=3us"                      uneven nodes; kinds' other defaults
//
// Errors throw weft::error quoting the spec, the offending part and what was expected:
//   weft: topology spec "2x4,intra=nvlink:900XB/s": bad bandwidth "900XB/s": expected a
//   number and a unit B/s, KB/s, MB/s, GB/s, TB/s, Kb/s, Mb/s, Gb/s or Tb/s
#include <weft/core/error.hpp>
#include <weft/topology/detail/spec.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::topology {

enum class link_kind : std::uint8_t { nvlink, pcie, shm, infiniband, ethernet };

/// The name to_string() writes and parse() reads: "nvlink", "pcie", "shm", "ib", "ethernet".
[[nodiscard]] constexpr std::string_view name_of(link_kind kind) noexcept {
  switch (kind) {
    case link_kind::nvlink: return "nvlink";
    case link_kind::pcie: return "pcie";
    case link_kind::shm: return "shm";
    case link_kind::infiniband: return "ib";
    case link_kind::ethernet: return "ethernet";
  }
  return "unknown";
}

/// True for the links between devices of one node (nvlink, pcie, shm).
[[nodiscard]] constexpr bool is_intra_node(link_kind kind) noexcept {
  return kind == link_kind::nvlink || kind == link_kind::pcie || kind == link_kind::shm;
}

struct link {
  link_kind kind = link_kind::shm;
  double bandwidth = 10e9; // bytes per second, per direction, per device (inter-node: per NIC)
  double latency = 1e-6;   // seconds

  friend bool operator==(const link&, const link&) = default;
};

/// What a spec leaves out of a link of `kind`. Latencies are the cost of one step of a
/// collective over the link (a kernel or thread handing a chunk to a peer and that peer
/// seeing it), not the wire's one-way latency, which is far lower for NVLink.
[[nodiscard]] constexpr link default_link(link_kind kind) noexcept {
  switch (kind) {
    // NVLink4 (H100): 18 links x 25 GB/s = 450 GB/s per direction per GPU.
    case link_kind::nvlink: return {kind, 450e9, 2e-6};
    // PCIe 4.0 x16 carries 31.5 GB/s per direction after encoding; device-to-device
    // copies through a switch or root complex reach about 25 GB/s.
    case link_kind::pcie: return {kind, 25e9, 3e-6};
    // Threads or processes of one host copying through memory: a conservative single-core
    // memcpy rate, and the cost of a futex wake-up.
    case link_kind::shm: return {kind, 10e9, 1e-6};
    // NDR InfiniBand, 400 Gb/s per NIC.
    case link_kind::infiniband: return {kind, 50e9, 5e-6};
    // 10 Gb Ethernet through the kernel's TCP stack.
    case link_kind::ethernet: return {kind, 1.25e9, 20e-6};
  }
  return {};
}

/// Default bandwidth of a local reduction pass: a conservative host memory stream rate.
inline constexpr double default_reduce_bandwidth = 10e9;

class cluster {
public:
  /// One node, one device, the default links (shm intra, ethernet inter).
  cluster() : cluster({1}, default_link(link_kind::shm), default_link(link_kind::ethernet)) {}

  /// Throws weft::error on no node, more than 65536 nodes (what a spec can name), a node
  /// without a device, a link of the wrong class (intra must be nvlink, pcie or shm; inter ib
  /// or ethernet), a bandwidth that is not positive and finite, a latency that is not
  /// non-negative and finite, or nics < 1.
  cluster(std::vector<int> devices_per_node, link intra, link inter, int nics_per_node = 1,
          double reduce_bandwidth = default_reduce_bandwidth)
      : devices_(std::move(devices_per_node)),
        intra_(intra),
        inter_(inter),
        nics_(nics_per_node),
        reduce_(reduce_bandwidth) {
    if (devices_.empty()) {
      invalid("a cluster needs at least one node");
    }
    if (devices_.size() > static_cast<std::size_t>(::weft::detail::spec::max_nodes)) {
      invalid(std::to_string(devices_.size()), " nodes; a cluster has at most ",
              std::to_string(::weft::detail::spec::max_nodes));
    }
    first_.reserve(devices_.size() + 1);
    first_.push_back(0);
    for (std::size_t n = 0; n < devices_.size(); ++n) {
      if (devices_[n] < 1) {
        invalid("node ", std::to_string(n), " has ", std::to_string(devices_[n]),
                " devices; every node needs at least one");
      }
      if (devices_[n] > max_size - first_.back()) {
        invalid("more than ", std::to_string(max_size), " devices in all");
      }
      first_.push_back(first_.back() + devices_[n]);
    }
    uniform_ =
        std::all_of(devices_.begin(), devices_.end(), [&](int d) { return d == devices_.front(); });
    if (!is_intra_node(intra_.kind)) {
      invalid("the intra-node link is ", name_of(intra_.kind), "; it must be nvlink, pcie or shm");
    }
    if (is_intra_node(inter_.kind)) {
      invalid("the inter-node link is ", name_of(inter_.kind), "; it must be ib or ethernet");
    }
    check_link(intra_, "intra-node");
    check_link(inter_, "inter-node");
    if (nics_ < 1) {
      invalid("nics per node is ", std::to_string(nics_), "; it must be at least 1");
    }
    if (!positive(reduce_)) {
      invalid("the reduce bandwidth is ", number(reduce_), " B/s; it must be positive and finite");
    }
  }

  [[nodiscard]] int nodes() const noexcept { return static_cast<int>(devices_.size()); }
  [[nodiscard]] int size() const noexcept { return first_.back(); }
  [[nodiscard]] const std::vector<int>& devices_per_node() const noexcept { return devices_; }

  [[nodiscard]] int devices_on(int node) const {
    check_node(node, nodes());
    return devices_[static_cast<std::size_t>(node)];
  }

  /// The first rank of `node`; `node == nodes()` gives size(), so that
  /// [first_rank(n), first_rank(n + 1)) are the ranks of node n.
  [[nodiscard]] int first_rank(int node) const {
    check_node(node, nodes() + 1);
    return first_[static_cast<std::size_t>(node)];
  }

  [[nodiscard]] int node_of(int rank) const {
    check_rank(rank);
    if (uniform_) {
      return rank / devices_.front();
    }
    const auto after = std::upper_bound(first_.begin(), first_.end(), rank);
    return static_cast<int>(after - first_.begin()) - 1;
  }

  /// The index of `rank` among its node's devices.
  [[nodiscard]] int local_rank(int rank) const {
    return rank - first_[static_cast<std::size_t>(node_of(rank))];
  }

  [[nodiscard]] const link& intra() const noexcept { return intra_; }
  [[nodiscard]] const link& inter() const noexcept { return inter_; }

  /// The intra-node link when both ranks share a node (a rank with itself included),
  /// the inter-node link otherwise.
  [[nodiscard]] const link& link_between(int rank_a, int rank_b) const {
    return node_of(rank_a) == node_of(rank_b) ? intra_ : inter_;
  }

  [[nodiscard]] int nics_per_node() const noexcept { return nics_; }

  /// Bytes per second of a local a[i] op= b[i] pass (memory bound), to price the local
  /// reduction work of a plan.
  [[nodiscard]] double reduce_bandwidth() const noexcept { return reduce_; }

  /// All nodes hold the same number of devices.
  [[nodiscard]] bool uniform() const noexcept { return uniform_; }

  /// A spec that parse() reads back to an equal cluster, bit for bit in every figure:
  /// shape, then intra, inter, nics and reduce, always all of them.
  [[nodiscard]] std::string to_string() const {
    namespace spec = ::weft::detail::spec;
    std::string s;
    if (uniform_) {
      s = spec::cat(std::to_string(nodes()), "x", std::to_string(devices_.front()));
    } else {
      for (std::size_t n = 0; n < devices_.size(); ++n) {
        s.append(n == 0 ? "" : "+").append(std::to_string(devices_[n]));
      }
    }
    for (const auto& [key, l] : {std::pair{"intra", &intra_}, std::pair{"inter", &inter_}}) {
      s.append(spec::cat(",", key, "=", name_of(l->kind), ":",
                         spec::format_quantity(l->bandwidth, spec::bandwidth_units), ":",
                         spec::format_quantity(l->latency, spec::latency_units)));
    }
    s.append(spec::cat(",nics=", std::to_string(nics_),
                       ",reduce=", spec::format_quantity(reduce_, spec::bandwidth_units)));
    return s;
  }

  friend bool operator==(const cluster& a, const cluster& b) {
    return a.devices_ == b.devices_ && a.intra_ == b.intra_ && a.inter_ == b.inter_ &&
           a.nics_ == b.nics_ && a.reduce_ == b.reduce_;
  }

private:
  static constexpr int max_size = 0x7fffffff;

  template <class... Parts>
  [[noreturn]] static void invalid(const Parts&... what) {
    throw ::weft::error(::weft::detail::spec::cat("weft: topology: ", what...));
  }

  static std::string number(double x) { return ::weft::detail::spec::to_text(x); }

  static bool positive(double x) noexcept { return std::isfinite(x) && x > 0; }

  static void check_link(const link& l, const char* which) {
    if (!positive(l.bandwidth)) {
      invalid("the ", which, " link's bandwidth is ", number(l.bandwidth),
              " B/s; it must be positive and finite");
    }
    if (!(std::isfinite(l.latency) && l.latency >= 0)) {
      invalid("the ", which, " link's latency is ", number(l.latency),
              " s; it must be non-negative and finite");
    }
  }

  static void check_node(int node, int end) {
    if (node < 0 || node >= end) {
      invalid("node ", std::to_string(node), " is out of range [0, ", std::to_string(end), ")");
    }
  }

  void check_rank(int rank) const {
    if (rank < 0 || rank >= size()) {
      invalid("rank ", std::to_string(rank), " is out of range [0, ", std::to_string(size()), ")");
    }
  }

  std::vector<int> devices_;
  std::vector<int> first_; // first_[n]: node n's first rank; first_.back() == size()
  link intra_;
  link inter_;
  int nics_ = 1;
  double reduce_ = default_reduce_bandwidth;
  bool uniform_ = true;
};

/// parse()'s names for link kinds; to_string() writes name_of(), which is among them.
[[nodiscard]] inline std::optional<link_kind> kind_named(std::string_view name) noexcept {
  constexpr std::pair<std::string_view, link_kind> names[] = {
      {"nvlink", link_kind::nvlink},
      {"pcie", link_kind::pcie},
      {"shm", link_kind::shm},
      {"ib", link_kind::infiniband},
      {"infiniband", link_kind::infiniband},
      {"ethernet", link_kind::ethernet},
      {"eth", link_kind::ethernet},
      {"net", link_kind::ethernet},
  };
  for (const auto& [n, k] : names) {
    if (::weft::detail::spec::iequals(n, name)) {
      return k;
    }
  }
  return std::nullopt;
}

/// Reads a cluster from a spec; the grammar is at the top of this header.
[[nodiscard]] inline cluster parse(std::string_view spec_text) {
  namespace spec = ::weft::detail::spec;
  const std::string_view whole = spec_text;
  constexpr std::string_view intra_kinds = "nvlink, pcie or shm";
  constexpr std::string_view inter_kinds = "ib, infiniband, ethernet, eth or net";
  if (spec::trim(whole).empty()) {
    spec::fail(whole,
               "empty spec: expected a shape such as \"8\", \"2x4\" or \"3+5\", then options");
  }
  const auto parts = spec::split(whole, ',');
  const std::vector<int> devices = spec::parse_shape(whole, parts.front());

  link intra = default_link(link_kind::shm);
  link inter = default_link(link_kind::ethernet);
  int nics = 1;
  double reduce = default_reduce_bandwidth;
  // The option that set each slot, to name both sides of a duplicate.
  std::optional<std::string_view> intra_by, inter_by, nics_by, reduce_by;
  const auto claim = [&](std::optional<std::string_view>& by, std::string_view option,
                         std::string_view what) {
    if (by) {
      spec::fail(whole, "duplicate option ", spec::quoted(option), ": the ", what,
                 " was already set by ", spec::quoted(*by));
    }
    by = option;
  };

  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::string_view option = parts[i];
    if (option.empty()) {
      spec::fail(whole, "empty option after ','", i + 1 < parts.size() ? "" : " at the end",
                 ": expected KEY=VALUE with KEY one of ", spec::option_keys);
    }
    const auto eq = option.find('=');
    if (eq == std::string_view::npos) {
      spec::fail(whole, "bad option ", spec::quoted(option),
                 ": expected KEY=VALUE with KEY one of ", spec::option_keys);
    }
    const std::string_view key = spec::trim(option.substr(0, eq));
    const std::string_view value = spec::trim(option.substr(eq + 1));

    if (spec::iequals(key, "nics")) {
      claim(nics_by, option, "NIC count");
      const auto n = spec::parse_count(value);
      if (!n || *n < 1) {
        spec::fail(whole, "bad NIC count ", spec::quoted(value), " in ", spec::quoted(option),
                   ": expected a positive integer");
      }
      nics = *n;
      continue;
    }
    if (spec::iequals(key, "reduce")) {
      claim(reduce_by, option, "reduce bandwidth");
      reduce = spec::parse_bandwidth(whole, value);
      continue;
    }

    const bool explicit_class = spec::iequals(key, "intra") || spec::iequals(key, "inter");
    std::vector<std::string_view> values = spec::split(value, ':');
    std::string_view kind_name = key;
    if (explicit_class) {
      kind_name = values.front();
      values.erase(values.begin());
    }
    const auto kind = kind_named(kind_name);
    if (!kind) {
      if (explicit_class) {
        spec::fail(whole, "unknown link kind ", spec::quoted(kind_name), " in ",
                   spec::quoted(option), ": expected ",
                   spec::iequals(key, "intra") ? intra_kinds : inter_kinds);
      }
      spec::fail(whole, "unknown option ", spec::quoted(key), " in ", spec::quoted(option),
                 ": expected one of ", spec::option_keys);
    }
    const bool intra_kind = is_intra_node(*kind);
    if (explicit_class && intra_kind != spec::iequals(key, "intra")) {
      spec::fail(whole, spec::quoted(kind_name), " in ", spec::quoted(option), " is an ",
                 intra_kind ? "intra" : "inter", "-node link kind; ", key, "= takes ",
                 intra_kind ? inter_kinds : intra_kinds);
    }
    claim(intra_kind ? intra_by : inter_by, option,
          intra_kind ? "intra-node link" : "inter-node link");
    link& l = intra_kind ? intra : inter;
    l = default_link(*kind);
    const auto set = spec::parse_link_values(whole, option, values);
    l.bandwidth = set.bandwidth.value_or(l.bandwidth);
    l.latency = set.latency.value_or(l.latency);
  }
  return cluster(devices, intra, inter, nics, reduce);
}

// Presets. Figures from NVIDIA's datasheets: the DGX A100, DGX H100 and DGX H200 system
// datasheets (NVLink bandwidth per GPU, NICs per system) and the A100 80GB, H100 SXM and
// H200 SXM GPU datasheets (memory bandwidth). NVIDIA quotes NVLink as bidirectional
// ("600 GB/s", "900 GB/s"); the model wants one direction, half of that. Latencies are
// per collective step (see default_link): NVLink 2 us, InfiniBand 5 us.

/// DGX A100 (80GB): 8 A100 per node; NVLink3 through NVSwitch, 600 GB/s bidirectional =
/// 300 GB/s per direction per GPU; 8 ConnectX-6 HDR InfiniBand NICs at 200 Gb/s (25 GB/s);
/// HBM2e at 2,039 GB/s.
[[nodiscard]] inline cluster dgx_a100(int nodes) {
  return cluster(::weft::detail::spec::preset_nodes("dgx_a100", nodes, 8),
                 link{link_kind::nvlink, 300e9, 2e-6}, link{link_kind::infiniband, 25e9, 5e-6}, 8,
                 2.039e12);
}

/// DGX H100: 8 H100 SXM per node; NVLink4 through NVSwitch, 900 GB/s bidirectional =
/// 450 GB/s per direction per GPU; 8 ConnectX-7 NDR InfiniBand NICs at 400 Gb/s (50 GB/s);
/// HBM3 at 3.35 TB/s.
[[nodiscard]] inline cluster dgx_h100(int nodes) {
  return cluster(::weft::detail::spec::preset_nodes("dgx_h100", nodes, 8),
                 link{link_kind::nvlink, 450e9, 2e-6}, link{link_kind::infiniband, 50e9, 5e-6}, 8,
                 3.35e12);
}

/// DGX H200: 8 H200 per node; NVLink4, 450 GB/s per direction per GPU; 8 ConnectX-7 NDR
/// NICs at 400 Gb/s (50 GB/s); HBM3e at 4.8 TB/s.
[[nodiscard]] inline cluster dgx_h200(int nodes) {
  return cluster(::weft::detail::spec::preset_nodes("dgx_h200", nodes, 8),
                 link{link_kind::nvlink, 450e9, 2e-6}, link{link_kind::infiniband, 50e9, 5e-6}, 8,
                 4.8e12);
}

/// One node of `ranks` CPU ranks over shared memory (shm 10 GB/s, 1 us); the inter-node
/// link is the unused default.
[[nodiscard]] inline cluster host(int ranks) {
  if (ranks < 1) {
    throw ::weft::error(::weft::detail::spec::cat(
        "weft: topology: host needs at least one rank, not ", std::to_string(ranks)));
  }
  return cluster({ranks}, default_link(link_kind::shm), default_link(link_kind::ethernet));
}

} // namespace weft::topology

#include <weft/core/detail/planning_end.hpp>
