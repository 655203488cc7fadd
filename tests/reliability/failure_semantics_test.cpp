// Failure semantics of the local transport: a call that fails part-way leaves its communicator
// (and every split of it) failed, so each later call throws at once quoting the first error;
// every survivor of a stall names the stalled rank; no peer reads a rank's buffers once its
// call has thrown; errors found before data moves leave the communicator usable; and
// on_failure::abort_job ends the process with weft's message instead of throwing.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/async.hpp>
#include <weft/comm/failure.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/comm/send_recv.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// The watchdog's verdict on a rank that sleeps in its own code instead of making the call.
std::string outside_any_operation(int world_rank) {
  return "rank " + std::to_string(world_rank) +
         " is outside any weft operation: it has not made the call";
}

// Runs `call`, which must throw weft::error; returns its message and how long the call took.
struct thrown {
  std::string what;
  clock_type::duration took{};
};
thrown expect_throw(const std::function<void()>& call) {
  const auto start = clock_type::now();
  try {
    call();
  } catch (const weft::error& e) {
    return {e.what(), clock_type::now() - start};
  }
  ADD_FAILURE() << "the call returned";
  return {"", clock_type::now() - start};
}

// A later call on a failed communicator: it throws at once (no deadline, no peer waited on),
// quoting the rank's first error.
constexpr auto at_once = 250ms;
void expect_fails_at_once_with(const std::string& first, const std::function<void()>& call,
                               const char* what) {
  SCOPED_TRACE(what);
  const auto t = expect_throw(call);
  EXPECT_NE(t.what.find(first), std::string::npos)
      << "first error: " << first << "\nlater error: " << t.what;
  EXPECT_LT(t.took, at_once);
}

// (a) The scenario: 4 ranks, a 1 s deadline, rank 2 asleep for 3 s before a 4 MiB
// ring all-reduce. Every survivor names world rank 2; rank 1 frees its buffer right after the
// error; ranks 0 and 3 keep theirs and find it unchanged after rank 2 has woken and tried its
// call; rank 2's calls after waking throw at once.
TEST(failure_semantics,
     every_survivor_names_the_stalled_rank_and_no_buffer_is_touched_after_the_error) {
  constexpr int p = 4;
  constexpr int stalled = 2;
  constexpr std::size_t n = (4u << 20) / sizeof(float);
  std::vector<std::string> first(p);
  std::vector<std::string> later(p);
  std::vector<std::size_t> changed_after(p, 0);
  std::vector<clock_type::duration> stalled_took(2);
  weft::local::run(
      p,
      [&](weft::local::communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        auto buffer = std::make_unique<std::vector<float>>(n, static_cast<float>(c.rank() + 1));
        if (c.rank() == stalled) {
          std::this_thread::sleep_for(3s);
          auto t = expect_throw([&] { weft::all_reduce<weft::algo::ring>(c, std::span(*buffer)); });
          first[r] = t.what;
          stalled_took[0] = t.took;
          t = expect_throw([&] { c.barrier(); });
          later[r] = t.what;
          stalled_took[1] = t.took;
          return;
        }
        try {
          weft::all_reduce<weft::algo::ring>(c, std::span(*buffer));
          ADD_FAILURE() << "rank " << r << ": the all-reduce with a stalled rank returned";
        } catch (const weft::error& e) {
          first[r] = e.what();
        }
        if (c.rank() == 1) {
          buffer.reset(); // freed while rank 2 is still asleep: nothing may read it afterwards
          std::this_thread::sleep_for(4s);
          return;
        }
        const std::vector<float> at_error = *buffer;
        std::this_thread::sleep_for(4s); // rank 2 wakes at 3 s and makes its call meanwhile
        for (std::size_t i = 0; i < n; ++i)
          changed_after[r] += (*buffer)[i] != at_error[i] ? 1 : 0;
      },
      {.timeout = 1s});
  for (int r = 0; r < p; ++r) {
    const auto i = static_cast<std::size_t>(r);
    SCOPED_TRACE("rank " + std::to_string(r) + ": " + first[i]);
    EXPECT_NE(first[i].find(outside_any_operation(stalled)), std::string::npos);
    EXPECT_NE(first[i].find(" on rank " + std::to_string(r)),
              std::string::npos); // recv under WEFT_CHECK_CALLS=1
    EXPECT_EQ(changed_after[i], 0u) << "elements written after the error";
  }
  EXPECT_LT(stalled_took[0], at_once) << "rank 2's all-reduce after waking";
  EXPECT_LT(stalled_took[1], at_once) << "rank 2's barrier after waking";
  EXPECT_NE(later[stalled].find(first[stalled]), std::string::npos) << later[stalled];
}

