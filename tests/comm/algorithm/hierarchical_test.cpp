#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/plan_checks.hpp"

namespace {

using namespace weft::test::plan_testing;
namespace algo = weft::algo;

using ring_ring = algo::hierarchical<algo::ring, algo::ring>;
using ring_tree = algo::hierarchical<algo::ring, algo::tree>;
using direct_direct = algo::hierarchical<algo::direct, algo::direct>;
using direct_hd = algo::hierarchical<algo::direct, algo::halving_doubling>;
using direct_ring = algo::hierarchical<algo::direct, algo::ring>;

static_assert(algo::plan_generator<ring_ring>);
static_assert(std::is_same_v<algo::hierarchical<>, ring_ring>);
static_assert(ring_tree::name == "hierarchical<ring, tree>");
static_assert(algo::hierarchical<algo::ring, ring_ring>::name ==
              "hierarchical<ring, hierarchical<ring, ring>>");
static_assert(ring_ring::serves(collective::all_reduce) &&
              ring_ring::serves(collective::broadcast) && ring_ring::serves(collective::reduce));
static_assert(ring_tree::serves(collective::broadcast) && ring_tree::serves(collective::reduce));
// halving_doubling plans neither broadcast nor reduce, so the composition cannot either.
static_assert(direct_hd::serves(collective::all_reduce) &&
              !direct_hd::serves(collective::broadcast) && !direct_hd::serves(collective::reduce));
static_assert(ring_ring::serves(collective::reduce_scatter) &&
              ring_ring::serves(collective::all_gather) &&
              !ring_ring::serves(collective::all_to_all));
// tree plans neither all_gather nor reduce_scatter, so as Inter it cannot carry the rails.
static_assert(!ring_tree::serves(collective::all_gather) &&
              !ring_tree::serves(collective::reduce_scatter));

struct layout {
  std::string what;
  std::vector<int> node_of;
};

std::vector<int> nodes_of(std::vector<int> sizes) {
  std::vector<int> v;
  for (std::size_t n = 0; n < sizes.size(); ++n)
    v.insert(v.end(), static_cast<std::size_t>(sizes[n]), static_cast<int>(n));
  return v;
}

// The fewest ranks on a node, computed here from node_of.
int fewest(const std::vector<int>& node_of) {
  std::map<int, int> k;
  for (int n : node_of)
    ++k[n];
  int m = 1 << 30;
  for (auto [n, c] : k)
    m = std::min(m, c);
  return m;
}

const std::vector<layout>& layouts() {
  static const std::vector<layout> all = {
      {"2x4", nodes_of({4, 4})},
      {"3+5", nodes_of({3, 5})},
      {"1+2+3", nodes_of({1, 2, 3})},
      {"alternating 2x3", {0, 1, 0, 1, 0, 1}},
      {"scattered 3+2+2, unsorted ids", {7, 2, 7, 5, 2, 7, 5}},
      {"one node of 5", {0, 0, 0, 0, 0}},
      {"one rank per node", {0, 1, 2, 3}},
      {"two ranks, two nodes", {0, 1}},
      {"4+4+4+4 of 16", nodes_of({4, 4, 4, 4})},
      {"7+9", nodes_of({7, 9})},
  };
  return all;
}

std::vector<std::size_t> counts_for(const layout& l) {
  const auto p = l.node_of.size();
  const auto m = static_cast<std::size_t>(fewest(l.node_of));
  return {0, 1, m > 1 ? m - 1 : 2, m + 1, p - 1, p + 3, 1000, 4099};
}

template <class A>
void check_all_reduce_everywhere() {
  for (const layout& l : layouts()) {
    SCOPED_TRACE(l.what);
    const int p = static_cast<int>(l.node_of.size());
    for (std::size_t n : counts_for(l)) {
      check_plans<A, int>(collective::all_reduce, p, n, 0, pattern::exact, l.node_of);
      check_plans<A, float>(collective::all_reduce, p, n, 0, pattern::random, l.node_of);
    }
    check_plans<A, float, weft::op::max>(collective::all_reduce, p, 777, 0, pattern::exact,
                                         l.node_of);
    check_plans<A, double>(collective::all_reduce, p, 2049, 0, pattern::random, l.node_of);
    check_plans<A, std::int64_t, weft::op::prod>(collective::all_reduce, p, 301, 0, pattern::exact,
                                                 l.node_of);
    check_plans<A, weft::half>(collective::all_reduce, p, 129, 0, pattern::exact, l.node_of);
    check_plans<A, weft::bfloat16>(collective::all_reduce, p, 65, 0, pattern::exact, l.node_of);
  }
}

TEST(hierarchical, all_reduce_direct_direct) { check_all_reduce_everywhere<direct_direct>(); }
TEST(hierarchical, all_reduce_ring_ring) { check_all_reduce_everywhere<ring_ring>(); }
TEST(hierarchical, all_reduce_ring_tree) { check_all_reduce_everywhere<ring_tree>(); }
TEST(hierarchical, all_reduce_direct_halving_doubling) { check_all_reduce_everywhere<direct_hd>(); }
TEST(hierarchical, all_reduce_direct_ring) { check_all_reduce_everywhere<direct_ring>(); }

TEST(hierarchical, all_reduce_without_node_of_is_one_node) {
  for (int p : {1, 2, 3, 5, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(p + 3), std::size_t{1000}}) {
      check_plans<ring_ring, int>(collective::all_reduce, p, n);
      check_plans<direct_hd, int>(collective::all_reduce, p, n);
    }
  }
}

