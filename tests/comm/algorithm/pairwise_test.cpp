#include <weft/comm/algorithm/pairwise.hpp>

#include "support/plan_checks.hpp"

namespace {

using namespace weft::test::plan_testing;

TEST(pairwise, all_to_all_matches_the_reference) {
  for (int p : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}}) {
      check_plans<weft::algo::pairwise, int>(collective::all_to_all, p, n);
      check_plans<weft::algo::pairwise, double>(collective::all_to_all, p, n, 0, pattern::random);
      check_plans<weft::algo::pairwise, weft::half>(collective::all_to_all, p, n);
    }
  }
}

TEST(pairwise, each_round_is_a_permutation_and_moves_one_block) {
  const int p = 6;
  const std::size_t n = 10;
  std::vector<std::vector<int>> target(p); // target[round][rank]
  for (int r = 0; r < p; ++r) {
    const auto pl = weft::algo::pairwise::make_plan({collective::all_to_all, p, r, n, 0, {}, 4});
    EXPECT_EQ(pl.rounds(), static_cast<std::uint32_t>(p)); // own copy, then p-1 exchanges
    std::size_t sent = 0;
    for (const auto& s : pl.steps()) {
      if (s.kind != weft::step_kind::send) continue;
      sent += s.count;
      if (target.size() <= s.round) target.resize(s.round + 1);
      target[s.round].push_back(s.peer);
    }
    EXPECT_EQ(sent, (p - 1) * n);
  }
  for (std::size_t k = 1; k < target.size(); ++k) {
    std::vector<int> seen(p, 0);
    for (int t : target[k])
      ++seen[static_cast<std::size_t>(t)];
    for (int c : seen)
      EXPECT_EQ(c, 1) << "round " << k;
  }
}

TEST(pairwise, serves_only_all_to_all) {
  EXPECT_FALSE(weft::algo::pairwise::serves(collective::all_reduce));
  EXPECT_THROW(weft::algo::pairwise::make_plan({collective::all_reduce, 2, 0, 4, 0, {}, 4}),
               weft::error);
}

} // namespace
