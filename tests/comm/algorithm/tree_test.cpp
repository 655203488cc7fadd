#include <weft/comm/algorithm/tree.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "support/plan_checks.hpp"

namespace {

using namespace weft::test::plan_testing;
using tree = weft::algo::tree;

constexpr collective served[] = {collective::all_reduce, collective::broadcast, collective::reduce};
static_assert(serves_exactly<tree>(served));

// --- the shape of the trees -----------------------------------------------------------------

struct hand_shape {
  int p;
  std::vector<int> parent1; // parent of each rank in tree 1, -1 at the root
  std::vector<int> parent2; // the same in tree 2
};

// Drawn by hand from the in-order numbering (node v = rank + 1; a node with lowest set bit
// 2^k has children v -/+ 2^(k-1); the root is the largest power of two <= p) and, for tree 2,
// by moving every rank i of tree 1 to i + 1 mod p.
const std::vector<hand_shape>& hand_shapes() {
  static const std::vector<hand_shape> shapes = {
      {1, {-1}, {-1}},
      {2, {1, -1}, {-1, 0}},
      {3, {1, -1, 1}, {2, 2, -1}},
      {4, {1, 3, 1, -1}, {-1, 2, 0, 2}},
      {5, {1, 3, 1, -1, 3}, {4, 2, 4, 2, -1}},
      {6, {1, 3, 1, -1, 5, 3}, {4, 2, 4, 2, -1, 0}},
      {7, {1, 3, 1, -1, 5, 3, 5}, {6, 2, 4, 2, -1, 6, 4}},
      {8, {1, 3, 1, 7, 5, 3, 5, -1}, {-1, 2, 4, 2, 0, 6, 4, 6}},
      {9, {1, 3, 1, 7, 5, 3, 5, -1, 7}, {8, 2, 4, 2, 8, 6, 4, 6, -1}},
      {16,
       {1, 3, 1, 7, 5, 3, 5, 15, 9, 11, 9, 7, 13, 11, 13, -1},
       {-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8, 14, 12, 14}},
  };
  return shapes;
}

TEST(tree, shape_by_hand) {
  for (const auto& want : hand_shapes()) {
    SCOPED_TRACE("p=" + std::to_string(want.p));
    const auto trees = weft::detail::double_binary_tree(want.p);
    EXPECT_EQ(trees[0].parent, want.parent1);
    EXPECT_EQ(trees[1].parent, want.parent2);
    for (int t = 0; t < 2; ++t) {
      const auto& tr = trees[static_cast<std::size_t>(t)];
      const auto& par = t == 0 ? want.parent1 : want.parent2;
      EXPECT_EQ(tr.root, static_cast<int>(std::find(par.begin(), par.end(), -1) - par.begin()));
      // The children lists hold exactly the ranks whose parent is this rank.
      for (int r = 0; r < want.p; ++r) {
        std::vector<int> kids;
        for (int c : tr.children[static_cast<std::size_t>(r)]) {
          if (c >= 0) kids.push_back(c);
        }
        std::vector<int> expect;
        for (int c = 0; c < want.p; ++c) {
          if (par[static_cast<std::size_t>(c)] == r) expect.push_back(c);
        }
        std::sort(kids.begin(), kids.end());
        EXPECT_EQ(kids, expect) << "tree " << t + 1 << " rank " << r;
        // A right child never comes without a left one.
        const auto& lr = tr.children[static_cast<std::size_t>(r)];
        EXPECT_TRUE(lr[1] < 0 || lr[0] >= 0) << "tree " << t + 1 << " rank " << r;
      }
    }
  }
}

TEST(tree, left_right_heights_and_depths_by_hand) {
  using arr = std::array<int, 2>;
  // p = 9: tree 1 root 7 has children 3 (left) and 8 (right); tree 2 root 8 has 4 and 0.
  const auto t9 = weft::detail::double_binary_tree(9);
  EXPECT_EQ(t9[0].children[7], (arr{3, 8}));
  EXPECT_EQ(t9[1].children[8], (arr{4, 0}));
  EXPECT_EQ(t9[0].children[8], (arr{-1, -1}));
  EXPECT_EQ(t9[0].height[7], 3);
  EXPECT_EQ(t9[0].height[3], 2);
  EXPECT_EQ(t9[0].height[5], 1);
  EXPECT_EQ(t9[0].height[8], 0);
  EXPECT_EQ(t9[0].depth[8], 1);
  EXPECT_EQ(t9[0].depth[0], 3);
  EXPECT_EQ(t9[1].depth[1], 3);
  EXPECT_EQ(t9[1].depth[0], 1);
  // p = 6: tree 1 rank 5 has only a left child, 4; tree 2 rank 0 only 5.
  const auto t6 = weft::detail::double_binary_tree(6);
  EXPECT_EQ(t6[0].children[5], (arr{4, -1}));
  EXPECT_EQ(t6[1].children[0], (arr{5, -1}));
  EXPECT_EQ(t6[0].children[3], (arr{1, 5}));
  // p = 16: the root (15 in tree 1, 0 in tree 2) has one child; rank 0 is 4 levels down.
  const auto t16 = weft::detail::double_binary_tree(16);
  EXPECT_EQ(t16[0].children[15], (arr{7, -1}));
  EXPECT_EQ(t16[1].children[0], (arr{8, -1}));
  EXPECT_EQ(t16[0].depth[0], 4);
  EXPECT_EQ(t16[0].height[15], 4);
  EXPECT_EQ(t16[1].height[0], 4);
  EXPECT_THROW((void)weft::detail::double_binary_tree(0), weft::error);
}

void in_order(const weft::detail::tree_links& tr, int r, std::vector<int>& out) {
  if (r < 0) return;
  in_order(tr, tr.children[static_cast<std::size_t>(r)][0], out);
  out.push_back(r);
  in_order(tr, tr.children[static_cast<std::size_t>(r)][1], out);
}

TEST(tree, shape_properties_up_to_100_ranks) {
  for (int p = 1; p <= 100; ++p) {
    SCOPED_TRACE("p=" + std::to_string(p));
    const auto trees = weft::detail::double_binary_tree(p);
    int floor_log2 = 0;
    while ((2 << floor_log2) <= p)
      ++floor_log2;
    for (int t = 0; t < 2; ++t) {
      const auto& tr = trees[static_cast<std::size_t>(t)];
      // In order, tree 1 lists the ranks 0..p-1 and tree 2 the ranks 1..p-1, 0.
      std::vector<int> seq;
      in_order(tr, tr.root, seq);
      ASSERT_EQ(seq.size(), static_cast<std::size_t>(p));
      for (int i = 0; i < p; ++i)
        EXPECT_EQ(seq[static_cast<std::size_t>(i)], (i + t) % p);
      // Depth: the tree has ceil(log2(p + 1)) levels.
      EXPECT_EQ(tr.height[static_cast<std::size_t>(tr.root)], floor_log2);
      EXPECT_EQ(*std::max_element(tr.depth.begin(), tr.depth.end()), floor_log2);
      for (int r = 0; r < p; ++r) {
        const int up = tr.parent[static_cast<std::size_t>(r)];
        const int want_depth = up < 0 ? 0 : tr.depth[static_cast<std::size_t>(up)] + 1;
        EXPECT_EQ(tr.depth[static_cast<std::size_t>(r)], want_depth);
      }
    }
    // Every rank is interior in at most one tree.
    for (int r = 0; r < p; ++r) {
      EXPECT_TRUE(trees[0].leaf(r) || trees[1].leaf(r)) << "rank " << r;
    }
  }
}

// --- plan shape ---------------------------------------------------------------------------

std::vector<weft::plan> plans_of(collective c, int p, std::size_t count, int root = 0) {
  std::vector<weft::plan> plans;
  for (int r = 0; r < p; ++r)
    plans.push_back(tree::make_plan({c, p, r, count, root, {}, 4}));
  return plans;
}

// Steps of a lockstep execution: a round takes one step, a rank's rounds run in order, and
// the send and the receive of a message fall in the same step. The least such assignment,
// found by relaxation, measures the latency in rounds whatever the plans number them.
int lockstep_rounds(const std::vector<weft::plan>& plans) {
  const std::size_t p = plans.size();
  std::vector<std::vector<int>> step(p);
  for (std::size_t r = 0; r < p; ++r) {
    step[r].resize(plans[r].rounds());
    for (std::size_t i = 0; i < step[r].size(); ++i)
      step[r][i] = static_cast<int>(i);
  }
  // The k-th message from a to b pairs a's k-th send to b with b's k-th receive from a.
  std::map<std::pair<int, int>, std::vector<std::uint32_t>> sends, recvs;
  for (std::size_t r = 0; r < p; ++r) {
    for (const auto& s : plans[r].steps()) {
      if (s.kind == weft::step_kind::send) sends[{static_cast<int>(r), s.peer}].push_back(s.round);
      if (s.kind == weft::step_kind::recv || s.kind == weft::step_kind::recv_reduce) {
        recvs[{s.peer, static_cast<int>(r)}].push_back(s.round);
      }
    }
  }
  std::vector<std::array<std::size_t, 4>> pairs; // sender, its round, receiver, its round
  for (const auto& [key, rounds] : sends) {
    const auto& other = recvs[key];
    EXPECT_EQ(rounds.size(), other.size());
    for (std::size_t k = 0; k < std::min(rounds.size(), other.size()); ++k) {
      pairs.push_back({static_cast<std::size_t>(key.first), rounds[k],
                       static_cast<std::size_t>(key.second), other[k]});
    }
  }
  // A consistent set of plans needs no more steps than it has rounds in all; more means the
  // messages pair up in a cycle (the plans would deadlock), and the relaxation would not end.
  int bound = 0;
  for (const auto& s : step)
    bound += static_cast<int>(s.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& s : step) {
      if (!s.empty() && s.back() > bound) {
        ADD_FAILURE() << "the plans' messages pair up in a cycle";
        return -1;
      }
    }
    for (const auto& m : pairs) {
      int& a = step[m[0]][m[1]];
      int& b = step[m[2]][m[3]];
      if (a != b) {
        a = b = std::max(a, b);
        changed = true;
      }
    }
    for (auto& s : step) {
      for (std::size_t i = 1; i < s.size(); ++i) {
        if (s[i] <= s[i - 1]) {
          s[i] = s[i - 1] + 1;
          changed = true;
        }
      }
    }
  }
  int last = -1;
  for (const auto& s : step) {
    if (!s.empty()) last = std::max(last, s.back());
  }
  return last + 1;
}

