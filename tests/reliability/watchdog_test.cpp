// The watchdog and the progress counters of the local transport: a stalled rank is named,
// with its operation, sequence number and plan step, on every rank, within the timeout.
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/progress.hpp>
#include <weft/comm/send_recv.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/rank_errors.hpp"

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using weft::test::rank_errors;

// A sum that sleeps once, on the rank and in the call the test picks: a rank stuck in its
// own code in the middle of a plan step.
struct stalling_sum {
  std::atomic<int>* reductions; // this rank's count of recv_reduce elements so far
  int stall_at;                 // stall at this element (-1: never)
  std::chrono::milliseconds stall;
  float operator()(float a, float b) const {
    if (reductions->fetch_add(1) == stall_at) std::this_thread::sleep_for(stall);
    return a + b;
  }
};

TEST(watchdog, a_rank_stalled_inside_a_ring_step_is_named_with_its_step_on_every_rank) {
  constexpr int p = 4;
  constexpr int stalled = 2;
  constexpr std::size_t n = 64 * p; // a block of 64 per rank
  constexpr auto timeout = 300ms;
  // The ring's reduce-scatter runs one recv_reduce of one block per round, so the element
  // 64 * 1 of the third call's reductions is the first of round 1 (the second reduce step).
  // The first two calls reduce (p-1) blocks each.
  const int stall_at = static_cast<int>(2 * (p - 1) * 64 + 64);
  std::vector<clock_type::duration> took(p);
  std::vector<std::atomic<int>> reductions(p);
  std::vector<float> first_two(p, 0.f);
  const auto seen = rank_errors(p, [&](weft::local::communicator& c) {
    c.set_timeout(timeout);
    const auto r = static_cast<std::size_t>(c.rank());
    const stalling_sum op{&reductions[r], c.rank() == stalled ? stall_at : -1, 1500ms};
    std::vector<float> v(n, 1.f);
    weft::all_reduce<weft::algo::ring>(c, std::span(v), op);
    weft::all_reduce<weft::algo::ring>(c, std::span(v), op);
    first_two[r] = v[0];
    const auto start = clock_type::now();
    try {
      weft::all_reduce<weft::algo::ring>(c, std::span(v), op);
    } catch (const weft::error&) {
      took[r] = clock_type::now() - start;
      throw;
    }
  });
  for (int r = 0; r < p; ++r)
    EXPECT_EQ(first_two[static_cast<std::size_t>(r)], 16.f) << "the calls before the stall";
  // The step the stalled rank is in: the second recv_reduce of its ring plan.
  const auto pl =
      weft::algo::ring::make_plan({weft::collective::all_reduce, p, stalled, n, 0, {}, 4});
  std::size_t step = 0;
  for (int seen_reduces = 0; step < pl.steps().size(); ++step) {
    if (pl.steps()[step].kind == weft::step_kind::recv_reduce && ++seen_reduces == 2) break;
  }
  ASSERT_LT(step, pl.steps().size());
  EXPECT_EQ(pl.steps()[step].round, 1u);
  const std::string where = "rank 2 is stalled inside all_reduce #3 round 1 step " +
                            std::to_string(step) + " of " + std::to_string(pl.steps().size()) +
                            " (recv_reduce)";
  for (int r = 0; r < p; ++r) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + m);
    EXPECT_NE(m.find(where), std::string::npos);
    EXPECT_NE(m.find("pending operations"), std::string::npos);
    for (int q = 0; q < p; ++q)
      EXPECT_NE(m.find("rank " + std::to_string(q) + " | "), std::string::npos);
    EXPECT_NE(m.find("rank 2 | running | all_reduce #3 round 1"), std::string::npos);
    // Within the timeout of the wait that noticed, plus the time to wake: not the stall.
    // Rank 1 is the exception by design: the stalled rank is reducing straight from rank 1's
    // buffer, so rank 1 may leave (and its caller free that buffer) only once it lets go.
    if (r != stalled && r != stalled - 1) {
      EXPECT_LT(took[static_cast<std::size_t>(r)], timeout + 600ms);
    }
  }
}

TEST(watchdog, a_rank_that_never_makes_the_call_is_named_as_such) {
  constexpr int p = 3;
  const auto seen = rank_errors(p, [](weft::local::communicator& c) {
    c.set_timeout(200ms);
    std::vector<int> v(8, c.rank());
    weft::all_reduce<weft::algo::ring>(c, std::span(v));
    if (c.rank() == 1) {
      std::this_thread::sleep_for(800ms); // busy elsewhere
      return;
    }
    weft::all_reduce<weft::algo::ring>(c, std::span(v));
  });
  for (int r : {0, 2}) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("rank 1 is outside any weft operation: it has not made the call (its last was "
                     "all_reduce#1)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("all_reduce #2"), std::string::npos) << m;
  }
}

