// The life of a CUDA communicator (weft/cuda/detail/comm_state.hpp), driven on the host with
// made-up native answers: every transition, checked against the expectations written here.
#include <weft/cuda/detail/comm_state.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

using weft::cuda::detail::comm_action;
using weft::cuda::detail::comm_phase;
using weft::cuda::detail::comm_state;
using weft::cuda::detail::judge_drain;
using weft::cuda::detail::judge_poll;
using weft::cuda::detail::native_codes;
using weft::cuda::detail::poll_verdict;
using weft::cuda::detail::stream_poll;

// Not NCCL's values on purpose: the state machine must take whatever it is given.
constexpr int ok = 10;
constexpr int busy = 11;  // "in progress"
constexpr int broken = 3; // an error (a system error, a peer's failure)
constexpr native_codes codes{ok, busy};

comm_state owned_state() { return comm_state(codes, true, nullptr); }

std::string thrown_by(const comm_state& s, std::string_view operation, int rank) {
  try {
    s.family()->rethrow(operation, rank);
  } catch (const weft::error& e) {
    return e.what();
  }
  return "";
}

TEST(cuda_comm_state, one_poll_is_judged_async_error_first_then_work_then_clock) {
  struct row {
    int async;
    bool done;
    bool late;
    poll_verdict want;
  };
  const row table[] = {
      {ok, true, false, poll_verdict::done},
      {ok, true, true, poll_verdict::done},
      {ok, false, false, poll_verdict::waiting},
      {ok, false, true, poll_verdict::timed_out},
      {busy, true, false, poll_verdict::waiting},
      {busy, true, true, poll_verdict::timed_out},
      {busy, false, true, poll_verdict::timed_out},
      {broken, true, false, poll_verdict::async_error},
      {broken, false, true, poll_verdict::async_error},
      {-1, false, false, poll_verdict::async_error},
  };
  for (const row& r : table) {
    EXPECT_EQ(judge_poll(codes, r.async, r.done, r.late), r.want)
        << "async " << r.async << " done " << r.done << " late " << r.late;
  }
}

TEST(cuda_comm_state, a_call_that_succeeds_leaves_it_ok) {
  auto s = owned_state();
  EXPECT_EQ(s.phase(), comm_phase::ok);
  EXPECT_EQ(s.enter(), comm_action::proceed);
  EXPECT_EQ(s.returned(ok), comm_action::proceed);
  EXPECT_EQ(s.phase(), comm_phase::ok);
  EXPECT_TRUE(s.holds_native());
  EXPECT_FALSE(s.family()->failed());
}

TEST(cuda_comm_state, in_progress_is_polled_until_it_settles) {
  auto s = owned_state();
  EXPECT_EQ(s.returned(busy), comm_action::poll);
  EXPECT_EQ(s.phase(), comm_phase::in_progress);
  EXPECT_EQ(s.polled(busy, true, false), comm_action::poll);
  EXPECT_EQ(s.phase(), comm_phase::in_progress);
  EXPECT_EQ(s.polled(ok, true, false), comm_action::proceed);
  EXPECT_EQ(s.phase(), comm_phase::ok);
  EXPECT_EQ(s.enter(), comm_action::proceed);
}

TEST(cuda_comm_state, a_timeout_aborts_an_owned_communicator_and_every_later_call_throws_it) {
  auto s = owned_state();
  ASSERT_EQ(s.returned(busy), comm_action::poll);
  EXPECT_EQ(s.polled(busy, true, true), comm_action::record_failure);
  EXPECT_EQ(s.last_verdict(), poll_verdict::timed_out);
  const std::string original =
      "weft: barrier on rank 1: timed out after 300 ms waiting to have every rank enter";
  EXPECT_EQ(s.fail(original), comm_action::abort);
  EXPECT_EQ(s.phase(), comm_phase::failed);
  s.aborted();
  EXPECT_EQ(s.phase(), comm_phase::aborted);
  EXPECT_FALSE(s.holds_native());
  // Later calls: nothing native is left, they throw the first failure at once.
  EXPECT_EQ(s.enter(), comm_action::throw_failure);
  EXPECT_EQ(s.enter(), comm_action::throw_failure);
  const std::string later = thrown_by(s, "all_reduce", 1);
  EXPECT_NE(later.find("all_reduce on rank 1"), std::string::npos) << later;
  EXPECT_NE(later.find(original), std::string::npos) << later;
  // A second failure does not replace the first.
  EXPECT_EQ(s.fail("weft: something later"), comm_action::throw_failure);
  EXPECT_EQ(s.family()->what(), original);
}