TEST(tree, one_chunk_all_reduce_takes_logarithmic_rounds) {
  // Up and down a tree of floor(log2 p) levels below the root: 2 floor(log2 p) rounds.
  const std::map<int, int> want = {{2, 2}, {3, 2}, {4, 4}, {5, 4}, {6, 4},
                                   {7, 4}, {8, 6}, {9, 6}, {16, 8}};
  for (const auto& [p, rounds] : want) {
    EXPECT_EQ(lockstep_rounds(plans_of(collective::all_reduce, p, 1000)), rounds) << "p=" << p;
  }
  // A ring all-reduce needs 2(p - 1) = 30 rounds on 16 ranks.
  EXPECT_LT(lockstep_rounds(plans_of(collective::all_reduce, 16, 1000)), 2 * (16 - 1));
  // Broadcast and reduce: one step from the root to the tree roots, then floor(log2(p - 1)).
  EXPECT_EQ(lockstep_rounds(plans_of(collective::broadcast, 16, 1000, 5)), 4);
  EXPECT_EQ(lockstep_rounds(plans_of(collective::reduce, 16, 1000, 11)), 4);
  EXPECT_EQ(lockstep_rounds(plans_of(collective::broadcast, 2, 1000, 1)), 1);
  EXPECT_EQ(lockstep_rounds(plans_of(collective::reduce, 9, 1000, 0)), 4);
}

