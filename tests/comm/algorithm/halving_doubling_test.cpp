#include <weft/comm/algorithm/halving_doubling.hpp>

#include <cstdint>
#include <vector>

#include "support/plan_checks.hpp"

namespace {

using namespace weft::test::plan_testing;
using weft::algo::halving_doubling;

constexpr collective served[] = {collective::all_reduce, collective::reduce_scatter,
                                 collective::all_gather};
static_assert(serves_exactly<halving_doubling>(served));

constexpr int sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};

constexpr planner<halving_doubling> make{};

TEST(halving_doubling, integers_sum_exact) {
  for (collective c : served) {
    for (int p : sizes) {
      for (std::size_t n : counts_for(p))
        check_plans<halving_doubling, int>(c, p, n, p - 1);
    }
  }
}

TEST(halving_doubling, floats_min_max) {
  for (collective c : served) {
    for (int p : sizes) {
      for (std::size_t n : counts_for(p)) {
        check_plans<halving_doubling, float, weft::op::max>(c, p, n);
        check_plans<halving_doubling, float, weft::op::min>(c, p, n);
      }
    }
  }
}

TEST(halving_doubling, random_sums) {
  for (collective c : served) {
    for (int p : sizes) {
      for (std::size_t n : counts_for(p)) {
        check_plans<halving_doubling, double>(c, p, n, 0, pattern::random);
        check_plans<halving_doubling, float>(c, p, n, 0, pattern::random);
      }
    }
  }
}

TEST(halving_doubling, int64_prod) {
  for (collective c : served) {
    for (int p : sizes) {
      for (std::size_t n : counts_for(p)) {
        check_plans<halving_doubling, std::int64_t, weft::op::prod>(c, p, n);
        check_plans<halving_doubling, std::int64_t, weft::op::prod>(c, p, n, 0, pattern::random);
      }
    }
  }
}

TEST(halving_doubling, half_and_bfloat16_sum) {
  for (collective c : served) {
    for (int p : sizes) {
      for (std::size_t n : counts_for(p)) {
        check_plans<halving_doubling, weft::half>(c, p, n);
        check_plans<halving_doubling, weft::bfloat16>(c, p, n);
      }
    }
  }
}

TEST(halving_doubling, more_sizes) {
  for (collective c : served) {
    for (int p : {10, 11, 12, 13, 14, 15, 17, 31, 32, 33}) {
      for (std::size_t n : counts_for(p))
        check_plans<halving_doubling, int>(c, p, n);
    }
  }
}

TEST(halving_doubling, large) {
  for (int p : {6, 8}) {
    check_plans<halving_doubling, float>(collective::all_reduce, p, std::size_t{1} << 20, 0,
                                         pattern::random);
  }
  check_plans<halving_doubling, int>(collective::reduce_scatter, 5, std::size_t{1} << 16);
  check_plans<halving_doubling, int>(collective::all_gather, 5, std::size_t{1} << 16);
}

TEST(halving_doubling, rejects_bad_requests) {
  EXPECT_THROW(make(collective::all_reduce, 4, 4, 8), weft::error);
  EXPECT_THROW(make(collective::all_reduce, 4, -1, 8), weft::error);
  EXPECT_THROW(make(collective::all_reduce, 0, 0, 8), weft::error);
  EXPECT_THROW(make(collective::all_gather, 4, 0, 8, 4), weft::error);
  EXPECT_THROW(make(collective::all_gather, 4, 0, 8, -1), weft::error);
  // Collectives it does not serve are refused, not silently mis-planned.
  EXPECT_THROW(make(collective::broadcast, 4, 0, 8), weft::error);
  EXPECT_THROW(make(collective::reduce, 4, 0, 8), weft::error);
  EXPECT_THROW(make(collective::all_to_all, 4, 0, 8), weft::error);
}

// Power of two: log2(p) halving + log2(p) doubling rounds; each rank sends
// n/2 + n/4 + .. + n/p twice = 2(p-1)/p * n, for n = 1024 worked out by hand.
TEST(halving_doubling, all_reduce_shape_power_of_two) {
  struct expected {
    int p;
    std::uint32_t rounds;
    std::size_t sent;
  };
  for (const expected e :
       {expected{2, 2, 1024}, expected{4, 4, 1536}, expected{8, 6, 1792}, expected{16, 8, 1920}}) {
    for (int r = 0; r < e.p; ++r) {
      const plan pl = make(collective::all_reduce, e.p, r, 1024);
      EXPECT_EQ(pl.rounds(), e.rounds) << pl.to_string();
      EXPECT_EQ(elements_sent(pl), e.sent) << pl.to_string();
      EXPECT_EQ(pl.scratch_count(), 0u);
    }
  }
  // Partners, largest distance first: rank 5 of 8 meets 1 (d=4), 7 (d=2), 4 (d=1) while
  // halving, and 4, 7, 1 while doubling.
  EXPECT_EQ(send_peers(make(collective::all_reduce, 8, 5, 1024)),
            (std::vector<int>{1, 7, 4, 4, 7, 1}));
}

