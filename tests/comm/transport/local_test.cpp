#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "support/rank_errors.hpp"
#include "support/scale.hpp"

namespace {

using namespace std::chrono_literals;
using weft::test::rank_errors;

std::string failure_of(auto&& body) {
  try {
    body();
  } catch (const weft::error& e) {
    return e.what();
  }
  return "";
}

TEST(local, ranks_and_sizes) {
  for (int n : {1, 2, 3, 8, 16}) {
    std::atomic<int> seen{0};
    weft::local::run(n, [&](weft::local::communicator& c) {
      EXPECT_EQ(c.size(), n);
      seen.fetch_add(1 << c.rank());
    });
    EXPECT_EQ(seen.load(), (1 << n) - 1);
  }
}

TEST(local, point_to_point_in_order_with_tags) {
  weft::local::run(4, [](weft::local::communicator& c) {
    const int next = (c.rank() + 1) % c.size();
    const int prev = (c.rank() + c.size() - 1) % c.size();
    for (int k = 0; k < 60; ++k) { // eager: sends return before the receiver arrives
      std::vector<int> out{c.rank(), k};
      c.send(std::span<const int>(out), next, 5);
    }
    for (int k = 0; k < 60; ++k) {
      std::vector<int> in(2, -1);
      c.recv(std::span(in), prev, 5);
      EXPECT_EQ(in[0], prev);
      EXPECT_EQ(in[1], k);
    }
  });
}

TEST(local, mismatched_receive_is_an_error_naming_both_sides) {
  const auto msg = failure_of([] {
    weft::local::run(2, [](weft::local::communicator& c) {
      if (c.rank() == 0) {
        std::vector<double> out(3);
        c.send(std::span<const double>(out), 1, 1);
      } else {
        std::vector<float> in(4);
        c.recv(std::span(in), 0, 1);
      }
    });
  });
  EXPECT_NE(msg.find("expected 4 x float"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 x double"), std::string::npos) << msg;
}

TEST(local, split_groups_by_color_ordered_by_key) {
  weft::local::run(6, [](weft::local::communicator& c) {
    auto sub = c.split(c.rank() % 2, -c.rank()); // reverse order inside each color
    EXPECT_EQ(sub.size(), 3);
    // even ranks 4,2,0 -> 0,1,2; odd 5,3,1 -> 0,1,2
    EXPECT_EQ(sub.rank(), (5 - c.rank()) / 2);
    EXPECT_EQ(sub.world_rank(sub.rank()), c.rank());
    auto again = sub.split(0, sub.rank());
    EXPECT_EQ(again.size(), 3);
    sub.barrier();
    // The sub-communicators are independent: traffic in one does not reach the other.
    std::vector<int> v{c.rank()};
    if (sub.rank() == 0) {
      for (int r = 1; r < sub.size(); ++r)
        sub.send(std::span<const int>(v), r);
    } else {
      std::vector<int> in(1);
      sub.recv(std::span(in), 0);
      EXPECT_EQ(in[0] % 2, c.rank() % 2);
    }
  });
}

TEST(local, barrier_orders_writes) {
  std::vector<int> cells(8, 0);
  weft::local::run(8, [&](weft::local::communicator& c) {
    for (int round = 1; round <= 50; ++round) {
      cells[static_cast<std::size_t>(c.rank())] = round;
      c.barrier();
      for (int v : cells)
        EXPECT_EQ(v, round);
      c.barrier();
    }
  });
}

TEST(local, executes_a_peer_access_plan) {
  weft::local::run(5, [](weft::local::communicator& c) {
    std::vector<long> in(1000);
    std::iota(in.begin(), in.end(), 100L * c.rank());
    std::vector<long> out(in.size());
    const auto pl = weft::algo::direct::make_plan(
        {weft::collective::all_reduce, c.size(), c.rank(), in.size(), 0, {}, 8});
    c.execute(pl, in.data(), in.size(), out.data(), out.size(), weft::op::sum{}, "all_reduce");
    for (std::size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], 5L * static_cast<long>(i) + 100L * (0 + 1 + 2 + 3 + 4));
    }
  });
}

// Staged plans (direct's small all-reduce) end without a sync: a fast rank may start its
// next call while a slow one still reads the last call's staging area. Back-to-back calls
// with inputs that change every call, a rank that lingers now and then, other collectives
// in between (a broadcast that does not wait for every rank), and in place: every result
// must still be exact. (TSan runs this too.)
TEST(local, staged_calls_back_to_back_stay_exact) {
  weft::local::run(4, [](weft::local::communicator& c) {
    std::vector<int> buf(256), out(256);
    const int calls = weft::test::sanitized ? 200 : 2000;
    for (int k = 0; k < calls; ++k) {
      for (std::size_t i = 0; i < buf.size(); ++i)
        buf[i] = k * 8 + c.rank() + static_cast<int>(i);
      if (c.rank() == k % 4 && k % 7 == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (k % 2 == 0) {
        weft::all_reduce<weft::algo::direct>(c, std::span<const int>(buf), std::span(out));
      } else {
        weft::all_reduce<weft::algo::direct>(c, std::span(buf)); // in place
        out = buf;
      }
      for (std::size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], 4 * (k * 8 + static_cast<int>(i)) + 6)
            << "call " << k << " element " << i;
      }
      if (k % 5 == 0) {
        std::vector<int> b(16, c.rank() == 1 ? k : -1);
        weft::broadcast<weft::algo::ring>(c, std::span(b), 1);
        ASSERT_EQ(b[15], k);
      }
    }
  });
}