TEST(watchdog, a_rank_in_another_communicators_call_is_followed_there) {
  constexpr int p = 4;
  const auto seen = rank_errors(p, [](weft::local::communicator& c) {
    c.set_timeout(300ms);
    auto sub = c.split(0, c.rank()); // comm 1; split is #1 on comm 0
    // Rank 2's barrier waits longer than comm 0's deadline, so that comm 0's watchdog is the
    // one to fire and follow rank 2 into comm 1 (with equal deadlines, rank 2's own timeout
    // could fire first: seen under TSan, where rank 2 was then reported as failed).
    sub.set_timeout(5000ms);
    if (c.rank() == 2) {
      sub.barrier(); // the others are in comm 0's all_reduce
    } else {
      std::vector<int> v(16, 1);
      weft::all_reduce<weft::algo::ring>(c, std::span(v));
    }
  });
  for (const auto& m : seen) {
    EXPECT_NE(m.find("rank 2 has not made the call on comm 0: it is in barrier #1"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("on comm 1"), std::string::npos) << m;
    EXPECT_NE(m.find("wait on each other in a cycle"), std::string::npos) << m;
  }
}

// A rank whose call threw, and which caught the error and went on in its own code, is not
// "stalled inside" that call: the watchdog says it is outside any operation and names the call
// that threw. (A record left active would make the verdict blame a stall in the call.)
TEST(watchdog, a_rank_that_caught_its_calls_error_is_not_taken_for_stalled_in_it) {
  constexpr int p = 3;
  const auto seen = rank_errors(p, [](weft::local::communicator& c) {
    c.set_timeout(300ms);
    std::vector<int> four(4, 1), eight(8);
    if (c.rank() == 0) weft::send(c, std::span(four), 1);
    if (c.rank() == 1) {
      // 8 expected, 4 sent: this receive throws, the message stays.
      EXPECT_THROW(weft::recv(c, std::span(eight), 0), weft::error);
      std::this_thread::sleep_for(1200ms); // and rank 1 goes on elsewhere
      return;
    }
    c.barrier();
  });
  for (int r : {0, 2}) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("rank 1 is outside any weft operation: it has not made the call (its last was "
                     "recv#1 (threw))"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find("stalled inside"), std::string::npos) << m;
  }
}

TEST(watchdog, off_it_lets_a_slow_rank_take_longer_than_the_timeout) {
  std::vector<int> result(3, 0);
  weft::local::run(3,
                   [&](weft::local::communicator& c) {
                     std::vector<int> v(5, c.rank() + 1);
                     if (c.rank() == 0) std::this_thread::sleep_for(400ms);
                     weft::all_reduce<weft::algo::ring>(c, std::span(v));
                     result[static_cast<std::size_t>(c.rank())] = v[4];
                   },
                   {.timeout = 100ms, .watchdog = false});
  EXPECT_EQ(result, std::vector<int>(3, 1 + 2 + 3));
}

TEST(watchdog, on_the_same_slow_rank_is_an_error) {
  EXPECT_THROW(weft::local::run(3,
                                [&](weft::local::communicator& c) {
                                  std::vector<int> v(5, c.rank() + 1);
                                  if (c.rank() == 0) std::this_thread::sleep_for(400ms);
                                  weft::all_reduce<weft::algo::ring>(c, std::span(v));
                                },
                                {.timeout = 100ms}),
               weft::error);
}

TEST(progress, counts_operations_and_records_the_last_ones) {
  std::vector<std::vector<weft::rank_progress>> dumps(2);
  weft::local::run(2, [&](weft::local::communicator& c) {
    std::vector<int> v(4, 1);
    weft::all_reduce<weft::algo::ring>(c, std::span(v));
    c.barrier();
    weft::all_reduce<weft::algo::ring>(c, std::span(v));
    EXPECT_EQ(c.sequence(), 3u);
    c.barrier();
    dumps[static_cast<std::size_t>(c.rank())] = c.progress();
    c.barrier();
  });
  for (const auto& d : dumps) {
    ASSERT_EQ(d.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      const auto& p = d[static_cast<std::size_t>(r)];
      EXPECT_EQ(p.rank, r);
      EXPECT_EQ(p.status, "running");
      // Each rank dumps after the fourth operation: the other is in the last barrier or
      // about to be; its history holds at least the first three.
      ASSERT_GE(p.history.size(), 3u) << weft::to_string(d);
      EXPECT_NE(std::find(p.history.begin(), p.history.end(), "all_reduce#3"), p.history.end())
          << weft::to_string(d);
    }
  }
}

} // namespace
