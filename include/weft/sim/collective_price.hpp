#pragma once
// Collectives of a simulated step, priced: one group's collective by the cost model over the
// links a collective library achieves, the NICs shared by groups that run at once, and the
// link a group's traffic crosses.
//
//   links    the node's links at the calibrated share a collective library reaches, the plans'
//          bytes on them plus one link latency per round of the plan (a library streams a
//          ring's chunks; the cost model alone charges the latency per chunk); the TP
//          (or DP) groups with members on one node run their collectives at once and split
//          its NICs; groups over 64 ranks and messages over 64 MiB per rank are priced from
//          smaller plans and extrapolated (price_group), so a search stays fast.
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/plan.hpp>
#include <weft/sim/calibration.hpp>
#include <weft/sim/cost_model.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace weft::sim {

namespace detail {

/// The node's links as collectives achieve them.
inline topology::cluster achieved(const topology::cluster& c, const calibration& k) {
  topology::link intra = c.intra();
  topology::link inter = c.inter();
  intra.bandwidth *= k.nvlink_fraction;
  inter.bandwidth *= k.ib_fraction;
  return topology::cluster(c.devices_per_node(), intra, inter, c.nics_per_node(),
                           c.reduce_bandwidth());
}

inline double price_group(collective coll, const std::vector<int>& devices, std::size_t count,
                          std::size_t element_size, const topology::cluster& c);

/// Beyond this many bytes per rank a collective is priced at two smaller sizes and
/// extrapolated: past a few chunks per block its time is affine in the bytes (each extra
/// chunk adds one round of fixed cost and its bytes), and plans of gigabytes would take
/// seconds to build.
inline constexpr std::size_t extrapolate_above_bytes = std::size_t{64} << 20;

/// Groups larger than this are priced from two of their subgroups (the plans of p ranks hold
/// O(p^2) steps).
inline constexpr int max_priced_group = 64;

/// Prices `coll` of `count` elements of `element_size` bytes among `devices` with the ring,
/// and where the group spans nodes also the two-level ring (all-reduce; all-gather and
/// reduce-scatter over rails): the cheaper, as a collective library would pick.
inline double price_group(collective coll, const std::vector<int>& devices, std::size_t count,
                          std::size_t element_size, const topology::cluster& c) {
  const int n = static_cast<int>(devices.size());
  if (n <= 1 || count == 0) return 0;
  // Prices are kept: a search prices the same DP and TP groups for many variants.
  static std::mutex mutex;
  static std::map<std::tuple<int, std::vector<int>, std::size_t, std::size_t, std::string>, double>
      cache;
  auto key = std::make_tuple(static_cast<int>(coll), devices, count, element_size, c.to_string());
  {
    const std::lock_guard lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const auto keep = [&](double t) {
    const std::lock_guard lock(mutex);
    if (cache.size() > 4096) cache.clear();
    cache.emplace(std::move(key), t);
    return t;
  };
  if (n > max_priced_group) {
    // A collective of S bytes over p ranks costs about a (p - 1) + b (p - 1) / p (rounds of
    // fixed cost, and the share of the bytes each rank's link carries); fit a and b to the
    // plans of the group's first 32 and 64 members, whose placement repeats the group's.
    const bool per_rank = coll == collective::reduce_scatter || coll == collective::all_gather;
    const double total = static_cast<double>(count) * (per_rank ? n : 1);
    const auto at = [&](int q) {
      const std::vector<int> sub(devices.begin(), devices.begin() + q);
      const auto cq = static_cast<std::size_t>(per_rank ? total / q : total);
      return price_group(coll, sub, cq > 0 ? cq : 1, element_size, c);
    };
    const double p1 = max_priced_group / 2.0, p2 = max_priced_group;
    const double t1 = at(max_priced_group / 2), t2 = at(max_priced_group);
    // t = a (p-1) + b (p-1)/p at p1 and p2
    const double x1 = p1 - 1, y1 = (p1 - 1) / p1, x2 = p2 - 1, y2 = (p2 - 1) / p2;
    const double det = x1 * y2 - x2 * y1;
    const double a = (t1 * y2 - t2 * y1) / det;
    const double b = (x1 * t2 - x2 * t1) / det;
    return keep(std::max(t2, a * (n - 1) + b * (n - 1.0) / n));
  }
  if (count * element_size > extrapolate_above_bytes) {
    const std::size_t c2 = extrapolate_above_bytes / element_size;
    const std::size_t c1 = c2 / 2;
    const double t1 = price_group(coll, devices, c1, element_size, c);
    const double t2 = price_group(coll, devices, c2, element_size, c);
    return keep(t2 + (t2 - t1) / static_cast<double>(c2 - c1) * static_cast<double>(count - c2));
  }
  plan_request q;
  q.coll = coll;
  q.size = n;
  q.count = count;
  q.element_size = element_size;
  for (int d : devices)
    q.node_of.push_back(c.node_of(d));
  const bool spans = std::any_of(q.node_of.begin(), q.node_of.end(),
                                 [&](int x) { return x != q.node_of.front(); });
  // The cost model charges every message its link's latency in turn, as weft's transports
  // (and the emulated links) pay it; a collective library on real links streams a ring's
  // chunks back to back and pays the latency once per round. So: the plans' bytes on
  // latency-free links, plus one latency per round (the inter-node one when the group
  // spans nodes). Without this a ring of 1 MiB chunks on NVLink3 reaches two thirds of the
  // bus bandwidth nvlink_fraction stands for.
  const topology::link intra{c.intra().kind, c.intra().bandwidth, 0.0};
  const topology::link inter{c.inter().kind, c.inter().bandwidth, 0.0};
  const topology::cluster wire(c.devices_per_node(), intra, inter, c.nics_per_node(),
                               c.reduce_bandwidth());
  const double latency = spans ? std::max(c.intra().latency, c.inter().latency) : c.intra().latency;
  const auto streamed = [&](const std::vector<plan>& plans) {
    std::uint32_t rounds = 0;
    for (const plan& pl : plans)
      if (!pl.steps().empty()) rounds = std::max(rounds, pl.steps().back().round + 1);
    return price(plans, wire, devices, element_size) + rounds * latency;
  };
  double best = streamed(plans_of(&algo::ring::make_plan, q));
  if (spans && algo::hierarchical<algo::ring, algo::ring>::serves(coll))
    best = std::min(best,
                    streamed(plans_of(&algo::hierarchical<algo::ring, algo::ring>::make_plan, q)));
  return keep(best);
}

/// `c` as one of `sharing` groups that run at once with members on every node sees it: the
/// node's NICs split among them (rounded down); with more groups than NICs, one NIC at
/// nics / sharing of its bandwidth, the node's NIC bandwidth split evenly.
inline topology::cluster nic_share(const topology::cluster& c, int sharing) {
  const int nics = c.nics_per_node();
  if (sharing <= 1) return c;
  if (sharing <= nics)
    return topology::cluster(c.devices_per_node(), c.intra(), c.inter(), nics / sharing,
                             c.reduce_bandwidth());
  topology::link shared = c.inter();
  shared.bandwidth *= static_cast<double>(nics) / sharing;
  return topology::cluster(c.devices_per_node(), c.intra(), shared, 1, c.reduce_bandwidth());
}

inline std::string_view link_name(const std::vector<int>& devices, const topology::cluster& c) {
  if (devices.size() <= 1) return "none";
  for (int d : devices)
    if (c.node_of(d) != c.node_of(devices.front())) return topology::name_of(c.inter().kind);
  return topology::name_of(c.intra().kind);
}

/// Which members of a group share a node: each member's node, numbered in order of first
/// appearance ({0, 0, 1, 1}: the first two on one node, the others on another). The links are
/// the same on every node, so groups with one pattern cost the same.
inline std::vector<int> node_pattern(const std::vector<int>& devices, const topology::cluster& c) {
  std::vector<int> nodes, pattern;
  pattern.reserve(devices.size());
  for (int d : devices) {
    const int n = c.node_of(d);
    const auto it = std::find(nodes.begin(), nodes.end(), n);
    pattern.push_back(static_cast<int>(it - nodes.begin()));
    if (it == nodes.end()) nodes.push_back(n);
  }
  return pattern;
}

} // namespace detail

} // namespace weft::sim