TEST(hierarchical, all_reduce_large) {
  check_plans<ring_ring, float>(collective::all_reduce, 8, std::size_t{1} << 18, 0, pattern::random,
                                nodes_of({3, 5}));
  check_plans<ring_tree, int>(collective::all_reduce, 6, (std::size_t{1} << 18) + 5, 0,
                              pattern::exact, {0, 1, 0, 1, 0, 1});
}

template <class A>
void check_rooted(collective c) {
  for (const layout& l : layouts()) {
    SCOPED_TRACE(l.what);
    const int p = static_cast<int>(l.node_of.size());
    for (int root = 0; root < p; ++root) {
      for (std::size_t n :
           {std::size_t{0}, std::size_t{1}, std::size_t(p + 3), std::size_t{1000}}) {
        check_plans<A, int>(c, p, n, root, pattern::exact, l.node_of);
      }
      check_plans<A, double>(c, p, 515, root, pattern::random, l.node_of);
    }
  }
  // Large enough that ring's chains and tree's halves are cut into several chunks.
  for (const auto& node_of : {nodes_of({3, 5}), std::vector<int>{0, 1, 0, 1, 0, 1}}) {
    const int p = static_cast<int>(node_of.size());
    check_plans<A, float, weft::op::min>(c, p, 300000, p - 1, pattern::exact, node_of);
  }
}

TEST(hierarchical, broadcast) {
  check_rooted<ring_ring>(collective::broadcast);
  check_rooted<ring_tree>(collective::broadcast);
  check_rooted<direct_direct>(collective::broadcast);
}

TEST(hierarchical, reduce) {
  check_rooted<ring_ring>(collective::reduce);
  check_rooted<ring_tree>(collective::reduce);
  check_rooted<direct_direct>(collective::reduce);
}

template <class A>
void check_rails_everywhere(collective c) {
  for (const layout& l : layouts()) {
    SCOPED_TRACE(l.what);
    const int p = static_cast<int>(l.node_of.size());
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t(p + 3), std::size_t{1000}}) {
      check_plans<A, int>(c, p, n, 0, pattern::exact, l.node_of);
      check_plans<A, float>(c, p, n, 0, pattern::random, l.node_of);
    }
    check_plans<A, double>(c, p, 515, 0, pattern::random, l.node_of);
    check_plans<A, weft::half>(c, p, 129, 0, pattern::exact, l.node_of);
    if (c == collective::reduce_scatter) {
      check_plans<A, float, weft::op::max>(c, p, 77, 0, pattern::exact, l.node_of);
      check_plans<A, std::int64_t, weft::op::prod>(c, p, 31, 0, pattern::exact, l.node_of);
    }
  }
  // Large enough that the ring's blocks are cut into several chunks.
  check_plans<A, float>(c, 8, std::size_t{1} << 16, 0, pattern::random, nodes_of({4, 4}));
  check_plans<A, int>(c, 6, (std::size_t{1} << 16) + 3, 0, pattern::exact, {0, 1, 0, 1, 0, 1});
}

TEST(hierarchical, all_gather) {
  check_rails_everywhere<ring_ring>(collective::all_gather);
  check_rails_everywhere<direct_direct>(collective::all_gather);
  check_rails_everywhere<direct_ring>(collective::all_gather);
  check_rails_everywhere<direct_hd>(collective::all_gather);
}

TEST(hierarchical, reduce_scatter) {
  check_rails_everywhere<ring_ring>(collective::reduce_scatter);
  check_rails_everywhere<direct_direct>(collective::reduce_scatter);
  check_rails_everywhere<direct_ring>(collective::reduce_scatter);
  check_rails_everywhere<direct_hd>(collective::reduce_scatter);
}

TEST(hierarchical, rejects_bad_requests) {
  const std::vector<int> two_nodes = {0, 0, 1, 1};
  EXPECT_THROW(ring_ring::make_plan({collective::all_reduce, 4, 4, 10, 0, two_nodes}), weft::error);
  EXPECT_THROW(ring_ring::make_plan({collective::all_reduce, 4, -1, 10, 0, two_nodes}),
               weft::error);
  EXPECT_THROW(ring_ring::make_plan({collective::broadcast, 4, 0, 10, 4, two_nodes}), weft::error);
  EXPECT_THROW(ring_ring::make_plan({collective::all_reduce, 4, 0, 10, 0, {0, 0, 1}}), weft::error);
  EXPECT_THROW(ring_ring::make_plan({collective::all_reduce, 4, 0, 10, 0, {0, 0, -1, 1}}),
               weft::error);
  EXPECT_THROW(ring_ring::make_plan({collective::all_to_all, 4, 0, 10, 0, two_nodes}), weft::error);
  EXPECT_THROW(ring_tree::make_plan({collective::all_gather, 4, 0, 10, 0, two_nodes}), weft::error);
  EXPECT_THROW(direct_hd::make_plan({collective::broadcast, 4, 0, 10, 0, two_nodes}), weft::error);
  EXPECT_NO_THROW(ring_ring::make_plan({collective::all_reduce, 4, 3, 10, 0, two_nodes}));
}