// A sum that throws on one rank: a user's reduction failing in the middle of a plan.
struct sum_that_throws_on {
  int rank;
  int throwing_rank;
  float operator()(float a, float b) const {
    if (rank == throwing_rank) throw std::runtime_error("the reduction on rank 1 overflowed");
    return a + b;
  }
};

// (b) After a failure part-way, every later call on the communicator, on a split made before
// the failure, collective or point-to-point, throws at once with the rank's first error.
TEST(failure_semantics, a_failed_communicator_fails_every_later_call_at_once_with_the_first_error) {
  constexpr int p = 3;
  std::vector<std::string> first(p);
  std::vector<int> checked(p, 0);
  weft::local::run(
      p,
      [&](weft::local::communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        auto sub = c.split(0, p - c.rank()); // made before the failure, ranks reversed
        std::vector<float> v(64, 1.f);
        try {
          weft::all_reduce<weft::algo::ring>(c, std::span(v), sum_that_throws_on{c.rank(), 1});
          ADD_FAILURE() << "rank " << r << ": the all-reduce returned";
        } catch (const std::exception& e) {
          first[r] = e.what();
        }
        EXPECT_TRUE(c.aborted());
        const int next = (c.rank() + 1) % p;
        const int prev = (c.rank() + p - 1) % p;
        std::vector<float> in(4, -1.f);
        const std::vector<float> out(4, 2.f);
        expect_fails_at_once_with(
            first[r], [&] { c.barrier(); }, "barrier");
        expect_fails_at_once_with(
            first[r], [&] { weft::all_reduce<weft::algo::ring>(c, std::span(v)); }, "all_reduce");
        expect_fails_at_once_with(
            first[r], [&] { weft::send(c, std::span(out), next); }, "send");
        expect_fails_at_once_with(
            first[r], [&] { weft::recv(c, std::span(in), prev); }, "recv");
        expect_fails_at_once_with(
            first[r], [&] { c.sendrecv(std::span(out), next, std::span(in), prev); }, "sendrecv");
        expect_fails_at_once_with(
            first[r], [&] { (void)c.split(0, 0); }, "split");
        expect_fails_at_once_with(
            first[r], [&] { weft::all_reduce<weft::algo::direct>(sub, std::span(v)); },
            "all_reduce on the split");
        expect_fails_at_once_with(
            first[r], [&] { sub.barrier(); }, "barrier on the split");
        expect_fails_at_once_with(
            first[r], [&] { weft::send(sub, std::span(out), (sub.rank() + 1) % p); },
            "send on the split");
        EXPECT_EQ(in, std::vector<float>(4, -1.f))
            << "a receive on the failed communicator wrote its buffer";
        checked[r] = 1;
        (void)c.shrink(); // the way forward stays open
      },
      {.timeout = 30s});
  for (int r = 0; r < p; ++r) {
    const auto& m = first[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("the reduction on rank 1 overflowed"), std::string::npos)
        << "rank " << r << ": " << m;
    EXPECT_EQ(checked[static_cast<std::size_t>(r)], 1);
  }
}

// Errors found before any data moves are not failures of the communicator: the call check's
// disagreement, a plan made for another rank, a receive of the wrong size, a bad peer. The
// same communicator then gives the reference result, point-to-point and collective.
TEST(failure_semantics, errors_found_before_data_moves_leave_the_communicator_usable) {
  constexpr int p = 3;
  std::vector<std::vector<int>> results(p);
  std::vector<std::vector<int>> received(p);
  weft::local::run(
      p,
      [&](weft::local::communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        std::vector<int> v(c.rank() == 1 ? 5 : 6, c.rank() + 1);
        const auto t = expect_throw([&] { weft::all_reduce<weft::algo::ring>(c, std::span(v)); });
        EXPECT_NE(t.what.find("no data moved"), std::string::npos) << t.what;
        const auto foreign = weft::algo::ring::make_plan(
            {weft::collective::all_reduce, p, (c.rank() + 1) % p, v.size(), 0, {}, sizeof(int)});
        EXPECT_THROW(c.execute(foreign, v.data(), v.size(), v.data(), v.size(), weft::op::sum{},
                               "all_reduce"),
                     weft::error);
        EXPECT_THROW(weft::send(c, std::span(v), c.rank()), weft::error);
        // Rank 0 sends 2 elements; rank 1 asks for 3 first (an error, the message stays), then 2.
        std::vector<int> two(2, 7), three(3);
        if (c.rank() == 0) weft::send(c, std::span(two), 1);
        if (c.rank() == 1) {
          EXPECT_THROW(weft::recv(c, std::span(three), 0), weft::error);
          std::vector<int> got(2);
          weft::recv(c, std::span(got), 0);
          received[r] = got;
        }
        EXPECT_FALSE(c.aborted());
        std::vector<int> w(6, c.rank() + 1);
        weft::all_reduce<weft::algo::ring>(c, std::span(w));
        weft::all_reduce<weft::algo::direct>(c, std::span(w));
        results[r] = w;
      },
      {.timeout = 30s, .check_calls = true});
  for (const auto& w : results)
    EXPECT_EQ(w, std::vector<int>(6, 3 * (1 + 2 + 3)));
  EXPECT_EQ(received[1], std::vector<int>(2, 7));
}