TEST(local, a_rank_that_throws_fails_the_others_and_run_rethrows_it) {
  const auto start = std::chrono::steady_clock::now();
  const auto msg = failure_of([] {
    weft::local::run(4,
                     [](weft::local::communicator& c) {
                       if (c.rank() == 2) throw weft::error("user code on rank 2 broke");
                       std::vector<int> v(10, 1);
                       c.barrier();
                     },
                     {.timeout = 60s});
  });
  EXPECT_NE(msg.find("user code on rank 2 broke"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s)
      << "the others must not wait for the deadline";
}

TEST(local, waiting_ranks_name_the_rank_that_failed) {
  const auto seen = rank_errors(3, [](weft::local::communicator& c) {
    if (c.rank() == 1) throw weft::error("boom");
    std::vector<int> in(4);
    c.recv(std::span(in), 1);
  });
  for (int r : {0, 2}) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("rank " + std::to_string(r)), std::string::npos) << m;
    EXPECT_NE(m.find("peer 1"), std::string::npos) << m;
    EXPECT_NE(m.find("failed"), std::string::npos) << m;
  }
}

TEST(local, a_rank_that_never_arrives_times_out_with_its_name) {
  const auto start = std::chrono::steady_clock::now();
  const auto seen = rank_errors(4, [](weft::local::communicator& c) {
    c.set_timeout(200ms);
    if (c.rank() == 3) {
      std::this_thread::sleep_for(1500ms); // stalls, then leaves without joining
      return;
    }
    std::vector<float> v(64, 1.f);
    const auto pl = weft::algo::direct::make_plan(
        {weft::collective::all_reduce, c.size(), c.rank(), v.size(), 0, {}, 4});
    c.execute(pl, v.data(), v.size(), v.data(), v.size(), weft::op::sum{}, "all_reduce");
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  int named = 0;
  for (int r = 0; r < 3; ++r) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("all_reduce"), std::string::npos) << m;
    named += m.find("peer 3") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(named, 1) << "the first rank to time out names the missing peer";
}

TEST(local, a_rank_that_returns_early_is_reported) {
  const auto msg = failure_of([] {
    weft::local::run(2, [](weft::local::communicator& c) {
      if (c.rank() == 0) return;
      std::vector<int> in(1);
      c.recv(std::span(in), 0);
    });
  });
  EXPECT_NE(msg.find("returned without joining"), std::string::npos) << msg;
}

// On a split communicator the peer that left is named by its world rank too: "peer 1" of the
// sub-communicator is world rank 3 here, and world rank 1 is someone else.
TEST(local, a_peer_that_left_a_split_communicator_is_named_by_its_world_rank) {
  std::string seen;
  (void)failure_of([&] {
    weft::local::run(4, [&](weft::local::communicator& c) {
      auto half = c.split(c.rank() / 2, c.rank());
      if (c.rank() == 3) return; // leaves without joining
      if (c.rank() == 2) {
        std::vector<int> in(1);
        seen = failure_of([&] { half.recv(std::span(in), 1); });
      }
    });
  });
  EXPECT_NE(seen.find("but that rank (world rank 3) returned without joining"), std::string::npos)
      << seen;
}

// A user's reduction that throws (here on a NaN) fails the run with its message; the message it
// was reading must not stay marked as being read, or the sender, unwinding, would wait on it
// forever.
struct refuse_nan {
  float operator()(float a, float b) const {
    if (a != a || b != b) throw weft::error("NaN in a gradient");
    return a + b;
  }
};

TEST(local, a_reduction_that_throws_fails_the_run_instead_of_hanging) {
  for (int repeat = 0; repeat < 20; ++repeat) {
    const auto start = std::chrono::steady_clock::now();
    const auto msg = failure_of([] {
      weft::local::run(2,
                       [](weft::local::communicator& c) {
                         std::vector<float> v(
                             4096, c.rank() == 0 ? std::numeric_limits<float>::quiet_NaN() : 1.0f);
                         weft::all_reduce<weft::algo::ring>(c, std::span(v), refuse_nan{});
                       },
                       {.timeout = 60s});
    });
    EXPECT_NE(msg.find("NaN in a gradient"), std::string::npos) << msg;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s)
        << "the deadline must not be what ends it";
  }
}

