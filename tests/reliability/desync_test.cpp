// Desync detection: ranks that call different collectives (here: different counts) are
// told so on every rank, before any data moves, with which ranks disagree and how; chosen in
// code per communicator (checked_calls, local::options::check_calls) as well as by
// WEFT_CHECK_CALLS=1. Without the check, a mismatch is still an error, never a silent result.
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/checked_calls.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "support/rank_errors.hpp"

namespace {

using namespace std::chrono_literals;

using weft::test::rank_errors;

TEST(desync, different_counts_through_checked_calls_are_reported_on_every_rank_before_data_moves) {
  constexpr int p = 4;
  std::vector<std::vector<int>> data(p);
  const auto seen = rank_errors(p, [&](weft::local::communicator& c) {
    auto& v = data[static_cast<std::size_t>(c.rank())];
    v.assign(c.rank() == 2 ? 5 : 6, c.rank() + 1);
    weft::checked_calls checked(std::move(c));
    weft::all_reduce<weft::algo::ring>(checked, std::span(v));
  });
  for (int r = 0; r < p; ++r) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    SCOPED_TRACE(m);
    EXPECT_NE(m.find("all_reduce on rank " + std::to_string(r)), std::string::npos);
    EXPECT_NE(m.find("no data moved"), std::string::npos);
    EXPECT_NE(m.find("ranks 0,1,3 called all_reduce<ring> of 6 x int32, op sum, root 0"),
              std::string::npos);
    EXPECT_NE(
        m.find("rank 2 differs from rank 0 in count: it called all_reduce<ring> of 5 x int32"),
        std::string::npos);
    for (int x : data[static_cast<std::size_t>(r)])
      EXPECT_EQ(x, r + 1) << "data moved on rank " << r;
  }
}

TEST(desync, the_option_checks_every_communicator_of_the_run_and_names_each_difference) {
  const auto seen = rank_errors(3,
                                [](weft::local::communicator& c) {
                                  auto sub = c.split(0, c.rank()); // inherits the check
                                  EXPECT_TRUE(sub.check_calls());
                                  std::vector<float> v(4);
                                  if (sub.rank() == 1) {
                                    weft::broadcast<weft::algo::tree>(sub, std::span(v), 2);
                                  } else {
                                    weft::broadcast<weft::algo::ring>(sub, std::span(v), 0);
                                  }
                                },
                                {.timeout = 30s, .check_calls = true});
  for (const auto& m : seen) {
    EXPECT_NE(m.find("ranks 0,2 called broadcast<ring>"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 differs from rank 0 in algorithm, root: it called broadcast<tree> of "
                     "4 x float, op "
                     "sum, root 2"),
              std::string::npos)
        << m;
  }
}

TEST(desync, matching_calls_through_the_check_give_the_reference_result) {
  std::vector<std::vector<int>> out(4);
  weft::local::run(4, [&](weft::local::communicator& c) {
    weft::checked_calls checked(std::move(c));
    std::vector<int> v(9, checked.rank() * 3 + 1);
    weft::all_reduce<weft::algo::ring>(checked, std::span(v));
    auto half = checked.split(checked.rank() % 2, 0);
    weft::all_reduce<weft::algo::tree>(half, std::span(v));
    out[static_cast<std::size_t>(checked.rank())] = v;
  });
  // 1 + 4 + 7 + 10 = 22 after the first; each half sums two copies.
  for (const auto& v : out)
    EXPECT_EQ(v, std::vector<int>(9, 44));
}

TEST(desync, without_the_check_a_mismatch_is_still_an_error_on_every_rank) {
  constexpr int p = 3;
  const auto seen = rank_errors(p,
                                [](weft::local::communicator& c) {
                                  std::vector<int> v(c.rank() == 1 ? 7 : 9, 1);
                                  weft::all_reduce<weft::algo::ring>(c, std::span(v));
                                },
                                {.timeout = 2s});
  for (const auto& m : seen)
    EXPECT_NE(m.find("all_reduce"), std::string::npos) << m;
}

} // namespace
