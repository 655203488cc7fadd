#pragma once
// The plans of hierarchical<Intra, Inter> (comm/algorithm/hierarchical.hpp, whose header says
// what each collective does), written once for every pair of levels: the levels come in as
// plain functions, so each pair of tags instantiates only hierarchical's make_plan, not the
// plans. Planning code: it runs once per plan, whose result is cached.
#include <weft/comm/algorithm/detail/node_layout.hpp>
#include <weft/comm/plan.hpp>

#include <cstddef>
#include <numeric>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::detail {

/// hierarchical's two levels: Intra's and Inter's make_plan, and whether Intra plans
/// all_reduce (then one node's all-reduce is Intra's own).
struct level_planners {
  plan (*intra)(const plan_request&);
  plan (*inter)(const plan_request&);
  bool intra_all_reduces;
};

namespace hierarchical_steps {

using binding = plan::buffer_binding;

// Appends a level's plan for `rank` of the group `members` (ranks of the whole call).
inline void run_level(plan (*make_plan)(const plan_request&), plan& pl, const plan_request& q,
                      collective c, const std::vector<int>& members, int rank, std::size_t count,
                      int root, std::vector<int> node_of, binding in, binding out, binding scr) {
  const plan_request sub{
      c, static_cast<int>(members.size()), rank, count, root, std::move(node_of), q.element_size};
  pl.append(make_plan(sub), members, in, out, scr);
}

inline std::vector<int> iota(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

inline void hierarchical_all_reduce(plan& pl, const plan_request& q, const node_layout& lay,
                                    const level_planners& lv) {
  const int nodes = lay.nodes();
  const int m = lay.min_ranks_per_node();
  const auto ur = static_cast<std::size_t>(q.rank);
  const int node = lay.node[ur];
  const int j = lay.local[ur];
  const auto& mine = lay.ranks[static_cast<std::size_t>(node)];
  if (lv.intra_all_reduces) {
    if (nodes == 1) {
      run_level(lv.intra, pl, q, collective::all_reduce, mine, j, q.count, 0, {},
                {buffer::input, 0}, {buffer::output, 0}, {buffer::scratch, 0});
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
        run_level(lv.inter, pl, q, collective::all_reduce, peers, node, head, 0, iota(nodes),
                  {buffer::output, 0}, {buffer::output, 0}, {buffer::scratch, shared});
      } else {
        const std::vector<int> leaders(mine.begin(), mine.begin() + m);
        run_level(lv.intra, pl, q, collective::reduce_scatter, leaders, j, c, 0, {},
                  {buffer::output, 0}, {buffer::scratch, 0}, {buffer::scratch, shared});
        if (nodes > 1) {
          run_level(lv.inter, pl, q, collective::all_reduce, peers, node, c, 0, iota(nodes),
                    {buffer::scratch, 0}, {buffer::scratch, 0}, {buffer::scratch, shared});
        }
        run_level(lv.intra, pl, q, collective::all_gather, leaders, j, c, 0, {},
                  {buffer::scratch, 0}, {buffer::output, 0}, {buffer::scratch, shared});
      }
      for (int e : extras)
        pl.send(e, buffer::output, 0, head);
      pl.next_round();
    }
  }
  if (tail > 0) {
    run_level(lv.inter, pl, q, collective::all_reduce, iota(q.size), q.rank, tail, 0, q.node_of,
              {buffer::input, head}, {buffer::output, head}, {buffer::scratch, shared});
  }
}

inline bool consecutive(const std::vector<int>& ranks) {
  for (std::size_t k = 1; k < ranks.size(); ++k)
    if (ranks[k] != ranks[0] + static_cast<int>(k)) return false;
  return true;
}

// all_gather and reduce_scatter (see the header comment). Scratch: [0, rail) the rail's
// blocks, one per node; [rail, shared) a node's blocks where its ranks are not consecutive;
// the sub-plans' own scratch after that.
inline void hierarchical_over_rails(plan& pl, const plan_request& q, const node_layout& lay,
                                    const level_planners& lv) {
  const int nodes = lay.nodes();
  const int m = lay.min_ranks_per_node();
  if (nodes == 1 || m == 1 || !lay.uniform()) { // one level: the whole call by Intra or by Inter
    pl.append(nodes == 1 ? lv.intra(q) : lv.inter(q), iota(q.size), {buffer::input, 0},
              {buffer::output, 0}, {buffer::scratch, 0});
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
    run_level(lv.inter, pl, q, collective::all_gather, peers, node, c, 0, iota(nodes),
              {buffer::input, 0}, {buffer::scratch, 0}, sub_scratch);
    for (std::size_t n = 0; n < un; ++n) {
      const auto& members = lay.ranks[n];
      const bool direct = consecutive(members);
      const binding out = direct ? binding{buffer::output, static_cast<std::size_t>(members[0]) * c}
                                 : binding{buffer::scratch, rail};
      run_level(lv.intra, pl, q, collective::all_gather, mine, j, c, 0, {},
                {buffer::scratch, n * c}, out, sub_scratch);
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
      run_level(lv.intra, pl, q, collective::reduce_scatter, mine, j, c, 0, {}, in,
                {buffer::scratch, n * c}, sub_scratch);
    }
    run_level(lv.inter, pl, q, collective::reduce_scatter, peers, node, c, 0, iota(nodes),
              {buffer::scratch, 0}, {buffer::output, 0}, sub_scratch);
  }
}

// The rank that stands for its node: the root on the root's node, local rank 0 elsewhere.
inline std::vector<int> representatives(const plan_request& q, const node_layout& lay) {
  std::vector<int> reps;
  for (const auto& members : lay.ranks)
    reps.push_back(members.front());
  reps[static_cast<std::size_t>(lay.node[static_cast<std::size_t>(q.root)])] = q.root;
  return reps;
}

inline void hierarchical_broadcast(plan& pl, const plan_request& q, const node_layout& lay,
                                   const level_planners& lv) {
  const auto ur = static_cast<std::size_t>(q.rank);
  const int node = lay.node[ur];
  const auto& mine = lay.ranks[static_cast<std::size_t>(node)];
  const std::vector<int> reps = representatives(q, lay);
  const int rep = reps[static_cast<std::size_t>(node)];
  const binding out{buffer::output, 0};
  if (rep == q.rank && lay.nodes() > 1) {
    run_level(lv.inter, pl, q, collective::broadcast, reps, node, q.count,
              lay.node[static_cast<std::size_t>(q.root)], iota(lay.nodes()), out, out,
              {buffer::scratch, 0});
  }
  run_level(lv.intra, pl, q, collective::broadcast, mine, lay.local[ur], q.count,
            lay.local[static_cast<std::size_t>(rep)], {}, out, out, {buffer::scratch, 0});
}

// Each node's partial goes to scratch[0, count) of its representative (the root's partial
// too: the root's output is the Inter reduce's destination, which may not alias its input).
inline void hierarchical_reduce(plan& pl, const plan_request& q, const node_layout& lay,
                                const level_planners& lv) {
  const auto ur = static_cast<std::size_t>(q.rank);
  const int node = lay.node[ur];
  const auto& mine = lay.ranks[static_cast<std::size_t>(node)];
  const std::vector<int> reps = representatives(q, lay);
  const int rep = reps[static_cast<std::size_t>(node)];
  if (lay.nodes() == 1) {
    run_level(lv.intra, pl, q, collective::reduce, mine, lay.local[ur], q.count,
              lay.local[static_cast<std::size_t>(q.root)], {}, {buffer::input, 0},
              {buffer::output, 0}, {buffer::scratch, 0});
    return;
  }
  run_level(lv.intra, pl, q, collective::reduce, mine, lay.local[ur], q.count,
            lay.local[static_cast<std::size_t>(rep)], {}, {buffer::input, 0}, {buffer::scratch, 0},
            {buffer::scratch, q.count});
  if (rep == q.rank) {
    run_level(lv.inter, pl, q, collective::reduce, reps, node, q.count,
              lay.node[static_cast<std::size_t>(q.root)], iota(lay.nodes()), {buffer::scratch, 0},
              {buffer::output, 0}, {buffer::scratch, q.count});
  }
}

} // namespace hierarchical_steps

/// Appends hierarchical's plan of q.coll (all_reduce, broadcast, reduce, all_gather or
/// reduce_scatter) for q.rank, with the nodes of `lay`, to pl.
inline void hierarchical_plan(plan& pl, const plan_request& q, const node_layout& lay,
                              const level_planners& lv) {
  using namespace hierarchical_steps;
  switch (q.coll) {
    case collective::all_reduce: hierarchical_all_reduce(pl, q, lay, lv); break;
    case collective::broadcast: hierarchical_broadcast(pl, q, lay, lv); break;
    case collective::reduce: hierarchical_reduce(pl, q, lay, lv); break;
    case collective::all_gather:
    case collective::reduce_scatter: hierarchical_over_rails(pl, q, lay, lv); break;
    default: break;
  }
}

} // namespace weft::detail

#include <weft/core/detail/planning_end.hpp>
