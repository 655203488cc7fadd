#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/validate.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace pl = weft::pipeline;
using pl::action;
using pl::action_kind;

action F(int mb, int c = 0) { return {action_kind::forward, mb, c}; }
action B(int mb, int c = 0) { return {action_kind::backward, mb, c}; }
action W(int mb, int c = 0) { return {action_kind::weight, mb, c}; }

// The index of the action written `text` in rank r's list.
std::size_t find(const pl::schedule& s, int r, std::string_view text) {
  const auto& list = s.ranks[static_cast<std::size_t>(r)];
  for (std::size_t i = 0; i < list.size(); ++i)
    if (pl::token(list[i]) == text) return i;
  ADD_FAILURE() << "rank " << r << " has no " << text;
  return 0;
}

void erase(pl::schedule& s, int r, std::string_view text) {
  auto& list = s.ranks[static_cast<std::size_t>(r)];
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(find(s, r, text)));
}

struct rejection {
  std::string what;
  int rank;
  int peer;
};

std::optional<rejection> rejection_of(const pl::schedule& s) {
  try {
    pl::validate(s);
  } catch (const weft::error& e) {
    return rejection{e.what(), e.rank(), e.peer()};
  }
  return std::nullopt;
}

// The message names the rank, the action's index and token, and says what is wrong.
::testing::AssertionResult rejected_at(const pl::schedule& s, int rank, std::size_t index,
                                       std::string_view token, std::string_view why) {
  const auto r = rejection_of(s);
  if (!r) return ::testing::AssertionFailure() << "accepted";
  // "on rank R (peer P): action ..." where the action is a message.
  const std::string where = "action " + std::to_string(index) + " (" + std::string(token) + "): ";
  if (r->rank != rank || r->what.find("on rank " + std::to_string(rank)) == std::string::npos ||
      r->what.find(where) == std::string::npos || r->what.find(why) == std::string::npos) {
    return ::testing::AssertionFailure() << "rejected with \"" << r->what << "\" (rank " << r->rank
                                         << "), not at \"" << where << "\" for \"" << why << "\"";
  }
  return ::testing::AssertionSuccess() << r->what;
}

TEST(pipeline_validate, generated_schedules_pass) {
  EXPECT_NO_THROW(pl::validate(pl::one_f_one_b::make(4, 8)));
  EXPECT_NO_THROW(pl::validate(pl::interleaved<2>::make(4, 8)));
  EXPECT_NO_THROW(pl::validate(pl::zero_bubble_h1::make(4, 8)));
  EXPECT_NO_THROW(pl::validate(pl::gpipe::make(4, 8)));
}

TEST(pipeline_validate, a_backward_swapped_before_its_forward) {
  pl::schedule s = pl::one_f_one_b::make(2, 4);
  auto& list = s.ranks[1];
  std::swap(list[find(s, 1, "F0.0")], list[find(s, 1, "B0.0")]);
  EXPECT_TRUE(rejected_at(s, 1, 1, "B0.0", "runs before its forward F0.0"));
}

TEST(pipeline_validate, swapped_actions_that_deadlock) {
  // 1F1B, p = 2, m = 4; rank 1 runs B0 after F2 instead of before F1. Rank 0 sends F2 only
  // after B0, whose gradient rank 1 now sends only after receiving F2.
  const pl::schedule good = pl::one_f_one_b::make(2, 4);
  pl::schedule s = pl::from_compute_order(
      "swapped", 2, 4, 1, false,
      {good.compute(0), {F(0), F(1), F(2), B(0), B(1), B(2), F(3), B(3)}}, 0, 0);
  const auto r = rejection_of(s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 0);
  EXPECT_NE(r->what.find("validating schedule swapped on rank 0: the step deadlocks"),
            std::string::npos)
      << r->what;
  EXPECT_NE(r->what.find("rank 0 waits at action " + std::to_string(find(s, 0, "recv:B0.0<-1")) +
                         " (recv:B0.0<-1) for rank 1"),
            std::string::npos)
      << r->what;
  EXPECT_NE(r->what.find("rank 1 waits at action " + std::to_string(find(s, 1, "recv:F2.0<-0")) +
                         " (recv:F2.0<-0) for rank 0"),
            std::string::npos)
      << r->what;
}