TEST(tree, chunks_are_pipelined) {
  // Four chunks per tree (floats): m + 2H - 1 = 4 + 2*2 - 1 = 7 rounds on 4 ranks, where
  // sending the chunks one after the other would take 4 * 2H = 16.
  const std::size_t chunk = tree::chunk_bytes / 4;
  EXPECT_EQ(lockstep_rounds(plans_of(collective::all_reduce, 4, 2 * 4 * chunk)), 7);
  // One element more makes five chunks in tree 1.
  EXPECT_EQ(lockstep_rounds(plans_of(collective::all_reduce, 4, 2 * 4 * chunk + 1)), 8);
  // Broadcast over 8 ranks (trees over 7: H' = 2), 3 chunks per tree: 3 + 2 = 5.
  EXPECT_EQ(lockstep_rounds(plans_of(collective::broadcast, 8, 2 * 3 * chunk, 3)), 5);
  EXPECT_EQ(lockstep_rounds(plans_of(collective::reduce, 8, 2 * 3 * chunk, 6)), 5);
}

std::vector<std::size_t> sent_per_rank(const std::vector<weft::plan>& plans) {
  std::vector<std::size_t> sent;
  for (const auto& pl : plans)
    sent.push_back(elements_sent(pl));
  return sent;
}

TEST(tree, elements_sent_per_rank) {
  using v = std::vector<std::size_t>;
  // p = 4, 10 elements, halves of 5. Tree 1: 3 -> 1 -> {0, 2}; tree 2: 0 -> 2 -> {1, 3}.
  // all_reduce: up once to the parent, down once to each child, per tree.
  //   rank 0: 5 up (tree 1) + 5 down to 2 (tree 2) = 10; rank 1: 5 up + 10 down + 5 up = 20;
  //   rank 2: 5 up + 5 up + 10 down = 20; rank 3: 5 down + 5 up = 10.
  EXPECT_EQ(sent_per_rank(plans_of(collective::all_reduce, 4, 10)), (v{10, 20, 20, 10}));
  // broadcast from 0: the trees span ranks 1, 2, 3 as members 0, 1, 2, so tree 1 is
  // 2 -> {1, 3} and tree 2 is 3 -> {2, 1}. The root sends a half to each tree root.
  EXPECT_EQ(sent_per_rank(plans_of(collective::broadcast, 4, 10, 0)), (v{10, 0, 10, 10}));
  // reduce to 0, the mirror image: rank 1 is a leaf twice, 2 and 3 send their halves up.
  EXPECT_EQ(sent_per_rank(plans_of(collective::reduce, 4, 10, 0)), (v{0, 10, 10, 10}));
  // Every edge of both trees carries its half up and down: 2 (p - 1) n in all, as a ring.
  for (int p : {2, 3, 5, 8, 9, 16}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{101}, std::size_t{70000}}) {
      const auto all = sent_per_rank(plans_of(collective::all_reduce, p, n));
      EXPECT_EQ(std::accumulate(all.begin(), all.end(), std::size_t{0}),
                2 * static_cast<std::size_t>(p - 1) * n);
      const auto bc = sent_per_rank(plans_of(collective::broadcast, p, n, p / 2));
      EXPECT_EQ(std::accumulate(bc.begin(), bc.end(), std::size_t{0}),
                static_cast<std::size_t>(p - 1) * n);
    }
  }
}

