// The path every collective takes: plan cache, call check, average. (The operations
// themselves are tested in tests/comm/*_test.cpp.)
#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/rank_errors.hpp"

namespace {

using namespace weft;
using weft::test::rank_errors;

struct check_calls_on : ::testing::Test {
  void SetUp() override { check_calls(true); }
  void TearDown() override { check_calls(false); }
};

TEST_F(check_calls_on, different_counts_are_reported_on_every_rank_before_data_moves) {
  std::vector<std::vector<int>> data(3);
  const auto seen = rank_errors(3, [&](local::communicator& c) {
    auto& v = data[static_cast<std::size_t>(c.rank())];
    v.assign(c.rank() == 2 ? 5 : 6, c.rank() + 1);
    all_reduce<algo::ring>(c, std::span(v));
  });
  for (const auto& m : seen) {
    EXPECT_NE(m.find("rank 2 differs from rank 0 in count"), std::string::npos) << m;
  }
  for (int r = 0; r < 3; ++r) {
    for (int x : data[static_cast<std::size_t>(r)])
      EXPECT_EQ(x, r + 1) << "data moved on rank " << r;
  }
}

TEST_F(check_calls_on, different_collectives_ops_types_and_roots_are_named) {
  auto seen = rank_errors(2, [](local::communicator& c) {
    std::vector<float> v(4);
    if (c.rank() == 0)
      all_reduce<algo::ring>(c, std::span(v));
    else
      broadcast<algo::ring>(c, std::span(v), 0);
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("differs from rank 0 in collective"), std::string::npos) << m;

  seen = rank_errors(2, [](local::communicator& c) {
    std::vector<float> v(4);
    if (c.rank() == 0)
      all_reduce<algo::ring>(c, std::span(v), op::sum{});
    else
      all_reduce<algo::ring>(c, std::span(v), op::max{});
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("in op"), std::string::npos) << m;

  // Two user functors of one signature: the check tells them apart (a shared name would pass it).
  const auto user_sum = [](float a, float b) { return a + b; };
  const auto user_max = [](float a, float b) { return a < b ? b : a; };
  seen = rank_errors(2, [&](local::communicator& c) {
    std::vector<float> v(4, static_cast<float>(c.rank()));
    if (c.rank() == 0)
      all_reduce<algo::ring>(c, std::span(v), user_sum);
    else
      all_reduce<algo::ring>(c, std::span(v), user_max);
  });
  for (const auto& m : seen) {
    EXPECT_NE(m.find("in op"), std::string::npos) << m;
    EXPECT_NE(m.find("op user:"), std::string::npos) << m;
  }
  // The same functor on every rank passes.
  local::run(2,
             [&](local::communicator& c) {
               std::vector<float> v(4, static_cast<float>(c.rank()));
               all_reduce<algo::ring>(c, std::span(v), user_max);
               EXPECT_EQ(v[0], 1.0f);
             },
             {.check_calls = true});

  seen = rank_errors(2, [](local::communicator& c) {
    if (c.rank() == 0) {
      std::vector<float> v(4);
      all_reduce<algo::ring>(c, std::span(v));
    } else {
      std::vector<double> v(4);
      all_reduce<algo::ring>(c, std::span(v));
    }
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("in type"), std::string::npos) << m;

  seen = rank_errors(3, [](local::communicator& c) {
    std::vector<int> v(4);
    broadcast<algo::tree>(c, std::span(v), c.rank() == 1 ? 1 : 0);
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("rank 1 differs from rank 0 in root"), std::string::npos) << m;

  seen = rank_errors(2, [](local::communicator& c) {
    std::vector<int> v(4);
    if (c.rank() == 0)
      all_reduce<algo::ring>(c, std::span(v));
    else
      all_reduce<algo::tree>(c, std::span(v));
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("in algorithm"), std::string::npos) << m;
}

TEST_F(check_calls_on, matching_calls_still_work) {
  local::run(4, [](local::communicator& c) {
    std::vector<int> v(10, c.rank());
    all_reduce(c, std::span(v));
    for (int x : v)
      EXPECT_EQ(x, 6);
  });
}

TEST(dispatch, plans_are_cached_per_rank_and_key) {
  local::run(2, [](local::communicator& c) {
    auto& cache = detail::plan_cache::mine();
    plan_request q{collective::all_reduce, 2, c.rank(), 100, 0, {0, 0}, 4};
    int built = 0;
    const auto make = [&](const plan_request& r) {
      ++built;
      return algo::ring::make_plan(r);
    };
    const plan& a = cache.get("ring", q, make);
    const plan& b = cache.get("ring", q, make);
    EXPECT_EQ(&a, &b);
    EXPECT_EQ(built, 1);
    q.count = 101;
    cache.get("ring", q, make);
    EXPECT_EQ(built, 2);
  });
}

TEST(dispatch, average_divides_once_after_the_sum) {
  local::run(4, [](local::communicator& c) {
    std::vector<int> v(3, 10 * (c.rank() + 1)); // 10, 20, 30, 40 -> 100 / 4 = 25
    all_reduce(c, std::span(v), op::avg{});
    for (int x : v)
      EXPECT_EQ(x, 25);
    std::vector<float> out(1);
    std::vector<float> in(4, static_cast<float>(c.rank())); // reduce_scatter: (0+1+2+3)/4
    reduce_scatter(c, std::span<const float>(in), std::span(out), op::avg{});
    EXPECT_EQ(out[0], 1.5f);
  });
}

} // namespace