TEST(cuda_comm_state, an_async_error_while_waiting_fails_it_before_the_deadline) {
  auto s = owned_state();
  ASSERT_EQ(s.enter(), comm_action::proceed);
  EXPECT_EQ(s.polled(ok, false, false), comm_action::poll); // the stream is busy: wait
  EXPECT_EQ(s.polled(broken, false, false), comm_action::record_failure);
  EXPECT_EQ(s.last_verdict(), poll_verdict::async_error);
  EXPECT_EQ(s.fail("weft: synchronize on rank 0: ncclRemoteError"), comm_action::abort);
}

TEST(cuda_comm_state, a_peer_error_shows_as_an_async_error_even_when_the_work_is_done) {
  auto s = owned_state();
  EXPECT_EQ(s.polled(broken, true, false), comm_action::record_failure);
  EXPECT_EQ(s.last_verdict(), poll_verdict::async_error);
}

TEST(cuda_comm_state, an_error_a_call_returns_is_a_failure) {
  auto s = owned_state();
  EXPECT_EQ(s.returned(broken), comm_action::record_failure);
  EXPECT_EQ(s.fail("weft: all_reduce on rank 2 (peer 3): ncclSend failed"), comm_action::abort);
  s.aborted();
  EXPECT_EQ(s.enter(), comm_action::throw_failure);
}

TEST(cuda_comm_state, a_borrowed_communicator_fails_without_an_abort_and_is_never_released) {
  comm_state s(codes, false, nullptr);
  EXPECT_FALSE(s.holds_native());
  EXPECT_EQ(s.polled(busy, false, true), comm_action::record_failure);
  EXPECT_EQ(s.fail("weft: barrier on rank 0: timed out"), comm_action::throw_failure);
  EXPECT_EQ(s.phase(), comm_phase::failed);
  EXPECT_EQ(s.enter(), comm_action::throw_failure);
  EXPECT_EQ(s.destroy_begin(false), comm_action::none);
  EXPECT_EQ(s.phase(), comm_phase::destroyed);
  comm_state healthy(codes, false, nullptr);
  EXPECT_EQ(healthy.destroy_begin(false), comm_action::none);
}

TEST(cuda_comm_state, a_split_shares_the_failure_both_ways) {
  auto parent = owned_state();
  comm_state child(codes, true, parent.family(), parent.policy());
  ASSERT_EQ(child.enter(), comm_action::proceed);
  // The parent fails: the child's next call aborts its own native communicator, then throws.
  EXPECT_EQ(parent.fail("weft: all_reduce on rank 0: timed out"), comm_action::abort);
  parent.aborted();
  EXPECT_EQ(child.enter(), comm_action::abort);
  child.aborted();
  EXPECT_EQ(child.enter(), comm_action::throw_failure);
  EXPECT_NE(thrown_by(child, "reduce_scatter", 0).find("weft: all_reduce on rank 0: timed out"),
            std::string::npos);
  // And the other way: a child's failure fails a parent that never failed itself, and a
  // parent that has not made a call since is aborted when it is destroyed.
  auto other = owned_state();
  comm_state side(codes, true, other.family());
  EXPECT_EQ(side.fail("weft: side failed"), comm_action::abort);
  side.aborted();
  EXPECT_EQ(other.destroy_begin(false), comm_action::abort);
  auto third = owned_state();
  comm_state third_child(codes, true, third.family());
  EXPECT_EQ(third_child.fail("weft: child failed"), comm_action::abort);
  EXPECT_EQ(third.enter(), comm_action::abort);
  EXPECT_EQ(third.phase(), comm_phase::failed);
}