TEST(tree, reduce_scratch_holds_one_half_at_interior_ranks) {
  // reduce to 0 on 4 ranks, 10 elements: rank 2 is interior in tree 1 only, rank 3 in tree 2
  // only, rank 1 nowhere; the root accumulates in its output. Rank 3's half starts at input[5]
  // (4-byte elements: 4 bytes past a 16-byte boundary), so it sits at scratch[1], as far past one.
  const auto plans = plans_of(collective::reduce, 4, 10, 0);
  const std::vector<std::size_t> want = {0, 0, 5, 6};
  for (int r = 0; r < 4; ++r)
    EXPECT_EQ(plans[static_cast<std::size_t>(r)].scratch_count(),
              want[static_cast<std::size_t>(r)]);
  for (const auto& pl : plans_of(collective::all_reduce, 9, 1000))
    EXPECT_EQ(pl.scratch_count(), 0u);
}

TEST(tree, rejects_bad_requests) {
  EXPECT_THROW((void)tree::make_plan({collective::all_reduce, 4, 4, 10, 0, {}, 4}), weft::error);
  EXPECT_THROW((void)tree::make_plan({collective::all_reduce, 4, -1, 10, 0, {}, 4}), weft::error);
  EXPECT_THROW((void)tree::make_plan({collective::broadcast, 4, 0, 10, 4, {}, 4}), weft::error);
  EXPECT_THROW((void)tree::make_plan({collective::reduce, 3, 0, 10, -1, {}, 4}), weft::error);
  EXPECT_THROW((void)tree::make_plan({collective::all_reduce, 0, 0, 10, 0, {}, 4}), weft::error);
  EXPECT_THROW((void)tree::make_plan({collective::all_gather, 4, 0, 10, 0, {}, 4}), weft::error);
  EXPECT_THROW((void)tree::make_plan({collective::reduce_scatter, 4, 0, 10, 0, {}, 4}),
               weft::error);
  EXPECT_THROW((void)tree::make_plan({collective::all_to_all, 4, 0, 10, 0, {}, 4}), weft::error);
}

