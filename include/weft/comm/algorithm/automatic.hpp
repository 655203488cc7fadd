#pragma once
// automatic: picks, for each call, the algorithm the cost model prices cheapest on the
// call's topology. It does not move anything itself: it builds every candidate's plans for
// all ranks of the call, runs them through cost_model::price, and hands back the cheapest.
//
//   choose(request, cluster, device_of, peer_access, messages)
//     for each candidate, in table order:
//       skip it if it does not plan the collective, needs peer access the transport lacks
//       (or would load across nodes), sends messages a load-only transport cannot (p2p),
//       or is hierarchical and the group sits on one node
//       price = cost_model::price(its plans for ranks 0 .. size-1)
//               + rounds x the transport's fixed cost per round (a kernel launch on a GPU)
//     the cheapest wins; a tie goes to the earlier entry
//
//   choose_path(..., vendor_seconds)
//     the same, beside the price of the communicator's own collective library (algo::vendor:
//     NCCL, priced by comm/plan/nccl_model.hpp; MPI, priced from a measurement), where the
//     communicator offers one for the call: the vendor wins unless a plan of weft's is
//     cheaper (a tie goes to the vendor)
//
// The choice depends only on the arguments (never on the calling rank), so every rank of
// a call picks the same algorithm without talking to the others. Choices are remembered,
// since a communicator asks for every call.
#include <weft/comm/algorithm/detail/node_layout.hpp>
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/pairwise.hpp>
#include <weft/comm/algorithm/recursive_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/plan/cost_model.hpp>
#include <weft/topology/topology.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::algo {

/// One algorithm automatic may pick, as plain function pointers, with its needs as its tag's
/// capabilities declare them.
struct candidate {
  std::string_view name;
  bool (*serves)(collective);
  plan (*make_plan)(const plan_request&);
  bool needs_peer_access; // its plans load from peers (direct)
  bool needs_nodes;       // it only helps across nodes (hierarchical)
  bool needs_messages;    // its plans send and receive (all but direct)
};

} // namespace weft::algo

namespace weft::detail {

template <class A>
constexpr algo::candidate candidate_of() {
  constexpr algo::capabilities caps = algo::capabilities_of<A>;
  return {A::name,    &A::serves,   &A::make_plan, caps.loads != algo::peer_loads::none,
          caps.nodes, caps.messages};
}

template <class... A>
constexpr auto candidate_table_of(algo::algorithms<A...>) {
  return std::array{candidate_of<A>()...};
}

/// The algorithms automatic chooses among, in tie-break order.
using candidate_algorithms = algo::algorithms<
    algo::direct, algo::ring, algo::tree, algo::halving_doubling, algo::recursive_doubling,
    algo::pairwise, algo::hierarchical<algo::ring, algo::ring>,
    algo::hierarchical<algo::direct, algo::ring>, algo::hierarchical<algo::ring, algo::tree>>;

inline constexpr auto candidate_table = candidate_table_of(candidate_algorithms{});

// Everything a choice depends on. The cluster is kept by its figures, not its address, so
// a cluster rebuilt equal hits and one rebuilt different misses.
struct choice_key {
  collective coll;
  int size;
  std::size_t count;
  int root;
  std::size_t element_size;
  std::vector<int> node_of;
  std::vector<int> device_of;
  bool peer_access;
  bool messages;
  std::vector<int> devices_per_node;
  topology::link intra;
  topology::link inter;
  int nics;
  double reduce;
  double round_seconds;

  friend bool operator==(const choice_key&, const choice_key&) = default;
};

struct choice_hash {
  std::size_t operator()(const choice_key& k) const noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto mix = [&](std::uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    const auto mix_link = [&](const topology::link& l) {
      mix(static_cast<std::uint64_t>(l.kind));
      mix(std::bit_cast<std::uint64_t>(l.bandwidth));
      mix(std::bit_cast<std::uint64_t>(l.latency));
    };
    mix(static_cast<std::uint64_t>(k.coll));
    mix(static_cast<std::uint64_t>(k.size));
    mix(k.count);
    mix(static_cast<std::uint64_t>(k.root));
    mix(k.element_size);
    for (int v : k.node_of)
      mix(static_cast<std::uint64_t>(v));
    mix(0xffff);
    for (int v : k.device_of)
      mix(static_cast<std::uint64_t>(v));
    mix(k.peer_access ? 1 : 2);
    mix(k.messages ? 3 : 4);
    for (int v : k.devices_per_node)
      mix(static_cast<std::uint64_t>(v));
    mix_link(k.intra);
    mix_link(k.inter);
    mix(static_cast<std::uint64_t>(k.nics));
    mix(std::bit_cast<std::uint64_t>(k.reduce));
    mix(std::bit_cast<std::uint64_t>(k.round_seconds));
    return static_cast<std::size_t>(h);
  }
};

// The cheapest candidate (an index into the candidate table; the table's size when none
// plans the call) and its price.
struct cheapest_plan {
  std::size_t index;
  double seconds;
};

// Remembered choices, shared by every thread.
struct choice_cache {
  static constexpr std::size_t capacity = 4096; // then start over: counts vary without end
  std::mutex mutex;
  std::unordered_map<choice_key, cheapest_plan, choice_hash> choices;
};

inline choice_cache& choices() {
  static choice_cache cache;
  return cache;
}

inline bool spans_nodes(const std::vector<int>& node_of) {
  for (int n : node_of) {
    if (n != node_of.front()) return true;
  }
  return false;
}

} // namespace weft::detail