// Elements rank r sends, in all and to ranks on other nodes.
struct sent {
  std::size_t total = 0;
  std::size_t off_node = 0;
  std::set<int> peers;
};
sent sent_by(const plan& pl, const std::vector<int>& node_of) {
  sent s;
  for (const auto& x : pl.steps()) {
    if (x.kind != step_kind::send) continue;
    s.total += x.count;
    s.peers.insert(x.peer);
    if (node_of[static_cast<std::size_t>(x.peer)] != node_of[static_cast<std::size_t>(pl.rank())])
      s.off_node += x.count;
  }
  return s;
}

TEST(hierarchical, only_leader_blocks_cross_nodes) {
  // 2 nodes of 4, count 4c: ring reduce-scatter and all-gather over 4 leaders send 3c each,
  // the ring all-reduce of c elements between the two leaders j sends c; only that crosses.
  const std::vector<int> node_of = nodes_of({4, 4});
  const std::size_t c = 1000;
  for (int r = 0; r < 8; ++r) {
    const auto s =
        sent_by(ring_ring::make_plan({collective::all_reduce, 8, r, 4 * c, 0, node_of}), node_of);
    EXPECT_EQ(s.total, 3 * c + c + 3 * c) << r;
    EXPECT_EQ(s.off_node, c) << r;
    // Its ring neighbours on its node, and its counterpart on the other node.
    EXPECT_EQ(s.peers, (std::set<int>{r / 4 * 4 + (r + 1) % 4, (r + 4) % 8})) << r;
  }
  // The flat ring sends 2(p-1)/p of the data from every rank, and ranks 3 and 7 send all of
  // that across nodes.
  const auto flat =
      sent_by(algo::ring::make_plan({collective::all_reduce, 8, 3, 4 * c, 0, node_of}), node_of);
  EXPECT_EQ(flat.off_node, 7 * c);
}

TEST(hierarchical, all_gather_and_reduce_scatter_cross_nodes_once_per_rail) {
  // 2 nodes of 4, c elements per rank: each rank sends its rail peer one block (the Inter
  // ring of 2), and 3 blocks to its node's ring neighbour for each of the 2 nodes' blocks.
  const std::vector<int> node_of = nodes_of({4, 4});
  const std::size_t c = 1000;
  for (collective coll : {collective::all_gather, collective::reduce_scatter}) {
    for (int r = 0; r < 8; ++r) {
      const auto s = sent_by(ring_ring::make_plan({coll, 8, r, c, 0, node_of}), node_of);
      EXPECT_EQ(s.total, c + 2 * 3 * c) << name_of(coll) << " rank " << r;
      EXPECT_EQ(s.off_node, c) << name_of(coll) << " rank " << r;
      EXPECT_EQ(s.peers, (std::set<int>{r / 4 * 4 + (r + 1) % 4, (r + 4) % 8}))
          << name_of(coll) << " rank " << r;
    }
    // The flat ring's rank 3 sends all its 7 blocks across nodes.
    EXPECT_EQ(sent_by(algo::ring::make_plan({coll, 8, 3, c, 0, node_of}), node_of).off_node, 7 * c)
        << name_of(coll);
  }
}

TEST(hierarchical, extras_fold_into_leaders) {
  // Nodes of 3 and 5 ranks, count 9 (no tail): m = 3, so ranks 6 and 7 (local 3 and 4 of
  // node 1) hand their 9 elements to ranks 3 and 4 and get the result back from them.
  const std::vector<int> node_of = nodes_of({3, 5});
  for (int r : {6, 7}) {
    const plan pl = ring_ring::make_plan({collective::all_reduce, 8, r, 9, 0, node_of});
    const auto s = sent_by(pl, node_of);
    EXPECT_EQ(s.total, 9u);
    EXPECT_EQ(s.peers, std::set<int>{r - 3});
    ASSERT_EQ(pl.steps().size(), 2u);
    EXPECT_EQ(pl.steps()[1].kind, step_kind::recv);
    EXPECT_EQ(pl.steps()[1].peer, r - 3);
  }
  // A leader with an extra reduces it in instead of copying its input.
  const plan leader = ring_ring::make_plan({collective::all_reduce, 8, 3, 9, 0, node_of});
  EXPECT_EQ(leader.steps().front().kind, step_kind::recv_reduce);
  EXPECT_EQ(leader.steps().front().peer, 6);
  // Scratch: the leader's block of c = 3, then what ring's reduce-scatter of 3 ranks needs.
  const plan rs = algo::ring::make_plan({collective::reduce_scatter, 3, 0, 3, 0, {}});
  EXPECT_EQ(leader.scratch_count(), 3u + rs.scratch_count());
}

} // namespace
