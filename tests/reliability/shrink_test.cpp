// Abort and recovery on the local transport: after a rank fails (or stalls, or the
// application aborts), every pending and later operation fails promptly, and the ranks
// left build a communicator of themselves with shrink() and go on, with correct results.
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

// The serial reference: element i summed over the given ranks' inputs r * 100 + i.
std::vector<std::int64_t> sum_over(const std::vector<int>& ranks, std::size_t n) {
  std::vector<std::int64_t> out(n, 0);
  for (int r : ranks) {
    for (std::size_t i = 0; i < n; ++i)
      out[i] += r * 100 + static_cast<std::int64_t>(i);
  }
  return out;
}

std::vector<std::int64_t> input_of(int world_rank, std::size_t n) {
  std::vector<std::int64_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = world_rank * 100 + static_cast<std::int64_t>(i);
  return v;
}

TEST(shrink, after_a_rank_fails_the_survivors_finish_an_all_reduce) {
  constexpr int p = 5;
  constexpr int dead = 3;
  constexpr std::size_t n = 37;
  std::vector<std::vector<std::int64_t>> results(p);
  std::vector<std::string> first_error(p), later_error(p);
  std::vector<int> new_rank(p, -1), new_size(p, -1);
  // A failure aborts every pending operation, also one that does not need the failed rank
  // any more: rank 3 fails only once every rank has finished the first all-reduce.
  std::atomic<int> finished_first{0};
  const auto start = std::chrono::steady_clock::now();
  try {
    weft::local::run(
        p,
        [&](weft::local::communicator& c) {
          const auto r = static_cast<std::size_t>(c.rank());
          auto v = input_of(c.rank(), n);
          weft::all_reduce<weft::algo::ring>(c, std::span(v));
          EXPECT_EQ(v, sum_over({0, 1, 2, 3, 4}, n));
          finished_first.fetch_add(1);
          if (c.rank() == dead) {
            while (finished_first.load() < p)
              std::this_thread::yield();
            throw weft::error("rank 3 lost its device");
          }
          v = input_of(c.rank(), n);
          try {
            weft::all_reduce<weft::algo::ring>(c, std::span(v));
            ADD_FAILURE() << "rank " << r << ": the all_reduce with a dead rank returned";
          } catch (const weft::error& e) {
            first_error[r] = e.what();
          }
          try { // and every later operation on it fails at once
            c.barrier();
          } catch (const weft::error& e) {
            later_error[r] = e.what();
          }
          auto s = c.shrink();
          new_rank[r] = s.rank();
          new_size[r] = s.size();
          v = input_of(c.rank(), n);
          weft::all_reduce<weft::algo::tree>(s, std::span(v));
          weft::all_reduce<weft::algo::ring>(s, std::span(v)); // twice: the sum times the size
          results[r] = v;
        },
        {.timeout = 30s});
    ADD_FAILURE() << "run() must rethrow the dead rank's error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 lost its device"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "nobody waits for the deadline";
  auto expected = sum_over({0, 1, 2, 4}, n);
  for (auto& x : expected)
    x *= 4;
  for (int r = 0; r < p; ++r) {
    if (r == dead) continue;
    const auto i = static_cast<std::size_t>(r);
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_NE(first_error[i].find("rank 3 lost its device"), std::string::npos) << first_error[i];
    EXPECT_NE(later_error[i].find("aborted"), std::string::npos) << later_error[i];
    EXPECT_EQ(new_size[i], 4);
    EXPECT_EQ(new_rank[i], r < dead ? r : r - 1);
    EXPECT_EQ(results[i], expected);
  }
}

TEST(shrink, a_stalled_rank_is_left_out_and_told_when_it_comes_back) {
  constexpr int p = 4;
  constexpr int stalled = 1;
  constexpr std::size_t n = 10;
  std::vector<std::vector<std::int64_t>> results(p);
  std::string came_back;
  weft::local::run(p,
                   [&](weft::local::communicator& c) {
                     auto v = input_of(c.rank(), n);
                     if (c.rank() == stalled) {
                       std::this_thread::sleep_for(1200ms);
                       try {
                         weft::all_reduce<weft::algo::ring>(c, std::span(v));
                       } catch (const weft::error& e) {
                         came_back = e.what();
                       }
                       EXPECT_THROW((void)c.shrink(), weft::error);
                       return;
                     }
                     try {
                       weft::all_reduce<weft::algo::ring>(c, std::span(v));
                       ADD_FAILURE() << "the all_reduce with a stalled rank returned";
                     } catch (const weft::error&) {
                     }
                     auto s = c.shrink(); // rank 1 never joins: left out at the deadline
                     v = input_of(c.rank(), n);
                     weft::all_reduce<weft::algo::ring>(s, std::span(v));
                     results[static_cast<std::size_t>(c.rank())] = v;
                   },
                   {.timeout = 200ms});
  EXPECT_NE(came_back.find("aborted"), std::string::npos) << came_back;
  EXPECT_NE(came_back.find("rank 1 is outside any weft operation: it has not made the call"),
            std::string::npos)
      << came_back;
  for (int r : {0, 2, 3})
    EXPECT_EQ(results[static_cast<std::size_t>(r)], sum_over({0, 2, 3}, n)) << r;
}

TEST(shrink, a_rank_that_ends_after_the_shrink_is_reported_at_once_in_the_new_world) {
  constexpr int p = 4;
  std::vector<std::string> seen(p);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(weft::local::run(p,
                                [&](weft::local::communicator& c) {
                                  if (c.rank() == 0) throw weft::error("rank 0 lost its device");
                                  try {
                                    c.barrier();
                                  } catch (const weft::error&) {
                                  }
                                  auto s = c.shrink();       // world ranks 1, 2, 3
                                  if (c.rank() == 3) return; // leaves without the next call
                                  auto v = input_of(c.rank(), 5);
                                  try {
                                    weft::all_reduce<weft::algo::ring>(s, std::span(v));
                                  } catch (const weft::error& e) {
                                    seen[static_cast<std::size_t>(c.rank())] = e.what();
                                  }
                                },
                                {.timeout = 30s}),
               weft::error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "nobody waits for the deadline";
  int named = 0;
  for (int r : {1, 2}) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("all_reduce"), std::string::npos) << m;
    named += m.find("returned without joining") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(named, 1) << seen[1] << "\n" << seen[2];
}

TEST(shrink, an_explicit_abort_fails_every_rank_and_shrink_with_nobody_lost_keeps_everyone) {
  constexpr int p = 3;
  constexpr std::size_t n = 6;
  std::vector<std::string> seen(p);
  std::vector<std::vector<std::int64_t>> results(p);
  weft::local::run(p, [&](weft::local::communicator& c) {
    if (c.rank() == 0) c.abort("the loss went to NaN");
    try {
      c.barrier();
      c.barrier();
    } catch (const weft::error& e) {
      seen[static_cast<std::size_t>(c.rank())] = e.what();
    }
    EXPECT_TRUE(c.aborted());
    auto s = c.shrink();
    EXPECT_EQ(s.size(), p);
    EXPECT_EQ(s.rank(), c.rank());
    auto v = input_of(c.rank(), n);
    weft::all_reduce<weft::algo::ring>(s, std::span(v));
    results[static_cast<std::size_t>(c.rank())] = v;
  });
  for (int r = 0; r < p; ++r) {
    EXPECT_NE(seen[static_cast<std::size_t>(r)].find("rank 0 aborted: the loss went to NaN"),
              std::string::npos)
        << seen[static_cast<std::size_t>(r)];
    EXPECT_EQ(results[static_cast<std::size_t>(r)], sum_over({0, 1, 2}, n));
  }
}

} // namespace