namespace weft::algo {

/// The algorithms automatic chooses among, in tie-break order.
inline std::span<const candidate> candidates() noexcept { return detail::candidate_table; }

} // namespace weft::algo

namespace weft::detail {

/// Whether automatic may pick a for q: it plans the collective, the communicator lends what it
/// needs, and it is hierarchical only where the group spans nodes.
/// `nodes`: whether the group spans nodes (spans_nodes(q.node_of)), for callers that ask of
/// every candidate.
inline bool eligible(const algo::candidate& a, collective c, bool nodes, bool peer_access,
                     bool messages) {
  // A flat peer-access plan would read buffers on other nodes, which real machines cannot
  // (the local transport can only because its nodes are emulated in one process).
  const bool flat_loads_across_nodes = a.needs_peer_access && !a.needs_nodes && nodes;
  return a.serves(c) && (!a.needs_peer_access || peer_access) && (!a.needs_messages || messages) &&
         (!a.needs_nodes || nodes) && !flat_loads_across_nodes;
}
inline bool eligible(const algo::candidate& a, const plan_request& q, bool peer_access,
                     bool messages) {
  return eligible(a, q.coll, spans_nodes(q.node_of), peer_access, messages);
}

/// The most rounds any rank's plan runs.
inline std::uint32_t rounds_of(const std::vector<plan>& plans) {
  std::uint32_t rounds = 0;
  for (const plan& pl : plans)
    if (!pl.steps().empty()) rounds = std::max(rounds, pl.steps().back().round + 1);
  return rounds;
}

// The candidate the cost model prices cheapest for q (see choose()), remembered.
WEFT_COLD inline cheapest_plan cheapest(const plan_request& q, const topology::cluster& c,
                                        const std::vector<int>& device_of, bool peer_access,
                                        bool messages, double round_seconds) {
  check_request(q, "automatic");
  if (!(round_seconds >= 0) || round_seconds == std::numeric_limits<double>::infinity()) {
    throw error(name_of(q.coll), q.rank, error::unknown,
                "automatic: a plan round's fixed cost is " + std::to_string(round_seconds) +
                    " s; it must be a finite time, >= 0");
  }
  const bool rooted = q.coll == collective::broadcast || q.coll == collective::reduce;
  choice_key key{.coll = q.coll,
                 .size = q.size,
                 .count = q.count,
                 .root = rooted ? q.root : 0,
                 .element_size = q.element_size,
                 .node_of = q.node_of,
                 .device_of = device_of,
                 .peer_access = peer_access,
                 .messages = messages,
                 .devices_per_node = c.devices_per_node(),
                 .intra = c.intra(),
                 .inter = c.inter(),
                 .nics = c.nics_per_node(),
                 .reduce = c.reduce_bandwidth(),
                 .round_seconds = round_seconds};
  auto& cache = choices();
  {
    const std::lock_guard lock(cache.mutex);
    if (const auto it = cache.choices.find(key); it != cache.choices.end()) return it->second;
  }
  const auto table = algo::candidates();
  cheapest_plan best{table.size(), std::numeric_limits<double>::infinity()};
  for (std::size_t i = 0; i < table.size(); ++i) {
    const algo::candidate& a = table[i];
    if (!eligible(a, q, peer_access, messages)) continue;
    const std::vector<plan> plans = cost_model::plans_of(a.make_plan, q);
    const double t = cost_model::price(plans, c, device_of, q.element_size) +
                     round_seconds * static_cast<double>(rounds_of(plans));
    if (best.index == table.size() || t < best.seconds) best = {i, t};
  }
  {
    const std::lock_guard lock(cache.mutex);
    if (cache.choices.size() >= choice_cache::capacity) cache.choices.clear();
    cache.choices.emplace(std::move(key), best);
  }
  return best;
}

[[noreturn]] inline void no_candidate(const plan_request& q, bool peer_access, bool messages) {
  throw error(name_of(q.coll), q.rank, error::unknown,
              std::string("automatic: no algorithm plans ") + std::string(name_of(q.coll)) +
                  (peer_access ? "" : " without peer access") +
                  (messages ? "" : " without messages"));
}

} // namespace weft::detail