// (c) Buffered (eager) sends in flight when the communicator fails: the survivors' later calls
// throw at once with their first error, and the stalled rank, waking, does not receive the
// messages that wait for it (its receive throws at once and leaves its buffer untouched).
TEST(failure_semantics, eager_sends_in_flight_are_never_received_after_the_failure) {
  constexpr int p = 4;
  constexpr int stalled = 2;
  constexpr float untouched = -1.f;
  std::vector<std::string> first(p);
  std::vector<std::vector<float>> stalled_got(1);
  weft::local::run(
      p,
      [&](weft::local::communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        const int next = (c.rank() + 1) % p;
        const int prev = (c.rank() + p - 1) % p;
        std::vector<float> in(8, untouched);
        if (c.rank() == stalled) {
          std::this_thread::sleep_for(1500ms);
          auto t = expect_throw(
              [&] { weft::recv(c, std::span(in), prev); }); // rank 1's messages are there
          first[r] = t.what;
          EXPECT_LT(t.took, at_once);
          expect_fails_at_once_with(
              first[r], [&] { weft::send(c, std::span(in), next); }, "send after waking");
          stalled_got[0] = in;
          return;
        }
        try {
          for (int k = 0; k < 2; ++k) {
            auto out =
                std::make_unique<std::vector<float>>(8, static_cast<float>(c.rank() * 10 + k));
            weft::send(c, std::span(*out), next, 7);
            out.reset(); // the eager send copied it
          }
          for (int k = 0; k < 2; ++k)
            weft::recv(c, std::span(in), prev, 7);
          c.barrier();
          ADD_FAILURE() << "rank " << r << ": the exchange with a stalled rank finished";
        } catch (const weft::error& e) {
          first[r] = e.what();
        }
        std::vector<float> v(16, 1.f);
        expect_fails_at_once_with(
            first[r], [&] { weft::send(c, std::span(v), next, 7); }, "send");
        expect_fails_at_once_with(
            first[r], [&] { weft::recv(c, std::span(in), prev, 7); }, "recv");
        expect_fails_at_once_with(
            first[r], [&] { weft::all_reduce<weft::algo::ring>(c, std::span(v)); }, "all_reduce");
        std::this_thread::sleep_for(2s); // past rank 2's wake-up
      },
      {.timeout = 300ms});
  for (int r = 0; r < p; ++r) {
    const auto& m = first[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find(outside_any_operation(stalled)), std::string::npos)
        << "rank " << r << ": " << m;
  }
  EXPECT_EQ(stalled_got[0], std::vector<float>(8, untouched))
      << "the stalled rank received a stale message";
}

// (d) The optimizer's bucket reductions in flight on an async_communicator's progress thread
// when a rank stalls: every survivor's wait() names the stalled rank, and the next call on
// the parent communicator throws the first error at once.
TEST(failure_semantics, queued_bucket_reductions_fail_naming_the_stalled_rank_and_fail_the_parent) {
  constexpr int p = 4;
  constexpr int stalled = 1;
  constexpr std::size_t n = 1024;
  std::vector<std::vector<std::string>> waits(p);
  std::vector<std::string> parent(p);
  std::vector<clock_type::duration> parent_took(p);
  weft::local::run(
      p,
      [&](weft::local::communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        weft::async_communicator ac(c);
        if (c.rank() == stalled) std::this_thread::sleep_for(1500ms);
        std::vector<float> bucket0(n, 1.f), bucket1(n, 2.f), rs_in(n * p, 3.f), rs_out(n);
        std::vector<weft::work> ws;
        ws.push_back(weft::all_reduce_async<weft::algo::ring>(ac, std::span(bucket0)));
        ws.push_back(weft::reduce_scatter_async<weft::algo::ring>(ac, std::span<const float>(rs_in),
                                                                  std::span(rs_out)));
        ws.push_back(weft::all_reduce_async<weft::algo::ring>(ac, std::span(bucket1)));
        for (auto& w : ws) {
          try {
            w.wait();
            ADD_FAILURE() << "rank " << r << ": a queued reduction with a stalled rank finished";
          } catch (const weft::error& e) {
            waits[r].emplace_back(e.what());
          }
        }
        const auto t = expect_throw([&] { c.barrier(); });
        parent[r] = t.what;
        parent_took[r] = t.took;
        if (c.rank() != stalled) std::this_thread::sleep_for(1s); // past the stalled rank's wake-up
      },
      {.timeout = 300ms});
  for (int r = 0; r < p; ++r) {
    const auto i = static_cast<std::size_t>(r);
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_EQ(waits[i].size(), 3u);
    for (const auto& m : waits[i])
      EXPECT_NE(m.find(outside_any_operation(stalled)), std::string::npos) << m;
    EXPECT_NE(parent[i].find(waits[i][0]), std::string::npos)
        << "first: " << waits[i][0] << "\nparent: " << parent[i];
    EXPECT_LT(parent_took[i], at_once);
  }
}