TEST(cuda_comm_state, a_split_of_a_failed_communicator_fails_too) {
  auto parent = owned_state();
  EXPECT_EQ(parent.fail("weft: barrier on rank 1: timed out"), comm_action::abort);
  parent.aborted();
  EXPECT_EQ(parent.enter(), comm_action::throw_failure); // split() begins with enter(): it throws
  comm_state late(codes, true, parent.family());         // a split made anyway shares the failure
  EXPECT_EQ(late.enter(), comm_action::abort);
  late.aborted();
  EXPECT_EQ(late.enter(), comm_action::throw_failure);
}

TEST(cuda_comm_state, destroying_a_healthy_one_finalizes_then_destroys) {
  auto s = owned_state();
  EXPECT_EQ(s.destroy_begin(false), comm_action::finalize);
  EXPECT_EQ(s.phase(), comm_phase::finalizing);
  EXPECT_EQ(s.finalize_returned(busy), comm_action::poll);
  EXPECT_EQ(s.finalize_polled(busy, false), comm_action::poll);
  EXPECT_EQ(s.finalize_polled(ok, false), comm_action::destroy);
  s.destroyed();
  EXPECT_EQ(s.phase(), comm_phase::destroyed);
  auto blocking = owned_state(); // a blocking communicator's finalize answers at once
  ASSERT_EQ(blocking.destroy_begin(false), comm_action::finalize);
  EXPECT_EQ(blocking.finalize_returned(ok), comm_action::destroy);
}

TEST(cuda_comm_state, destroying_is_bounded_by_the_deadline) {
  // A finalize that never settles (a peer is dead): the polls end in an abort at the first
  // poll past the deadline, never later.
  auto s = owned_state();
  ASSERT_EQ(s.destroy_begin(false), comm_action::finalize);
  comm_action a = s.finalize_returned(busy);
  int polls = 0;
  constexpr int deadline_at = 5;
  while (a == comm_action::poll && polls < 100) {
    ++polls;
    a = s.finalize_polled(busy, polls >= deadline_at);
  }
  EXPECT_EQ(a, comm_action::abort);
  EXPECT_EQ(polls, deadline_at);
  // An error while finalizing, or from the finalize itself, aborts too.
  auto t = owned_state();
  ASSERT_EQ(t.destroy_begin(false), comm_action::finalize);
  EXPECT_EQ(t.finalize_polled(broken, false), comm_action::abort);
  EXPECT_EQ(t.finalize_returned(broken), comm_action::abort);
  // The stream did not drain in time, or the program asked for it: abort without finalizing.
  auto u = owned_state();
  EXPECT_EQ(u.destroy_begin(true), comm_action::abort);
}

TEST(cuda_comm_state, destroying_a_failed_one_aborts_or_has_nothing_left) {
  auto s = owned_state();
  ASSERT_EQ(s.fail("weft: x"), comm_action::abort);
  EXPECT_EQ(s.destroy_begin(false), comm_action::abort); // not aborted yet (a group was open)
  s.aborted();
  EXPECT_EQ(s.destroy_begin(false), comm_action::none);
  EXPECT_EQ(s.phase(), comm_phase::destroyed);
}

TEST(cuda_comm_state, the_policy_says_whether_a_failure_ends_the_job) {
  EXPECT_FALSE(owned_state().ends_job());
  EXPECT_EQ(owned_state().policy(), weft::on_failure::throw_error);
  comm_state s(codes, true, nullptr, weft::on_failure::abort_job);
  EXPECT_TRUE(s.ends_job());
  comm_state child(codes, true, s.family(), s.policy());
  EXPECT_TRUE(child.ends_job());
}

TEST(cuda_comm_state, a_failed_one_never_becomes_ok_again) {
  comm_state s(codes, false, nullptr); // borrowed: stays failed, nothing native to abort
  ASSERT_EQ(s.fail("weft: first"), comm_action::throw_failure);
  EXPECT_EQ(s.returned(ok), comm_action::record_failure);
  EXPECT_EQ(s.polled(ok, true, false), comm_action::record_failure);
  EXPECT_EQ(s.phase(), comm_phase::failed);
  EXPECT_EQ(s.enter(), comm_action::throw_failure);
  EXPECT_EQ(s.family()->what(), "weft: first");
}