namespace weft::algo {

/// The candidate the cost model prices cheapest for q on cluster c, where rank r runs on
/// device device_of[r] (device r when empty). Hierarchical candidates only when q.node_of
/// spans more than one node; peer-access candidates only when peer_access. q.rank does not
/// matter. round_seconds: what the transport pays per round of a plan beyond its links (a
/// kernel launch per round on a GPU; weft::cuda::nccl declares it as plan_round_seconds()),
/// added once per round of the longest plan. Throws weft::error for a bad request, a
/// round_seconds that is not a finite time, or when no candidate plans q.coll.
WEFT_COLD inline const candidate& choose(const plan_request& q, const topology::cluster& c,
                                         const std::vector<int>& device_of, bool peer_access,
                                         bool messages = true, double round_seconds = 0) {
  const detail::cheapest_plan best =
      detail::cheapest(q, c, device_of, peer_access, messages, round_seconds);
  if (best.index == candidates().size()) detail::no_candidate(q, peer_access, messages);
  return candidates()[best.index];
}

/// What automatic takes for one call: weft's cheapest plan, or the communicator's own
/// collective (algo::vendor), with both prices.
struct choice {
  const candidate* plan = nullptr; // weft's cheapest candidate; null where none plans the call
  double plan_seconds = std::numeric_limits<double>::infinity(); // its modelled time
  std::optional<double> vendor_seconds; // the vendor collective's, where the call has one
  bool vendor = false;                  // the vendor collective is taken

  /// "vendor", or the name of the plan's algorithm.
  [[nodiscard]] std::string_view name() const noexcept {
    return vendor ? std::string_view("vendor") : plan->name;
  }
};

/// choose() (round_seconds as there), beside the communicator's own collective priced at
/// vendor_seconds (none: the communicator has no vendor collective for this call). The vendor
/// is taken unless a plan of weft's is priced lower: a tie goes to the vendor, and so does a
/// call no plan serves.
/// Throws weft::error for a bad request, a vendor price that is negative or NaN, or when
/// neither a plan nor the vendor serves the call.
WEFT_COLD inline choice choose_path(const plan_request& q, const topology::cluster& c,
                                    const std::vector<int>& device_of, bool peer_access,
                                    bool messages, std::optional<double> vendor_seconds,
                                    double round_seconds = 0) {
  if (vendor_seconds && !(*vendor_seconds >= 0)) {
    throw error(name_of(q.coll), q.rank, error::unknown,
                "automatic: the vendor collective's price is " + std::to_string(*vendor_seconds) +
                    " s; it must be a time, >= 0");
  }
  const detail::cheapest_plan best =
      detail::cheapest(q, c, device_of, peer_access, messages, round_seconds);
  choice out;
  out.vendor_seconds = vendor_seconds;
  if (best.index != candidates().size()) {
    out.plan = &candidates()[best.index];
    out.plan_seconds = best.seconds;
  }
  out.vendor = vendor_seconds && (out.plan == nullptr || *vendor_seconds <= out.plan_seconds);
  if (!out.vendor && out.plan == nullptr) detail::no_candidate(q, peer_access, messages);
  return out;
}

/// The policy: an explicit algorithm tag always overrides it. Given a cluster, a
/// communicator calls choose(); make_plan alone knows only the request, so it prices on
/// the default links (shared memory within a node, Ethernet between nodes, nodes as
/// node_of groups them) and picks among the algorithms every transport runs (no peer access).
struct automatic {
  static constexpr std::string_view name = "automatic";
  /// It plans every collective and needs nothing: it picks among the candidates the
  /// communicator runs.
  static constexpr capabilities caps{.serves = every_collective, .messages = false};

  static constexpr bool serves(collective c) { return caps.serves.contains(c); }

  WEFT_COLD static plan make_plan(const plan_request& q) {
    detail::check_request(q, name);
    // Devices numbered node-major, as a cluster numbers them.
    const detail::node_layout lay = detail::layout_nodes(q, name);
    std::vector<int> devices;
    std::vector<int> device_of(static_cast<std::size_t>(q.size));
    int first = 0;
    for (const auto& ranks : lay.ranks) {
      for (std::size_t j = 0; j < ranks.size(); ++j) {
        device_of[static_cast<std::size_t>(ranks[j])] = first + static_cast<int>(j);
      }
      devices.push_back(static_cast<int>(ranks.size()));
      first += static_cast<int>(ranks.size());
    }
    const topology::cluster c(devices, topology::default_link(topology::link_kind::shm),
                              topology::default_link(topology::link_kind::ethernet));
    return choose(q, c, device_of, false).make_plan(q);
  }
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