// A rank stalled inside its reduction of a peer-access plan (algo::direct loads straight from
// its peers' buffers) while its peers time out: a peer's call returns only once the slow rank
// no longer reads its buffer, so rank 0 overwriting and rank 2 freeing theirs right after
// their errors leave rank 1's reduction as the inputs made it (under ASan: no use after free).
struct sum_that_stalls_once {
  std::atomic<int>* calls; // this rank's reductions so far
  int stall_at;            // -1: never
  float operator()(float a, float b) const {
    if (calls->fetch_add(1) == stall_at) std::this_thread::sleep_for(1200ms);
    return a + b;
  }
};

TEST(failure_semantics, a_peer_still_loading_from_a_failed_ranks_buffer_is_waited_for) {
  constexpr int p = 3;
  constexpr int slow = 1;
  constexpr std::size_t n = 3 * 4096; // above the one-shot size: loads from the user's buffers
  static_assert(n * sizeof(float) > weft::algo::direct::one_shot_bytes);
  const auto input = [](int r, std::size_t i) {
    return static_cast<float>((r + 1) * 100 + static_cast<int>(i % 50));
  };
  std::vector<float> slow_out;
  std::vector<std::string> seen(p);
  std::vector<std::atomic<int>> calls(p);
  weft::local::run(p,
                   [&](weft::local::communicator& c) {
                     auto in = std::make_unique<std::vector<float>>(n);
                     for (std::size_t i = 0; i < n; ++i)
                       (*in)[i] = input(c.rank(), i);
                     std::vector<float> out(n, 0.f);
                     const sum_that_stalls_once op{&calls[static_cast<std::size_t>(c.rank())],
                                                   c.rank() == slow ? 10 : -1};
                     try {
                       weft::all_reduce<weft::algo::direct>(c, std::span<const float>(*in),
                                                            std::span(out), op);
                       ADD_FAILURE() << "rank " << c.rank() << ": the all-reduce returned";
                     } catch (const weft::error& e) {
                       seen[static_cast<std::size_t>(c.rank())] = e.what();
                     }
                     if (c.rank() == 0) std::fill(in->begin(), in->end(), 1e6f);
                     if (c.rank() == 2) in.reset();
                     if (c.rank() == slow) slow_out = out;
                   },
                   {.timeout = 300ms});
  EXPECT_NE(seen[0].find("rank 1 is stalled inside all_reduce"), std::string::npos) << seen[0];
  // Rank 1 reduces block 1 of every rank's input into its output before its error.
  const std::size_t block = n / p;
  ASSERT_EQ(slow_out.size(), n);
  for (std::size_t i = block; i < 2 * block; ++i) {
    ASSERT_EQ(slow_out[i], input(0, i) + input(1, i) + input(2, i)) << "element " << i;
  }
}

// on_failure::abort_job: the first call that fails prints weft's error (naming the stalled
// rank) and ends the process, instead of throwing. Splits inherit the policy.
TEST(failure_semantics_death_test, abort_job_prints_the_error_and_ends_the_process) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto run = [] {
    weft::local::run(3,
                     [](weft::local::communicator& c) {
                       auto sub = c.split(0, c.rank());
                       if (c.rank() == 1) std::this_thread::sleep_for(5s);
                       std::vector<int> v(8, 1);
                       weft::all_reduce<weft::algo::ring>(sub, std::span(v));
                     },
                     {.timeout = 200ms, .on_failure = weft::on_failure::abort_job});
  };
  EXPECT_DEATH(
      run(),
      "rank 1 is outside any weft operation.*weft: ending the job \\(on_failure::abort_job\\)");
}

TEST(failure_semantics, the_policy_defaults_to_throwing_and_is_inherited) {
  weft::local::run(2, [](weft::local::communicator& c) {
    EXPECT_EQ(c.failure_policy(), weft::on_failure::throw_error);
    c.set_failure_policy(weft::on_failure::abort_job);
    auto sub = c.split(0, c.rank());
    EXPECT_EQ(sub.failure_policy(), weft::on_failure::abort_job);
    c.set_failure_policy(weft::on_failure::throw_error);
  });
}

} // namespace