// Timeouts: one too long for the clock waits as long as it takes (not overflowing into the past
// and failing every wait at once); zero or negative ones are refused where they are set.
TEST(local, a_timeout_too_long_for_the_clock_means_no_deadline) {
  for (const auto t :
       {std::chrono::milliseconds::max(), std::chrono::duration_cast<std::chrono::milliseconds>(
                                              std::chrono::hours(24 * 365 * 300))}) {
    EXPECT_EQ(failure_of([&] {
                weft::local::run(2,
                                 [](weft::local::communicator& c) {
                                   if (c.rank() == 1) std::this_thread::sleep_for(150ms);
                                   c.barrier();
                                 },
                                 {.timeout = t});
              }),
              "")
        << t.count() << " ms";
  }
  const auto negative =
      failure_of([] { weft::local::run(2, [](weft::local::communicator&) {}, {.timeout = -5ms}); });
  EXPECT_NE(negative.find("local::options::timeout: the timeout must be positive, not -5 ms"),
            std::string::npos)
      << negative;
  const auto zero = failure_of(
      [] { weft::local::run(1, [](weft::local::communicator& c) { c.set_timeout(0ms); }); });
  EXPECT_NE(zero.find("set_timeout: the timeout must be positive"), std::string::npos) << zero;
}

// A plan made for another rank or size is refused before it moves data (run, it would read
// past the group's channels).
TEST(local, a_plan_for_another_communicator_is_refused) {
  std::vector<std::string> seen(2);
  weft::local::run(2, [&](weft::local::communicator& c) {
    std::vector<int> v(8, 1);
    const auto pl =
        weft::algo::ring::make_plan({weft::collective::broadcast, 4, c.rank(), v.size(), 0, {}, 4});
    seen[static_cast<std::size_t>(c.rank())] = failure_of([&] {
      c.execute(pl, v.data(), v.size(), v.data(), v.size(), weft::op::sum{}, "broadcast");
    });
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(
        seen[static_cast<std::size_t>(r)].find("the plan is for rank " + std::to_string(r) +
                                               " of 4, not rank " + std::to_string(r) + " of 2"),
        std::string::npos)
        << seen[static_cast<std::size_t>(r)];
  }
}

// Ranks that pass different counts to a direct collective are told so, rather than direct's
// loads taking the part of the peer's buffer they ask for, or the small all-reduce reading what
// an earlier call staged.
TEST(local, direct_collectives_with_counts_that_differ_between_ranks_are_an_error) {
  for (const std::size_t large : {std::size_t{4}, std::size_t{1} << 14}) { // staged, then two-shot
    const auto msg = failure_of([&] {
      weft::local::run(2, [&](weft::local::communicator& c) {
        std::vector<int> warm(large, 1000);
        weft::all_reduce<weft::algo::direct>(c, std::span(warm));
        weft::all_reduce<weft::algo::direct>(c, std::span(warm));
        std::vector<int> v(c.rank() == 0 ? large / 2 : large, 1);
        weft::all_reduce<weft::algo::direct>(c, std::span(v));
      });
    });
    EXPECT_NE(msg.find("the ranks disagree on the call"), std::string::npos)
        << large << ": " << msg;
  }
  const auto gather = failure_of([] {
    weft::local::run(2, [](weft::local::communicator& c) {
      std::vector<int> v(c.rank() == 0 ? 2 : 4, c.rank()), out(2 * v.size());
      weft::all_gather<weft::algo::direct>(c, std::span<const int>(v), std::span(out));
    });
  });
  EXPECT_NE(gather.find("the ranks disagree on the call"), std::string::npos) << gather;
}

using weft::local::thread_binding;

// Where the rank threads run (local::options::binding). The tests read each thread's CPUs
// with sched_getaffinity, not with the transport's own allowed_cpus.
#if defined(__linux__)
std::vector<int> cpus_of_this_thread() {
  cpu_set_t set; // the test machines have under 1,024 CPUs
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

// Each rank's CPUs, as its thread sees them inside the run.
std::vector<std::vector<int>> cpus_by_rank(int n, const weft::local::options& opt) {
  std::vector<std::vector<int>> seen(static_cast<std::size_t>(n));
  weft::local::run(
      n,
      [&](weft::local::communicator& c) {
        seen[static_cast<std::size_t>(c.rank())] = cpus_of_this_thread();
      },
      opt);
  return seen;
}

// Sets an environment variable for one scope, and puts back what was there.
class scoped_environment {
public:
  scoped_environment(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    if (before != nullptr) before_ = before;
    ::setenv(name, value, 1);
  }
  ~scoped_environment() {
    if (before_) {
      ::setenv(name_, before_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  scoped_environment(const scoped_environment&) = delete;
  scoped_environment& operator=(const scoped_environment&) = delete;

private:
  const char* name_;
  std::optional<std::string> before_;
};

TEST(local, binding_cpu_over_more_ranks_than_cpus_goes_round_robin) {
  const std::vector<int> mine = cpus_of_this_thread();
  const int n = static_cast<int>(mine.size()) + 3;
  const auto seen = cpus_by_rank(n, {.binding = thread_binding::cpu});
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(seen[static_cast<std::size_t>(r)],
              std::vector<int>{mine[static_cast<std::size_t>(r) % mine.size()]})
        << "rank " << r;
  EXPECT_EQ(cpus_of_this_thread(), mine); // the caller's CPUs back
}

TEST(local, binding_cpu_over_fewer_ranks_gives_each_a_block) {
  const std::vector<int> mine = cpus_of_this_thread();
  if (mine.size() < 2) GTEST_SKIP() << "one CPU";
  const std::size_t block = mine.size() / 2;
  const auto seen = cpus_by_rank(2, {.binding = thread_binding::cpu});
  EXPECT_EQ(seen[0], std::vector<int>(mine.begin(), mine.begin() + static_cast<long>(block)));
  EXPECT_EQ(seen[1], std::vector<int>(mine.begin() + static_cast<long>(block),
                                      mine.begin() + static_cast<long>(2 * block)));
  EXPECT_EQ(cpus_of_this_thread(), mine);
}

TEST(local, a_bound_run_that_throws_gives_the_caller_its_cpus_back) {
  const std::vector<int> mine = cpus_of_this_thread();
  if (mine.size() < 2) GTEST_SKIP() << "one CPU: bound and free look alike";
  EXPECT_THROW(weft::local::run(3,
                                [](weft::local::communicator& c) {
                                  if (c.rank() == 0) throw weft::error("rank 0 fails");
                                },
                                {.binding = thread_binding::cpu}),
               weft::error);
  EXPECT_EQ(cpus_of_this_thread(), mine);
}

TEST(local, automatic_binding_binds_only_where_the_ranks_outnumber_the_cpus) {
  const std::vector<int> mine = cpus_of_this_thread();
  if (mine.size() < 2) GTEST_SKIP() << "one CPU: bound and free look alike";
  const auto n = static_cast<int>(mine.size());
  const weft::local::options automatic{.binding = thread_binding::automatic};
  for (const auto& cpus : cpus_by_rank(n, automatic))
    EXPECT_EQ(cpus, mine); // as many ranks as CPUs: free
  const auto over = cpus_by_rank(n + 1, automatic);
  EXPECT_EQ(over[0], std::vector<int>{mine[0]});
  EXPECT_EQ(over[static_cast<std::size_t>(n)], std::vector<int>{mine[0]});
  for (const auto& cpus : cpus_by_rank(n + 1, {.binding = thread_binding::none}))
    EXPECT_EQ(cpus, mine);
  EXPECT_EQ(cpus_of_this_thread(), mine);
}

TEST(local, by_default_the_threads_run_free) {
  const char* env = std::getenv("WEFT_BINDING");
  if (env != nullptr && *env != '\0') GTEST_SKIP() << "WEFT_BINDING=" << env << " is set";
  const std::vector<int> mine = cpus_of_this_thread();
  if (mine.size() < 2) GTEST_SKIP() << "one CPU: bound and free look alike";
  for (const auto& cpus : cpus_by_rank(static_cast<int>(mine.size()) + 2, {}))
    EXPECT_EQ(cpus, mine);
}

TEST(local, the_environment_chooses_the_binding_where_the_program_does_not) {
  const std::vector<int> mine = cpus_of_this_thread();
  if (mine.size() < 2) GTEST_SKIP() << "one CPU: bound and free look alike";
  const int n = static_cast<int>(mine.size()) + 1;
  {
    const scoped_environment cpu("WEFT_BINDING", "cpu");
    EXPECT_EQ(cpus_by_rank(n, {})[0], std::vector<int>{mine[0]});
    // What the program sets wins.
    for (const auto& cpus : cpus_by_rank(n, {.binding = thread_binding::none}))
      EXPECT_EQ(cpus, mine);
  }
  {
    const scoped_environment automatic("WEFT_BINDING", "automatic");
    EXPECT_EQ(cpus_by_rank(n, {})[0], std::vector<int>{mine[0]});
  }
  const scoped_environment cores("WEFT_BINDING", "cores");
  const std::string what = failure_of([&] { (void)cpus_by_rank(n, {}); });
  EXPECT_NE(what.find("WEFT_BINDING=\"cores\""), std::string::npos) << what;
  EXPECT_NE(what.find("\"cpu\""), std::string::npos) << what;
}

TEST(local, a_cpu_the_thread_may_not_use_fails_a_required_binding_and_nothing_else) {
  const std::vector<int> mine = cpus_of_this_thread();
  const std::vector<int> outside{mine.back() + 1};
  try {
    const weft::detail::cpu_binding bound(outside, true, 2);
    ADD_FAILURE() << "bound to CPU " << outside[0] << ", outside this thread's CPUs";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("could not bind rank 2's thread to CPU " +
                                         std::to_string(outside[0])),
              std::string::npos)
        << e.what();
  }
  {
    const weft::detail::cpu_binding bound(outside, false, 2);
    EXPECT_EQ(cpus_of_this_thread(), mine);
  }
  EXPECT_EQ(cpus_of_this_thread(), mine);
}
#endif

// The binding's decision, on CPU lists the test makes up.
TEST(local, bound_cpus_go_round_robin_over_more_ranks_and_by_blocks_over_fewer) {
  const std::vector<int> cpus{3, 5, 6, 9, 10};
  const auto of = [&](thread_binding b, int ranks) {
    return weft::detail::bound_cpus({.binding = b}, ranks, cpus);
  };
  using cpu_lists = std::vector<std::vector<int>>;
  EXPECT_EQ(of(thread_binding::automatic, 7).of_rank,
            (cpu_lists{{3}, {5}, {6}, {9}, {10}, {3}, {5}}));
  EXPECT_FALSE(of(thread_binding::automatic, 7).required);
  EXPECT_TRUE(of(thread_binding::automatic, 5).of_rank.empty());
  EXPECT_EQ(of(thread_binding::cpu, 5).of_rank, (cpu_lists{{3}, {5}, {6}, {9}, {10}}));
  EXPECT_EQ(of(thread_binding::cpu, 2).of_rank, (cpu_lists{{3, 5}, {6, 9}}));
  EXPECT_EQ(of(thread_binding::cpu, 1).of_rank, (cpu_lists{{3, 5, 6, 9, 10}}));
  EXPECT_TRUE(of(thread_binding::cpu, 1).required);
  EXPECT_TRUE(of(thread_binding::none, 9).of_rank.empty());
  // where the platform cannot say which CPUs: automatic leaves the threads free, cpu fails
  EXPECT_TRUE(
      weft::detail::bound_cpus({.binding = thread_binding::automatic}, 5, {}).of_rank.empty());
  EXPECT_THROW((void)weft::detail::bound_cpus({.binding = thread_binding::cpu}, 5, {}),
               weft::error);
}

} // namespace