// --- results, against the serial reference -------------------------------------------------

constexpr std::array<int, 10> sizes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};

TEST(tree, every_collective_every_size) {
  for (collective c : served) {
    for (int p : sizes) {
      const auto up = static_cast<std::size_t>(p);
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, up - 1, up + 3, std::size_t{5000}}) {
        check_plans<tree, int>(c, p, n, p - 1);
        check_plans<tree, float, weft::op::max>(c, p, n, 0);
        check_plans<tree, float, weft::op::min>(c, p, n, p / 2);
        check_plans<tree, double>(c, p, n, (p + 1) / 3, pattern::random);
        check_plans<tree, std::int64_t, weft::op::prod>(c, p, n, p / 3);
        check_plans<tree, weft::half>(c, p, n, 0);
        check_plans<tree, weft::bfloat16>(c, p, n, p - 1);
      }
    }
  }
}

TEST(tree, every_root) {
  for (collective c : {collective::broadcast, collective::reduce}) {
    for (int p : sizes) {
      for (int root = 0; root < p; ++root) {
        for (std::size_t n : {std::size_t{1}, std::size_t(p + 3), std::size_t{777}}) {
          check_plans<tree, int>(c, p, n, root);
          check_plans<tree, double>(c, p, n, root, pattern::random);
        }
      }
    }
  }
}

TEST(tree, many_chunks) {
  // Five chunks per tree (of at most 32768 floats), a count that splits unevenly.
  const std::size_t n = 9 * (tree::chunk_bytes / 4) + 12345;
  for (collective c : served) {
    for (int p : {2, 3, 5, 16}) {
      check_plans<tree, float>(c, p, n, p - 1, pattern::random);
      check_plans<tree, std::int32_t>(c, p, n, 1 % p);
    }
  }
}

TEST(tree, large) {
  check_plans<tree, float>(collective::all_reduce, 6, std::size_t{1} << 20, 0, pattern::random);
  check_plans<tree, float>(collective::broadcast, 7, std::size_t{1} << 20, 3, pattern::random);
  check_plans<tree, float>(collective::reduce, 7, std::size_t{1} << 20, 4, pattern::random);
}

} // namespace