TEST(pipeline_validate, a_missing_backward) {
  pl::schedule s = pl::one_f_one_b::make(2, 4);
  erase(s, 1, "B1.0");
  erase(s, 1, "send:B1.0->0");
  EXPECT_TRUE(
      rejected_at(s, 1, find(s, 1, "F1.0"), "F1.0", "forwarded but never backwarded: no B1.0"));
}

TEST(pipeline_validate, a_missing_forward) {
  pl::schedule s = pl::gpipe::make(1, 3);
  erase(s, 0, "F2.0");
  EXPECT_TRUE(rejected_at(s, 0, find(s, 0, "B2.0"), "B2.0", "runs before its forward F2.0"));
  erase(s, 0, "B2.0");
  const auto r = rejection_of(s);
  ASSERT_TRUE(r);
  EXPECT_NE(r->what.find("on rank 0: end of its list: F2.0 never runs"), std::string::npos)
      << r->what;
}

TEST(pipeline_validate, a_send_to_the_wrong_rank) {
  pl::schedule s = pl::one_f_one_b::make(3, 3);
  const std::size_t i = find(s, 0, "send:F1.0->1");
  s.ranks[0][i].peer = 2;
  EXPECT_TRUE(
      rejected_at(s, 0, i, "send:F1.0->2", "goes to rank 2, but its consumer runs on rank 1"));
  EXPECT_EQ(rejection_of(s)->peer, 2);
}

TEST(pipeline_validate, a_send_nobody_receives) {
  pl::schedule s = pl::one_f_one_b::make(3, 3);
  auto& list = s.ranks[1];
  const std::size_t first = find(s, 1, "send:F0.0->2");
  list.push_back(list[first]); // sent again at the end
  EXPECT_TRUE(rejected_at(s, 1, list.size() - 1, "send:F0.0->2",
                          "sent twice (first at action " + std::to_string(first) + ")"));
}

TEST(pipeline_validate, a_send_from_the_last_stage) {
  pl::schedule s = pl::one_f_one_b::make(2, 2);
  auto& list = s.ranks[1];
  const std::size_t i = find(s, 1, "F0.0") + 1;
  list.insert(list.begin() + static_cast<std::ptrdiff_t>(i),
              action{action_kind::send_activation, 0, 0, 0, 0});
  EXPECT_TRUE(
      rejected_at(s, 1, i, "send:F0.0->0", "the last virtual stage has no activation to send"));
}

TEST(pipeline_validate, a_receive_that_is_missing_or_late) {
  pl::schedule s = pl::one_f_one_b::make(3, 3);
  erase(s, 1, "recv:F0.0<-0");
  EXPECT_TRUE(rejected_at(s, 1, find(s, 1, "F0.0"), "F0.0",
                          "runs without first receiving its input from rank 0"));

  pl::schedule late = pl::one_f_one_b::make(3, 3);
  auto& list = late.ranks[2];
  const std::size_t recv = find(late, 2, "recv:F1.0<-1");
  std::swap(list[recv], list[recv + 1]); // now after F1.0
  EXPECT_TRUE(
      rejected_at(late, 2, recv, "F1.0", "runs without first receiving its input from rank 1"));
}

TEST(pipeline_validate, a_send_whose_output_never_leaves) {
  pl::schedule s = pl::one_f_one_b::make(3, 3);
  erase(s, 1, "send:B2.0->0");
  EXPECT_TRUE(
      rejected_at(s, 1, find(s, 1, "B2.0"), "B2.0", "its input gradient is never sent to rank 0"));
}