TEST(cuda_comm_state, after_an_abort_the_stream_is_drained_then_the_failure_leaves) {
  struct row {
    stream_poll stream;
    bool bound_passed;
    comm_action want;
  };
  const row table[] = {
      {stream_poll::idle, false, comm_action::proceed},
      {stream_poll::idle, true, comm_action::proceed},    // drained at the bound: still an answer
      {stream_poll::broken, false, comm_action::proceed}, // the device runs nothing of it any more
      {stream_poll::broken, true, comm_action::proceed},
      {stream_poll::busy, false, comm_action::poll},
      {stream_poll::busy, true, comm_action::end_job}, // work that writes the buffers still queued
  };
  for (const row& r : table) {
    EXPECT_EQ(judge_drain(r.stream, r.bound_passed), r.want)
        << "stream " << static_cast<int>(r.stream) << " bound passed " << r.bound_passed;
  }
}

TEST(cuda_comm_state, a_drain_may_take_the_deadline_and_never_less_than_the_floor) {
  using namespace std::chrono_literals;
  using weft::cuda::detail::drain_bound;
  using weft::cuda::detail::drain_floor;
  EXPECT_EQ(drain_bound(300ms),
            drain_floor); // a short deadline: the program's own kernels get time
  EXPECT_EQ(drain_bound(10s), 10s);
  EXPECT_EQ(drain_bound(std::chrono::minutes(5)), std::chrono::minutes(5));
  static_assert(drain_floor == std::chrono::seconds(10));
}

TEST(cuda_comm_state, a_stream_that_drains_in_time_lets_the_failure_leave) {
  // The sequence a failure of an owned communicator goes through: fail, abort, drain, throw.
  auto s = owned_state();
  ASSERT_EQ(s.polled(ok, false, true), comm_action::record_failure);
  ASSERT_EQ(s.fail("weft: synchronize on rank 0: timed out"), comm_action::abort);
  s.aborted();
  comm_action a = comm_action::poll;
  int polls = 0;
  constexpr int idle_at = 3; // NCCL's kernels return, weft's kernels behind them finish
  while (a == comm_action::poll && polls < 100) {
    ++polls;
    a = judge_drain(polls >= idle_at ? stream_poll::idle : stream_poll::busy, false);
  }
  EXPECT_EQ(a, comm_action::proceed);
  EXPECT_EQ(polls, idle_at);
  EXPECT_EQ(s.enter(), comm_action::throw_failure); // nothing native left, nothing to drain
}

TEST(cuda_comm_state, a_stream_that_does_not_drain_ends_the_job_at_the_bound_never_later) {
  comm_action a = comm_action::poll;
  int polls = 0;
  constexpr int bound_at = 5;
  while (a == comm_action::poll && polls < 100) {
    ++polls;
    a = judge_drain(stream_poll::busy, polls >= bound_at);
  }
  EXPECT_EQ(a, comm_action::end_job);
  EXPECT_EQ(polls, bound_at);
}

// The end of the job: weft's message on stderr, then the transport's end (MPI_Abort under MPI),
// then std::abort() if that returned or there is none.
void exit_with_3() noexcept { std::_Exit(3); }
void returns() noexcept {}

TEST(cuda_comm_state_death, end_job_prints_the_failure_then_calls_the_end) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(weft::cuda::detail::end_job("weft: all_reduce on rank 2: timed out", exit_with_3),
              testing::ExitedWithCode(3), "weft: all_reduce on rank 2: timed out");
  EXPECT_DEATH(weft::cuda::detail::end_job("weft: barrier on rank 0: failed", nullptr),
               "weft: barrier on rank 0: failed");
  EXPECT_DEATH(weft::cuda::detail::end_job("weft: x on rank 1: y", returns), "ending the job");
}

TEST(cuda_comm_state, names_of_phases_and_actions) {
  EXPECT_EQ(name_of(comm_phase::in_progress), "in_progress");
  EXPECT_EQ(name_of(comm_phase::aborted), "aborted");
  EXPECT_EQ(name_of(comm_action::record_failure), "record_failure");
  EXPECT_EQ(name_of(comm_action::finalize), "finalize");
  EXPECT_EQ(name_of(comm_action::end_job), "end_job");
}

} // namespace
