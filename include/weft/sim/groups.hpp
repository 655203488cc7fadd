#pragma once
// Groups that run one collective at the same time on one cluster, priced together: their
// plans are merged into one plan per device (plan::append maps each group's ranks to its
// devices), so that groups sharing a node's NICs queue on them as they do when they run.
// This is how the simulator prices the local transport's emulated topologies: the cluster is
// the emulated one, and each group's plans are those its communicator would run.
//
//   2x4 cluster, TP groups {0,2,4,6} and {1,3,5,7}: both cross the nodes through the same NIC
//   per node, so together they take about twice as long as one alone.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>
#include <weft/sim/cost_model.hpp>
#include <weft/topology/topology.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace weft::sim {

/// Seconds until every group's `coll` of `count` elements of `element_size` bytes is done,
/// group g on devices groups[g] of `c`, all starting together. make_plan plans every group;
/// null: each group takes the algorithm algo::choose() prices cheapest for it alone (with
/// peer access when `peer_access`). Throws weft::error on a device used twice or outside `c`.
[[nodiscard]] inline double price_groups(collective coll,
                                         const std::vector<std::vector<int>>& groups,
                                         const topology::cluster& c, std::size_t count,
                                         std::size_t element_size,
                                         plan (*make_plan)(const plan_request&) = nullptr,
                                         bool peer_access = true) {
  std::vector<plan> world(static_cast<std::size_t>(c.size()));
  std::vector<char> used(static_cast<std::size_t>(c.size()), 0);
  for (int w = 0; w < c.size(); ++w)
    world[static_cast<std::size_t>(w)] =
        plan(plan_request{coll, c.size(), w, count, 0, {}, element_size});
  for (const auto& members : groups) {
    std::vector<int> node_of;
    for (int d : members) {
      if (d < 0 || d >= c.size() || used[static_cast<std::size_t>(d)])
        throw error("weft: sim: price_groups: device " + std::to_string(d) +
                    (d < 0 || d >= c.size() ? " is outside the cluster" : " is in two groups"));
      used[static_cast<std::size_t>(d)] = 1;
      node_of.push_back(c.node_of(d));
    }
    const plan_request q{coll,        static_cast<int>(members.size()), 0, count, 0, node_of,
                         element_size};
    plan (*make)(const plan_request&) = make_plan;
    if (make == nullptr) make = algo::choose(q, c, members, peer_access).make_plan;
    const auto plans = plans_of(make, q);
    for (std::size_t i = 0; i < members.size(); ++i)
      world[static_cast<std::size_t>(members[i])].append(plans[i], members, {buffer::input, 0},
                                                         {buffer::output, 0}, {buffer::scratch, 0});
  }
  return price(world, c, {}, element_size);
}

} // namespace weft::sim
