#pragma once
// hierarchical<Intra, Inter>: a collective in two levels, so that the slow inter-node link
// carries each node's data once. Intra runs among the ranks of one node, Inter among one
// rank per node. The all-reduce is the two-level reduce-scatter / all-reduce / all-gather of
// Horovod's hierarchical all-reduce (HOROVOD_HIERARCHICAL_ALLREDUCE: a reduce-scatter within
// each node, an all-reduce across nodes, an all-gather within each node; compare Jia et al.,
// "Highly scalable deep learning training system with mixed-precision", arXiv:1807.11205,
// 2018): after the intra-node reduce-scatter, leader j of every node holds block j of its
// node's sum, and only those blocks cross the network, 1/m of the data per leader.
//
//   all_reduce, nodes of 3 and 2 ranks (m = 2 leaders each; a1 is node a's rank 1),
//   head = the first c*m elements, c = count / m
//     fold        a2 -> a0 its head (leader j takes the extras j+m, j+2m, ...); a0 reduces
//     intra RS    a0 a1 | b0 b1: reduce-scatter the head, leader j keeps block j in scratch
//     inter AR    a0 <-> b0, a1 <-> b1: all-reduce block j among the leaders j
//     intra AG    a0 a1 | b0 b1: all-gather the blocks back into the head
//     unfold      a0 -> a2 the head
//     tail        the last count - c*m (< m) elements: one flat all-reduce with Inter
//   One leader per node (m = 1): fold, Inter all-reduce of the head, unfold. One node: Intra
//   all-reduce.
//
//   broadcast: Inter broadcast among one rank per node (the root on its node, local rank 0
//     elsewhere), then Intra broadcast within each node from that rank.
//   reduce: the mirror image, Intra reduce to that rank of each node, Inter reduce to root.
//
//   all_gather and reduce_scatter, over rails: local rank j of every node forms rail j, and
//   each rail crosses the network on its own (on a DGX, its own NIC), carrying 1/m of the
//   data, as NCCL's rings do with one channel per NIC. With every node holding m > 1 ranks:
//     all_gather      Inter all-gather of the rank's block along its rail, into scratch
//                     block n = the block of rank (node n, local j); then, for each node n,
//                     an Intra all-gather of block n, which lays node n's blocks in order
//     reduce_scatter  for each node n, an Intra reduce-scatter of the blocks bound for node
//                     n's ranks, local j keeping the node's partial of (node n, local j) in
//                     scratch block n; then an Inter reduce-scatter of those along the rail
//   Where node n's ranks are not consecutive, its blocks go through scratch with copies.
//   Nodes of different sizes, or of one rank each: one Inter collective over all ranks.
//
// Every element is reduced once, at one place, then only copied, so every rank ends with
// bitwise identical values. Nodes come from plan_request::node_of, numbered in increasing
// node_of (detail::node_layout, by_node_id); a node's ranks need not be contiguous, and nodes
// may hold different numbers of ranks.
//
// Scratch: [0, c) holds a leader's block; the sub-plans share the region after it, one at a
// time: a sub-plan's last round ends only when its messages have been received (and a
// peer-access plan ends with a sync), so the next may reuse the memory. The offsets are
// the same on every rank, which peer-access sub-plans (direct) need: they read a peer's
// buffer at their own offsets.
#include <weft/comm/algorithm/detail/hierarchical_plan.hpp>
#include <weft/comm/algorithm/detail/node_layout.hpp>
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/algorithm/ring.hpp>

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::algo {

template <class Intra = ring, class Inter = ring>
struct hierarchical {
  static_assert(plan_generator<Intra> && plan_generator<Inter>,
                "hierarchical<Intra, Inter>: Intra and Inter must be algorithm tags such as "
                "weft::algo::ring, tree, halving_doubling or direct");
  static_assert(Intra::serves(collective::reduce_scatter) && Intra::serves(collective::all_gather),
                "hierarchical<Intra, Inter>: Intra must plan reduce_scatter and all_gather; "
                "ring, halving_doubling and direct can (tree cannot)");
  static_assert(Inter::serves(collective::all_reduce),
                "hierarchical<Intra, Inter>: Inter must plan all_reduce; ring, tree, "
                "halving_doubling and direct can");

private:
  static constexpr detail::composed_name spelled{"hierarchical<", Intra::name, ", ", Inter::name,
                                                 ">"};

public:
  static constexpr std::string_view name = spelled.view();

  /// all_reduce always; broadcast and reduce where both levels plan them; reduce_scatter and
  /// all_gather where Inter plans them. Its plans load where a level's do, as the nodes fall
  /// (a transport without peer access refuses such a plan when it runs); the fold of a node's
  /// extra ranks sends.
  static constexpr capabilities caps{
      .serves =
          [] {
            collectives s = collectives_of(collective::all_reduce);
            for (const collective c : {collective::broadcast, collective::reduce}) {
              if (Intra::serves(c) && Inter::serves(c)) s = s.with(c);
            }
            for (const collective c : {collective::reduce_scatter, collective::all_gather}) {
              if (Inter::serves(c)) s = s.with(c);
            }
            return s;
          }(),
      .loads = capabilities_of<Intra>.loads == peer_loads::none &&
                       capabilities_of<Inter>.loads == peer_loads::none
                   ? peer_loads::none
                   : peer_loads::by_layout,
      .nodes = true};
  static constexpr bool serves(collective c) { return caps.serves.contains(c); }

  WEFT_COLD static plan make_plan(const plan_request& q) {
    detail::check_request(q, name);
    if (!serves(q.coll)) {
      throw error(name_of(q.coll), q.rank, error::unknown,
                  std::string(name) + " does not plan " + std::string(name_of(q.coll)));
    }
    const detail::node_layout lay = detail::layout_nodes(q, name);
    plan pl(q);
    if (q.size == 1) {
      if (q.coll != collective::broadcast) pl.copy(buffer::input, 0, buffer::output, 0, q.count);
      return pl;
    }
    detail::hierarchical_plan(pl, q, lay, planners);
    return pl;
  }

private:
  // The levels as plain functions: the plans themselves are written once, for every pair.
  static constexpr detail::level_planners planners{
      [](const plan_request& r) { return Intra::make_plan(r); },
      [](const plan_request& r) { return Inter::make_plan(r); },
      Intra::serves(collective::all_reduce)};
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
