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
#include <weft/comm/algorithm/detail/node_layout.hpp>
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/algorithm/ring.hpp>

#include <cstddef>
#include <initializer_list>
#include <numeric>
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
    switch (q.coll) {
      case collective::all_reduce: all_reduce(pl, q, lay); break;
      case collective::broadcast: broadcast(pl, q, lay); break;
      case collective::reduce: reduce(pl, q, lay); break;
      case collective::all_gather:
      case collective::reduce_scatter: over_rails(pl, q, lay); break;
      default: break;
    }
    return pl;
  }

private:
  using binding = plan::buffer_binding;

  // Appends algorithm A's plan for `rank` of the group `members` (ranks of the whole call).
  template <class A>
  static void run(plan& pl, const plan_request& q, collective c, const std::vector<int>& members,
                  int rank, std::size_t count, int root, std::vector<int> node_of, binding in,
                  binding out, binding scr) {
    const plan_request sub{
        c, static_cast<int>(members.size()), rank, count, root, std::move(node_of), q.element_size};
    pl.append(A::make_plan(sub), members, in, out, scr);
  }

  static std::vector<int> iota(int n) {
    std::vector<int> v(static_cast<std::size_t>(n));
    std::iota(v.begin(), v.end(), 0);
    return v;
  }

  static void all_reduce(plan& pl, const plan_request& q, const detail::node_layout& lay) {
    const int nodes = lay.nodes();
    const int m = lay.min_ranks_per_node();
    const auto ur = static_cast<std::size_t>(q.rank);
    const int node = lay.node[ur];
    const int j = lay.local[ur];
    const auto& mine = lay.ranks[static_cast<std::size_t>(node)];
    if constexpr (Intra::serves(collective::all_reduce)) {
      if (nodes == 1) {
        run<Intra>(pl, q, collective::all_reduce, mine, j, q.count, 0, {}, {buffer::input, 0},
                   {buffer::output, 0}, {buffer::scratch, 0});
        return;
      }
    }
    const std::size_t c = q.count / static_cast<std::size_t>(m);
    const std::size_t head = c * static_cast<std::size_t>(m);
    const std::size_t tail = q.count - head;
    const std::size_t shared = m > 1 ? c : 0; // where the sub-plans' scratch starts
    if (head > 0) {
      if (j >= m) {
        const int leader = mine[static_cast<std::size_t>(j % m)];
        pl.send(leader, buffer::input, 0, head);
        pl.next_round();
        pl.recv(leader, buffer::output, 0, head);
        pl.next_round();
      } else {
        std::vector<int> extras;
        for (std::size_t k = static_cast<std::size_t>(j + m); k < mine.size();
             k += static_cast<std::size_t>(m)) {
          extras.push_back(mine[k]);
        }
        // Peer-access sub-plans read the head from every leader's output, so it must be
        // there even on a leader with nothing to fold in.
        if (extras.empty()) pl.copy(buffer::input, 0, buffer::output, 0, head);
        for (std::size_t e = 0; e < extras.size(); ++e) {
          pl.recv_reduce(extras[e], e == 0 ? buffer::input : buffer::output, 0, buffer::output, 0,
                         head);
        }
        pl.next_round();
        std::vector<int> peers(static_cast<std::size_t>(nodes)); // leader j of every node
        for (int n = 0; n < nodes; ++n) {
          peers[static_cast<std::size_t>(n)] =
              lay.ranks[static_cast<std::size_t>(n)][static_cast<std::size_t>(j)];
        }
        if (m == 1) {
          run<Inter>(pl, q, collective::all_reduce, peers, node, head, 0, iota(nodes),
                     {buffer::output, 0}, {buffer::output, 0}, {buffer::scratch, shared});
        } else {
          const std::vector<int> leaders(mine.begin(), mine.begin() + m);
          run<Intra>(pl, q, collective::reduce_scatter, leaders, j, c, 0, {}, {buffer::output, 0},
                     {buffer::scratch, 0}, {buffer::scratch, shared});
          if (nodes > 1) {
            run<Inter>(pl, q, collective::all_reduce, peers, node, c, 0, iota(nodes),
                       {buffer::scratch, 0}, {buffer::scratch, 0}, {buffer::scratch, shared});
          }
          run<Intra>(pl, q, collective::all_gather, leaders, j, c, 0, {}, {buffer::scratch, 0},
                     {buffer::output, 0}, {buffer::scratch, shared});
        }
        for (int e : extras)
          pl.send(e, buffer::output, 0, head);
        pl.next_round();
      }
    }
    if (tail > 0) {
      run<Inter>(pl, q, collective::all_reduce, iota(q.size), q.rank, tail, 0, q.node_of,
                 {buffer::input, head}, {buffer::output, head}, {buffer::scratch, shared});
    }
  }

  static bool consecutive(const std::vector<int>& ranks) {
    for (std::size_t k = 1; k < ranks.size(); ++k)
      if (ranks[k] != ranks[0] + static_cast<int>(k)) return false;
    return true;
  }

  // all_gather and reduce_scatter (see the header comment). Scratch: [0, rail) the rail's
  // blocks, one per node; [rail, shared) a node's blocks where its ranks are not consecutive;
  // the sub-plans' own scratch after that.
  static void over_rails(plan& pl, const plan_request& q, const detail::node_layout& lay) {
    const int nodes = lay.nodes();
    const int m = lay.min_ranks_per_node();
    if (nodes == 1 || m == 1 || !lay.uniform()) { // one level: the whole call by Intra or by Inter
      pl.append(nodes == 1 ? Intra::make_plan(q) : Inter::make_plan(q), iota(q.size),
                {buffer::input, 0}, {buffer::output, 0}, {buffer::scratch, 0});
      return;
    }
    if (q.count == 0) return;
    const auto ur = static_cast<std::size_t>(q.rank);
    const int node = lay.node[ur];
    const int j = lay.local[ur];
    const auto& mine = lay.ranks[static_cast<std::size_t>(node)];
    const std::size_t c = q.count;
    const auto un = static_cast<std::size_t>(nodes);
    const std::size_t rail = un * c;
    bool all_consecutive = true;
    for (const auto& members : lay.ranks)
      all_consecutive = all_consecutive && consecutive(members);
    const std::size_t shared = rail + (all_consecutive ? 0 : static_cast<std::size_t>(m) * c);
    pl.need_scratch(shared);
    std::vector<int> peers(un); // local rank j of every node
    for (std::size_t n = 0; n < un; ++n)
      peers[n] = lay.ranks[n][static_cast<std::size_t>(j)];
    const binding sub_scratch{buffer::scratch, shared};
    if (q.coll == collective::all_gather) {
      run<Inter>(pl, q, collective::all_gather, peers, node, c, 0, iota(nodes), {buffer::input, 0},
                 {buffer::scratch, 0}, sub_scratch);
      for (std::size_t n = 0; n < un; ++n) {
        const auto& members = lay.ranks[n];
        const bool direct = consecutive(members);
        const binding out = direct
                                ? binding{buffer::output, static_cast<std::size_t>(members[0]) * c}
                                : binding{buffer::scratch, rail};
        run<Intra>(pl, q, collective::all_gather, mine, j, c, 0, {}, {buffer::scratch, n * c}, out,
                   sub_scratch);
        if (!direct) {
          pl.next_round();
          for (std::size_t k = 0; k < members.size(); ++k)
            pl.copy(buffer::scratch, rail + k * c, buffer::output,
                    static_cast<std::size_t>(members[k]) * c, c);
          pl.next_round();
        }
      }
    } else {
      for (std::size_t n = 0; n < un; ++n) {
        const auto& members = lay.ranks[n];
        const bool direct = consecutive(members);
        if (!direct) {
          pl.next_round();
          for (std::size_t k = 0; k < members.size(); ++k)
            pl.copy(buffer::input, static_cast<std::size_t>(members[k]) * c, buffer::scratch,
                    rail + k * c, c);
          pl.next_round();
        }
        const binding in = direct ? binding{buffer::input, static_cast<std::size_t>(members[0]) * c}
                                  : binding{buffer::scratch, rail};
        run<Intra>(pl, q, collective::reduce_scatter, mine, j, c, 0, {}, in,
                   {buffer::scratch, n * c}, sub_scratch);
      }
      run<Inter>(pl, q, collective::reduce_scatter, peers, node, c, 0, iota(nodes),
                 {buffer::scratch, 0}, {buffer::output, 0}, sub_scratch);
    }
  }

  // The rank that stands for its node: the root on the root's node, local rank 0 elsewhere.
  static std::vector<int> representatives(const plan_request& q, const detail::node_layout& lay) {
    std::vector<int> reps;
    for (const auto& members : lay.ranks)
      reps.push_back(members.front());
    reps[static_cast<std::size_t>(lay.node[static_cast<std::size_t>(q.root)])] = q.root;
    return reps;
  }

  static void broadcast(plan& pl, const plan_request& q, const detail::node_layout& lay) {
    const auto ur = static_cast<std::size_t>(q.rank);
    const int node = lay.node[ur];
    const auto& mine = lay.ranks[static_cast<std::size_t>(node)];
    const std::vector<int> reps = representatives(q, lay);
    const int rep = reps[static_cast<std::size_t>(node)];
    const binding out{buffer::output, 0};
    if (rep == q.rank && lay.nodes() > 1) {
      run<Inter>(pl, q, collective::broadcast, reps, node, q.count,
                 lay.node[static_cast<std::size_t>(q.root)], iota(lay.nodes()), out, out,
                 {buffer::scratch, 0});
    }
    run<Intra>(pl, q, collective::broadcast, mine, lay.local[ur], q.count,
               lay.local[static_cast<std::size_t>(rep)], {}, out, out, {buffer::scratch, 0});
  }

  // Each node's partial goes to scratch[0, count) of its representative (the root's partial
  // too: the root's output is the Inter reduce's destination, which may not alias its input).
  static void reduce(plan& pl, const plan_request& q, const detail::node_layout& lay) {
    const auto ur = static_cast<std::size_t>(q.rank);
    const int node = lay.node[ur];
    const auto& mine = lay.ranks[static_cast<std::size_t>(node)];
    const std::vector<int> reps = representatives(q, lay);
    const int rep = reps[static_cast<std::size_t>(node)];
    if (lay.nodes() == 1) {
      run<Intra>(pl, q, collective::reduce, mine, lay.local[ur], q.count,
                 lay.local[static_cast<std::size_t>(q.root)], {}, {buffer::input, 0},
                 {buffer::output, 0}, {buffer::scratch, 0});
      return;
    }
    run<Intra>(pl, q, collective::reduce, mine, lay.local[ur], q.count,
               lay.local[static_cast<std::size_t>(rep)], {}, {buffer::input, 0},
               {buffer::scratch, 0}, {buffer::scratch, q.count});
    if (rep == q.rank) {
      run<Inter>(pl, q, collective::reduce, reps, node, q.count,
                 lay.node[static_cast<std::size_t>(q.root)], iota(lay.nodes()),
                 {buffer::scratch, 0}, {buffer::output, 0}, {buffer::scratch, q.count});
    }
  }
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
