#include <weft/pipeline/schedule.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <set>
#include <string>
#include <vector>

namespace {

using weft::pipeline::action;
using weft::pipeline::action_kind;
using weft::pipeline::from_compute_order;
using weft::pipeline::schedule;
using weft::pipeline::token;

action F(int mb, int c = 0) { return {action_kind::forward, mb, c}; }
action B(int mb, int c = 0) { return {action_kind::backward, mb, c}; }
action W(int mb, int c = 0) { return {action_kind::weight, mb, c}; }

std::vector<std::string> tokens(const std::vector<action>& list) {
  std::vector<std::string> out;
  for (const action& a : list)
    out.push_back(token(a));
  return out;
}

TEST(pipeline_schedule, tokens_name_kind_microbatch_chunk_and_peer) {
  EXPECT_EQ(token(F(3, 1)), "F3.1");
  EXPECT_EQ(token(B(0)), "B0.0");
  EXPECT_EQ(token(W(12, 2)), "W12.2");
  EXPECT_EQ(token({action_kind::send_activation, 3, 1, 2, 8}), "send:F3.1->2");
  EXPECT_EQ(token({action_kind::recv_activation, 3, 1, 1, 8}), "recv:F3.1<-1");
  EXPECT_EQ(token({action_kind::send_gradient, 3, 1, 0, 8}), "send:B3.1->0");
  EXPECT_EQ(token({action_kind::recv_gradient, 3, 1, 2, 8}), "recv:B3.1<-2");
}

TEST(pipeline_schedule, receives_sit_before_their_consumer_and_sends_after_their_producer) {
  // 1F1B, p = 2, m = 2, written out by hand.
  const schedule s = from_compute_order(
      "1f1b", 2, 2, 1, false, {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(1), B(1)}}, 100, 200);
  EXPECT_EQ(tokens(s.ranks[0]),
            (std::vector<std::string>{"F0.0", "send:F0.0->1", "F1.0", "send:F1.0->1",
                                      "recv:B0.0<-1", "B0.0", "recv:B1.0<-1", "B1.0"}));
  EXPECT_EQ(tokens(s.ranks[1]),
            (std::vector<std::string>{"recv:F0.0<-0", "F0.0", "B0.0", "send:B0.0->0",
                                      "recv:F1.0<-0", "F1.0", "B1.0", "send:B1.0->0"}));
  EXPECT_EQ(s.ranks[0][1].bytes, 100U); // activations
  EXPECT_EQ(s.ranks[0][4].bytes, 200U); // gradients
  EXPECT_EQ(s.ranks[1][0].bytes, 100U);
  EXPECT_EQ(s.ranks[1][3].bytes, 200U);
  EXPECT_EQ(s.ranks[0][0].bytes, 0U); // compute carries no message
  EXPECT_EQ(tokens(s.compute(1)), (std::vector<std::string>{"F0.0", "B0.0", "F1.0", "B1.0"}));
}

TEST(pipeline_schedule, chunks_hand_microbatches_round_the_ranks) {
  // p = 2, V = 2: virtual stages r0/c0, r1/c0, r0/c1, r1/c1. Chunk 1 of rank 0 receives from
  // and sends to rank 1; chunk 0 of rank 0 only sends, chunk 1 of rank 1 only receives.
  schedule shape;
  shape.stages = 2;
  shape.chunks = 2;
  EXPECT_EQ(shape.virtual_stage(0, 1), 2);
  EXPECT_EQ(shape.rank_of(3), 1);
  const schedule s = from_compute_order(
      "x", 2, 1, 2, false,
      {{F(0, 0), F(0, 1), B(0, 1), B(0, 0)}, {F(0, 0), F(0, 1), B(0, 1), B(0, 0)}}, 0, 0);
  EXPECT_EQ(
      tokens(s.ranks[0]),
      (std::vector<std::string>{"F0.0", "send:F0.0->1", "recv:F0.1<-1", "F0.1", "send:F0.1->1",
                                "recv:B0.1<-1", "B0.1", "send:B0.1->1", "recv:B0.0<-1", "B0.0"}));
  EXPECT_EQ(
      tokens(s.ranks[1]),
      (std::vector<std::string>{"recv:F0.0<-0", "F0.0", "send:F0.0->0", "recv:F0.1<-0", "F0.1",
                                "B0.1", "send:B0.1->0", "recv:B0.0<-0", "B0.0", "send:B0.0->0"}));
}

TEST(pipeline_schedule, one_stage_sends_nothing) {
  const schedule s = from_compute_order(
      "x", 1, 2, 2, true, {{F(0, 0), F(0, 1), B(0, 1), W(0, 1), B(0, 0), W(0, 0)}}, 4, 4);
  EXPECT_EQ(tokens(s.ranks[0]),
            (std::vector<std::string>{"F0.0", "F0.1", "B0.1", "W0.1", "B0.0", "W0.0"}));
}

TEST(pipeline_schedule, a_send_and_its_receive_share_a_tag_no_other_message_has) {
  std::vector<action> order;
  for (int mb = 0; mb < 3; ++mb)
    for (int c = 0; c < 2; ++c)
      order.push_back(F(mb, c));
  for (int mb = 0; mb < 3; ++mb)
    for (int c = 1; c >= 0; --c)
      order.push_back(B(mb, c));
  const schedule s = from_compute_order("x", 3, 3, 2, false, {order, order, order}, 0, 0);
  std::multiset<std::size_t> sent;
  std::multiset<std::size_t> received;
  const std::size_t limit = 2 * 3 * 6;
  for (int r = 0; r < 3; ++r) {
    for (const action& a : s.ranks[static_cast<std::size_t>(r)]) {
      if (weft::pipeline::is_compute(a.kind)) continue;
      const std::size_t tag = s.message_tag(r, a);
      EXPECT_LT(tag, limit);
      (weft::pipeline::is_send(a.kind) ? sent : received).insert(tag);
    }
  }
  // Each of the 5 hops between the 6 virtual stages carries 3 activations and 3 gradients.
  EXPECT_EQ(sent.size(), 30U);
  EXPECT_EQ(std::set<std::size_t>(sent.begin(), sent.end()).size(), sent.size());
  EXPECT_EQ(sent, received);
  EXPECT_THROW((void)s.message_tag(0, F(0)), weft::error);
}

TEST(pipeline_schedule, text_is_one_line_per_rank_of_compute_tokens) {
  const schedule s = from_compute_order("1f1b", 2, 2, 1, false,
                                        {{F(0), F(1), B(0), B(1)}, {F(0), B(0), F(1), B(1)}}, 0, 0);
  EXPECT_EQ(weft::pipeline::to_text(s),
            "rank 0: F0.0 F1.0 B0.0 B1.0\nrank 1: F0.0 B0.0 F1.0 B1.0\n");
}

TEST(pipeline_schedule, building_checks_the_number_of_orders) {
  try {
    (void)from_compute_order("mine", 3, 2, 1, false, {{F(0)}, {F(0)}}, 0, 0);
    FAIL() << "two orders for three stages were accepted";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("'mine' built from 2 compute orders for 3 stages"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
