#include <weft/comm/algorithm/recursive_doubling.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "support/plan_checks.hpp"

namespace {

using namespace weft::test::plan_testing;
using weft::algo::recursive_doubling;

constexpr collective served[] = {collective::all_reduce};
static_assert(serves_exactly<recursive_doubling>(served));

constexpr int sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17};

constexpr planner<recursive_doubling> make{};

TEST(recursive_doubling, integers_sum_exact) {
  for (int p : sizes) {
    for (std::size_t n : counts_for(p))
      check_plans<recursive_doubling, int>(collective::all_reduce, p, n);
  }
}

TEST(recursive_doubling, floats_min_max_avg) {
  for (int p : sizes) {
    for (std::size_t n : counts_for(p)) {
      check_plans<recursive_doubling, float, weft::op::max>(collective::all_reduce, p, n);
      check_plans<recursive_doubling, float, weft::op::min>(collective::all_reduce, p, n);
      check_plans<recursive_doubling, double, weft::op::avg>(collective::all_reduce, p, n);
    }
  }
}

TEST(recursive_doubling, random_sums_and_products) {
  for (int p : sizes) {
    for (std::size_t n : counts_for(p)) {
      check_plans<recursive_doubling, double>(collective::all_reduce, p, n, 0, pattern::random);
      check_plans<recursive_doubling, float>(collective::all_reduce, p, n, 0, pattern::random);
      check_plans<recursive_doubling, std::int64_t, weft::op::prod>(collective::all_reduce, p, n, 0,
                                                                    pattern::random);
    }
  }
}

TEST(recursive_doubling, half_and_bfloat16_sum) {
  for (int p : sizes) {
    for (std::size_t n : counts_for(p)) {
      check_plans<recursive_doubling, weft::half>(collective::all_reduce, p, n, 0, pattern::random);
      check_plans<recursive_doubling, weft::bfloat16>(collective::all_reduce, p, n, 0,
                                                      pattern::random);
    }
  }
}

// Both partners of a round compute the same partial; they must do it in the same operand
// order, or min(+0, -0) (which returns its left operand) differs between them.
TEST(recursive_doubling, signed_zeros_identical_on_every_rank) {
  for (int p : sizes) {
    std::vector<plan> plans;
    for (int r = 0; r < p; ++r)
      plans.push_back(make(collective::all_reduce, p, r, 4));
    std::vector<weft::detail::model_rank<float>> ranks(static_cast<std::size_t>(p));
    for (int r = 0; r < p; ++r) {
      auto& rk = ranks[static_cast<std::size_t>(r)];
      for (int i = 0; i < 4; ++i)
        rk.input.push_back((r + i) % 2 == 0 ? 0.0f : -0.0f);
      rk.output.assign(4, 1.0f);
    }
    weft::detail::run_serial(plans, ranks, weft::op::min{}, 3);
    for (int r = 1; r < p; ++r) {
      for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_TRUE(
            weft::test::same_bits(ranks[0].output[i], ranks[static_cast<std::size_t>(r)].output[i]))
            << "p=" << p << " rank " << r << " element " << i;
      }
    }
  }
}

// log2(p) exchanges of the whole vector on a power of two; two more rounds for folded pairs.
TEST(recursive_doubling, rounds_and_volume) {
  for (int p : sizes) {
    const weft::detail::hd_fold fold(p);
    int log2p = 0;
    while ((1 << log2p) < fold.pow2)
      ++log2p;
    for (int r = 0; r < p; ++r) {
      const plan pl = make(collective::all_reduce, p, r, 100);
      std::size_t sent = 0;
      int sends = 0;
      for (const auto& s : pl.steps()) {
        if (s.kind == step_kind::send) {
          sent += s.count;
          ++sends;
        }
      }
      const int want_sends = fold.folded_out(r) ? 1 : log2p + (fold.absorbs(r) ? 1 : 0);
      EXPECT_EQ(sends, p == 1 ? 0 : want_sends) << "p=" << p << " rank " << r;
      EXPECT_EQ(sent, static_cast<std::size_t>(p == 1 ? 0 : want_sends) * 100)
          << "p=" << p << " rank " << r;
      EXPECT_LE(pl.scratch_count(), 200u);
    }
  }
}

TEST(recursive_doubling, rejects_other_collectives) {
  plan_request q;
  q.coll = collective::reduce_scatter;
  q.size = 4;
  q.count = 8;
  EXPECT_THROW(recursive_doubling::make_plan(q), weft::error);
  q.coll = collective::all_reduce;
  q.rank = 4;
  EXPECT_THROW(recursive_doubling::make_plan(q), weft::error);
}

} // namespace