TEST(pipeline_validate, message_sizes_must_agree) {
  pl::schedule s = pl::one_f_one_b::make(2, 2, {.activation_bytes = 64, .gradient_bytes = 64});
  s.ranks[0][find(s, 0, "send:F1.0->1")].bytes = 100;
  EXPECT_TRUE(rejected_at(s, 1, find(s, 1, "recv:F1.0<-0"), "recv:F1.0<-0",
                          "expects 64 bytes, but rank 0 sends 100"));
}

TEST(pipeline_validate, weight_gradients) {
  pl::schedule s = pl::zero_bubble_h1::make(3, 3);
  erase(s, 2, "W0.0");
  EXPECT_TRUE(rejected_at(s, 2, find(s, 2, "B0.0"), "B0.0", "no weight gradient W0.0 follows"));

  pl::schedule early = pl::zero_bubble_h1::make(3, 3);
  auto& list = early.ranks[2];
  const std::size_t w = find(early, 2, "W1.0");
  list.insert(list.begin(), list[w]);
  list.erase(list.begin() + static_cast<std::ptrdiff_t>(w) + 1);
  EXPECT_TRUE(rejected_at(early, 2, 0, "W1.0", "runs before its backward B1.0"));

  pl::schedule unsplit = pl::one_f_one_b::make(2, 2);
  unsplit.ranks[0].push_back(W(0));
  EXPECT_TRUE(rejected_at(unsplit, 0, unsplit.ranks[0].size() - 1, "W0.0",
                          "a weight gradient in a schedule whose B is the whole backward"));
}

TEST(pipeline_validate, the_lowest_rank_then_the_lowest_index_is_named) {
  pl::schedule s = pl::one_f_one_b::make(4, 4);
  s.ranks[3].push_back(F(0));                      // rank 3, late in its list
  s.ranks[2].push_back(F(1));                      // rank 2, also late
  s.ranks[2].insert(s.ranks[2].begin() + 1, F(9)); // rank 2, early: microbatch out of range
  EXPECT_TRUE(rejected_at(s, 2, 1, "F9.0", "microbatch 9 is outside [0, 4)"));
}

TEST(pipeline_validate, one_stage_of_several_chunks_orders_them_locally) {
  // No messages when every virtual stage is on one rank: chunk 0 runs before chunk 1 forward,
  // after it backward.
  const pl::schedule good =
      pl::from_compute_order("local", 1, 1, 2, false, {{F(0, 0), F(0, 1), B(0, 1), B(0, 0)}}, 0, 0);
  EXPECT_NO_THROW(pl::validate(good));
  const pl::schedule bad =
      pl::from_compute_order("local", 1, 1, 2, false, {{F(0, 1), F(0, 0), B(0, 1), B(0, 0)}}, 0, 0);
  EXPECT_TRUE(rejected_at(bad, 0, 0, "F0.1", "runs before F0.0, its input, on this rank"));
  const pl::schedule bad_b =
      pl::from_compute_order("local", 1, 1, 2, false, {{F(0, 0), F(0, 1), B(0, 0), B(0, 1)}}, 0, 0);
  EXPECT_TRUE(rejected_at(bad_b, 0, 2, "B0.0",
                          "runs before B0.1, whose input gradient it needs, on this rank"));
}

TEST(pipeline_validate, the_shape_itself) {
  pl::schedule s = pl::one_f_one_b::make(2, 2);
  s.ranks.pop_back();
  const auto r = rejection_of(s);
  ASSERT_TRUE(r);
  EXPECT_NE(r->what.find("validating schedule 1f1b: has action lists for 1 ranks but 2 stages"),
            std::string::npos)
      << r->what;
  pl::schedule none;
  EXPECT_NE(rejection_of(none)->what.find("stages must be at least 1, not 0"), std::string::npos);
}

TEST(pipeline_validate, a_peer_out_of_range) {
  pl::schedule s = pl::one_f_one_b::make(2, 2);
  s.ranks[0][find(s, 0, "send:F0.0->1")].peer = 7;
  EXPECT_TRUE(
      rejected_at(s, 0, 1, "send:F0.0->7", "goes to rank 7, but its consumer runs on rank 1"));
}

} // namespace