// Rank v keeps share v itself at the end of halving: 10 elements on 4 ranks split 3 3 2 2.
TEST(halving_doubling, last_halving_step_keeps_own_share) {
  struct expected {
    int rank;
    std::size_t offset;
    std::size_t count;
  };
  for (const expected e :
       {expected{0, 0, 3}, expected{1, 3, 3}, expected{2, 6, 2}, expected{3, 8, 2}}) {
    const plan pl = make(collective::all_reduce, 4, e.rank, 10);
    const weft::step* last = nullptr;
    for (const auto& st : pl.steps()) {
      if (st.kind == step_kind::recv_reduce) last = &st;
    }
    ASSERT_NE(last, nullptr);
    EXPECT_EQ(last->dst, buffer::output);
    EXPECT_EQ(last->dst_offset, e.offset) << "rank " << e.rank;
    EXPECT_EQ(last->count, e.count) << "rank " << e.rank;
  }
}

// p = 6 folds onto 4: pairs (0,1) and (2,3); virtual ranks 0..3 are ranks 1, 3, 4, 5.
// n = 1200 splits into shares of 300. Ranks 1 and 3: fold, 2 + 2, unfold = 2 log2(4) + 2 rounds,
// sending 600 + 300 (halving) + 300 + 600 (doubling) + 1200 (unfold) = 3000. Ranks 4 and 5:
// 4 rounds, 1800. Ranks 0 and 2: send their 1200, receive the result: 2 rounds.
TEST(halving_doubling, all_reduce_shape_fold) {
  const std::uint32_t rounds[] = {2, 6, 2, 6, 4, 4};
  const std::size_t sent[] = {1200, 3000, 1200, 3000, 1800, 1800};
  for (int r = 0; r < 6; ++r) {
    const plan pl = make(collective::all_reduce, 6, r, 1200);
    EXPECT_EQ(pl.rounds(), rounds[r]) << pl.to_string();
    EXPECT_EQ(elements_sent(pl), sent[r]) << pl.to_string();
  }
  // Rank 4 is virtual rank 2: halving with virtual 0 (rank 1) then 3 (rank 5), doubling back.
  EXPECT_EQ(send_peers(make(collective::all_reduce, 6, 4, 1200)), (std::vector<int>{1, 5, 5, 1}));
  EXPECT_EQ(send_peers(make(collective::all_reduce, 6, 0, 1200)), (std::vector<int>{1}));
  EXPECT_EQ(send_peers(make(collective::all_reduce, 6, 3, 1200)),
            (std::vector<int>{5, 1, 1, 5, 2}));
}

// reduce_scatter, p = 8, count 100: halving only, sending 400 + 200 + 100 = 700, scratch half
// the input (400), and the last step reduces block r straight into output.
// all_gather, p = 8, count 100: doubling only, sending 100 + 200 + 400 = 700.
TEST(halving_doubling, scatter_and_gather_shape) {
  for (int r = 0; r < 8; ++r) {
    const plan rs = make(collective::reduce_scatter, 8, r, 100);
    EXPECT_EQ(rs.rounds(), 3u);
    EXPECT_EQ(elements_sent(rs), 700u);
    EXPECT_EQ(rs.scratch_count(), 400u);
    const auto& last = rs.steps().back();
    EXPECT_EQ(last.kind, step_kind::recv_reduce);
    EXPECT_EQ(last.dst, buffer::output);
    EXPECT_EQ(last.dst_offset, 0u);
    EXPECT_EQ(last.count, 100u);
    const plan ag = make(collective::all_gather, 8, r, 100);
    EXPECT_EQ(ag.rounds(), 3u);
    EXPECT_EQ(elements_sent(ag), 700u);
    EXPECT_EQ(ag.scratch_count(), 0u);
  }
  // p = 6, count 10: virtual ranks 0..3 hold blocks {0,1}, {2,3}, {4}, {5}.
  // reduce_scatter rank 1: fold in, gives blocks 4-5 (20) then 2-3 (20), hands block 0 (10) back.
  // rank 4: gives blocks 0-3 (40) then 5 (10). rank 0: sends its 60 and gets block 0.
  const std::size_t rs_sent[] = {60, 50, 60, 50, 50, 50};
  const std::uint32_t rs_rounds[] = {2, 4, 2, 4, 2, 2};
  // all_gather rank 1: receives block 0, sends blocks 0-1 (20), 0-3 (40), then 1-5 (50).
  // rank 4: sends block 4 (10), then 4-5 (20).
  const std::size_t ag_sent[] = {10, 110, 10, 110, 30, 30};
  const std::uint32_t ag_rounds[] = {2, 4, 2, 4, 2, 2};
  for (int r = 0; r < 6; ++r) {
    const plan rs = make(collective::reduce_scatter, 6, r, 10);
    EXPECT_EQ(elements_sent(rs), rs_sent[r]) << rs.to_string();
    EXPECT_EQ(rs.rounds(), rs_rounds[r]) << rs.to_string();
    const plan ag = make(collective::all_gather, 6, r, 10);
    EXPECT_EQ(elements_sent(ag), ag_sent[r]) << ag.to_string();
    EXPECT_EQ(ag.rounds(), ag_rounds[r]) << ag.to_string();
  }
}

} // namespace
