// The epochs of the p2p transport's syncs (weft/cuda/detail/p2p_epoch.hpp) on the host: the
// rules the sync kernel follows, and a pair of ranks stepped through a timed-out sync by hand
// to show that no later sync passes on a stale flag.
#include <weft/cuda/detail/p2p_epoch.hpp>

#include <gtest/gtest.h>

#include <cstdint>

namespace {

namespace wd = weft::cuda::detail;
using wd::p2p_cause;
using wd::p2p_wait;

constexpr std::uint64_t top_bit = std::uint64_t{1} << 63;

TEST(p2p_epoch, a_flag_passes_only_at_or_after_its_epoch_and_never_abandoned) {
  struct row {
    std::uint64_t flag;
    std::uint64_t want;
    bool rank_failed;
    bool late;
    p2p_wait expected;
  };
  const row table[] = {
      {4, 5, false, false, p2p_wait::waiting},
      {5, 5, false, false, p2p_wait::passed},
      {6, 5, false, false, p2p_wait::passed}, // a peer one sync ahead
      {5, 5, true, true, p2p_wait::passed},   // an arrival is an answer, even at the deadline
      {4, 5, false, true, p2p_wait::timed_out},
      {4, 5, true, true, p2p_wait::rank_failed},
      {4 | top_bit, 5, false, false, p2p_wait::peer_abandoned},
      {5 | top_bit, 5, false, false, p2p_wait::peer_abandoned}, // carries the very epoch: still no
      {9 | top_bit, 5, true, true, p2p_wait::peer_abandoned},
      {top_bit, 1, false, false, p2p_wait::peer_abandoned},
  };
  for (const row& r : table) {
    EXPECT_EQ(wd::p2p_judge_flag(r.flag, r.want, r.rank_failed, r.late), r.expected)
        << "flag " << r.flag << " want " << r.want;
  }
  static_assert(wd::p2p_abandoned(5) == (5 | top_bit));
  static_assert(wd::p2p_is_abandoned(wd::p2p_abandoned(0)) && !wd::p2p_is_abandoned(~top_bit));
}

TEST(p2p_epoch, a_sync_starts_only_while_the_rank_has_not_failed) {
  EXPECT_TRUE(wd::p2p_may_start(0));
  EXPECT_FALSE(wd::p2p_may_start(1));
  EXPECT_FALSE(wd::p2p_may_start(top_bit));
}

TEST(p2p_epoch, the_data_gate_reads_the_failed_mark_each_time_it_is_asked) {
  std::uint64_t mark = 0; // counters[rank]
  const wd::p2p_data_gate gate{&mark};
  EXPECT_TRUE(gate());
  mark = 1; // a sync of the rank gave up
  EXPECT_FALSE(gate());
  mark = top_bit;
  EXPECT_FALSE(gate());
  mark = 0;
  EXPECT_TRUE(gate()); // not cached: a kernel launched later reads the mark anew
}

TEST(p2p_epoch, the_error_word_keeps_cause_sync_and_peer) {
  struct row {
    p2p_cause cause;
    std::uint32_t sync;
    int peer;
  };
  const row table[] = {{p2p_cause::timed_out, 0, 0},
                       {p2p_cause::peer_abandoned, 0x12345, 7},
                       {p2p_cause::host_failed, 0x7fffffff, 63},
                       {p2p_cause::timed_out, 42, 1}};
  for (const row& r : table) {
    const std::uint64_t w = wd::p2p_error_word(r.cause, r.sync, r.peer);
    EXPECT_NE(w, 0u); // zero means "no failure"
    const wd::p2p_error e = wd::p2p_read_error_word(w);
    EXPECT_EQ(e.cause, r.cause);
    EXPECT_EQ(e.sync, r.sync);
    EXPECT_EQ(e.peer, r.peer);
  }
  // The sync number wraps at 31 bits, as the communicator numbers them.
  EXPECT_EQ(wd::p2p_read_error_word(wd::p2p_error_word(p2p_cause::timed_out, 0x80000003u, 2)).sync,
            3u);
  // A timeout's word is laid out as (1 << 63) | sync << 32 | peer.
  EXPECT_EQ(wd::p2p_error_word(p2p_cause::timed_out, 9, 4),
            top_bit | (std::uint64_t{9} << 32) | 4u);
  EXPECT_EQ(wd::p2p_cause_of(p2p_wait::peer_abandoned), p2p_cause::peer_abandoned);
  EXPECT_EQ(wd::p2p_cause_of(p2p_wait::timed_out), p2p_cause::timed_out);
  EXPECT_EQ(wd::name_of(p2p_cause::host_failed), "host_failed");
}

// Two ranks r and q by hand: what each stores and reads, step by step, as the sync kernel
// does it (counters and flags of both workspaces).
struct pair_of_ranks {
  std::uint64_t r_counter = 0; // r's counters[q]
  std::uint64_t q_counter = 0; // q's counters[r]
  std::uint64_t r_flag = 0;    // r's flags[q]: stored by q
  std::uint64_t q_flag = 0;    // q's flags[r]: stored by r
  std::uint64_t r_failed = 0;  // r's counters[r]: its failed mark
};

TEST(p2p_epoch, a_peer_that_arrives_after_a_timeout_finds_the_epoch_abandoned) {
  pair_of_ranks p;
  // Epoch 1: both arrive.
  ASSERT_TRUE(wd::p2p_may_start(p.r_failed));
  p.r_counter = 1;
  p.q_flag = 1;
  p.q_counter = 1;
  p.r_flag = 1;
  EXPECT_EQ(wd::p2p_judge_flag(p.r_flag, 1, false, false), p2p_wait::passed);
  EXPECT_EQ(wd::p2p_judge_flag(p.q_flag, 1, false, false), p2p_wait::passed);
  // Epoch 2: r counts and publishes it, q is late, r times out.
  p.r_counter = 2;
  p.q_flag = 2;
  const p2p_wait r_waits = wd::p2p_judge_flag(p.r_flag, 2, false, true);
  ASSERT_EQ(r_waits, p2p_wait::timed_out);
  // The half-advanced pair: r's flag 2 alone would let q pass an epoch r gave up on.
  EXPECT_EQ(wd::p2p_judge_flag(p.q_flag, 2, false, false), p2p_wait::passed);
  // So r marks itself failed and abandons the epoch it counted.
  p.r_failed = 1;
  p.q_flag = wd::p2p_abandoned(p.r_counter);
  // q arrives late at epoch 2: it fails instead of passing.
  p.q_counter = 2;
  p.r_flag = 2; // the flag r gave up on: r never reads it again
  EXPECT_EQ(wd::p2p_judge_flag(p.q_flag, p.q_counter, false, false), p2p_wait::peer_abandoned);
  // r's next sync neither counts nor publishes: epoch 3 never exists on r's side.
  EXPECT_FALSE(wd::p2p_may_start(p.r_failed));
  EXPECT_EQ(p.r_counter, 2u);
  // And q's next sync with r (epoch 3) fails at once too, whatever epoch it waits for.
  for (std::uint64_t want = 3; want < 6; ++want) {
    EXPECT_EQ(wd::p2p_judge_flag(p.q_flag, want, false, false), p2p_wait::peer_abandoned) << want;
  }
}

TEST(p2p_epoch, a_peer_that_read_the_live_flag_in_time_passes_and_fails_at_the_next_sync) {
  pair_of_ranks p;
  p.r_counter = 1;
  p.q_flag = 1; // r published epoch 1
  p.q_counter = 1;
  p.r_flag = 1; // q arrives just as r's clock runs out
  EXPECT_EQ(wd::p2p_judge_flag(p.q_flag, 1, false, false), p2p_wait::passed); // q saw r's live flag
  EXPECT_EQ(wd::p2p_judge_flag(0, 1, false, true), p2p_wait::timed_out); // r had not seen q's yet
  p.r_failed = 1;
  p.q_flag = wd::p2p_abandoned(p.r_counter);
  // r's data steps after its failed sync (loads of q's data that no sync of r vouches for, the
  // copy into the caller's output) do nothing; q's, whose mark is clear, run.
  std::uint64_t q_failed = 0;
  EXPECT_FALSE((wd::p2p_data_gate{&p.r_failed})());
  EXPECT_TRUE((wd::p2p_data_gate{&q_failed})());
  p.q_counter = 2; // q's next sync with r
  EXPECT_EQ(wd::p2p_judge_flag(p.q_flag, p.q_counter, false, false), p2p_wait::peer_abandoned);
}

} // namespace
