#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/stats.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace {

namespace pl = weft::pipeline;
using pl::action;
using pl::action_kind;

constexpr double tol = 1e-9;

std::size_t find(const pl::schedule& s, int r, std::string_view text) {
  const auto& list = s.ranks[static_cast<std::size_t>(r)];
  for (std::size_t i = 0; i < list.size(); ++i)
    if (pl::token(list[i]) == text) return i;
  ADD_FAILURE() << "rank " << r << " has no " << text;
  return 0;
}

// --- the mission brief's figure (MISSION.md, "The bubble") -----------------------------------

TEST(pipeline_stats, one_f_one_b_p8_m64_leaves_a_bubble_of_p_minus_1_over_m) {
  const pl::statistics st = pl::analyze(pl::one_f_one_b::make(8, 64));
  EXPECT_NEAR(st.bubble_over_ideal, 7.0 / 64.0, tol); // 10.9% of the ideal compute time
  EXPECT_EQ(std::round(st.bubble_over_ideal * 1000), 109);
  EXPECT_NEAR(st.idle_fraction, 7.0 / 71.0, tol); // the same bubble as a share of the step
  EXPECT_NEAR(st.step_time, (64 + 7) * 3.0, tol); // (m + p - 1)(T_F + T_B + T_W)
  EXPECT_NEAR(st.ideal_time, 64 * 3.0, tol);
}

TEST(pipeline_stats, interleaving_two_chunks_halves_the_bubble) {
  const double one = pl::analyze(pl::one_f_one_b::make(8, 64)).bubble_over_ideal;
  const pl::statistics two = pl::analyze(pl::interleaved<2>::make(8, 64));
  EXPECT_NEAR(two.bubble_over_ideal, 7.0 / 128.0, tol);
  EXPECT_NEAR(two.bubble_over_ideal / one, 0.5, tol);
  EXPECT_NEAR(two.ideal_time, 64 * 3.0, tol); // the chunks share the stage's work
  EXPECT_NEAR(pl::analyze(pl::interleaved<3>::make(8, 64)).bubble_over_ideal, 7.0 / 192.0, 1e-6);
}

// Qi et al. 2024: with T_F = T_B = T_W, ZB-H1's bubble is (p-1)(T_F + T_B - T_W) against
// 1F1B's (p-1)(T_F + T_B + T_W), at the same peak activation memory.
TEST(pipeline_stats, zero_bubble_h1_beats_one_f_one_b_by_the_papers_formula) {
  for (const double t : {1.0, 2.5}) {
    const pl::costs c{.forward = t, .backward = t, .weight = t};
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 4 * p; ++m) {
        const pl::statistics zb = pl::analyze(pl::zero_bubble_h1::make(p, m), c);
        const pl::statistics ofob = pl::analyze(pl::one_f_one_b::make(p, m), c);
        const double ideal = m * 3 * t;
        ASSERT_NEAR(zb.step_time, ideal + (p - 1) * (t + t - t), tol) << "p=" << p << " m=" << m;
        ASSERT_NEAR(ofob.step_time, ideal + (p - 1) * (t + t + t), tol) << "p=" << p << " m=" << m;
        ASSERT_EQ(*std::max_element(zb.peak_in_flight.begin(), zb.peak_in_flight.end()),
                  *std::max_element(ofob.peak_in_flight.begin(), ofob.peak_in_flight.end()))
            << "p=" << p << " m=" << m;
      }
    }
  }
  const double zb = pl::analyze(pl::zero_bubble_h1::make(8, 64)).step_time;
  const double ofob = pl::analyze(pl::one_f_one_b::make(8, 64)).step_time;
  EXPECT_NEAR(ofob - zb, 2 * 7 * 1.0, tol); // 2 (p-1) T_W
}

// --- activation memory and messages ----------------------------------------------------------

TEST(pipeline_stats, peak_in_flight_microbatches) {
  const int p = 4;
  const int m = 8;
  const pl::statistics ofob = pl::analyze(pl::one_f_one_b::make(p, m));
  const pl::statistics gp = pl::analyze(pl::gpipe::make(p, m));
  const pl::statistics zb = pl::analyze(pl::zero_bubble_h1::make(p, m));
  const pl::statistics il = pl::analyze(pl::interleaved<2>::make(p, m));
  for (int r = 0; r < p; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    EXPECT_EQ(ofob.peak_in_flight[ur], p - r) << r; // warmup p - r - 1, then one more before a B
    EXPECT_EQ(gp.peak_in_flight[ur], m) << r;       // everything before the first B
    EXPECT_EQ(zb.peak_in_flight[ur], p) << r;       // W held back, up to rank 0's 1F1B peak
    // Megatron-core's warmup, plus the first steady forward (pairs of microbatch and chunk).
    EXPECT_EQ(il.peak_in_flight[ur], std::min((p - r - 1) * 2 + p + 1, 2 * m)) << r;
  }
}

TEST(pipeline_stats, p2p_messages_and_bytes) {
  const pl::options o{.activation_bytes = 100, .gradient_bytes = 200};
  const pl::statistics ofob = pl::analyze(pl::one_f_one_b::make(4, 8, o));
  EXPECT_EQ(ofob.p2p_messages, 2U * 8 * 3); // each of p - 1 hops, each microbatch, both ways
  EXPECT_EQ(ofob.p2p_bytes, 8U * 3 * 300);
  const pl::statistics il = pl::analyze(pl::interleaved<2>::make(4, 8, o));
  EXPECT_EQ(il.p2p_messages, 2U * 8 * 7); // p V - 1 hops
  EXPECT_EQ(il.p2p_bytes, 8U * 7 * 300);
  EXPECT_EQ(pl::analyze(pl::one_f_one_b::make(1, 8, o)).p2p_messages, 0U);
}

// --- the simulation itself --------------------------------------------------------------------

// GPipe, p = 2, m = 2, T_F = 1, T_B + T_W = 2, each message L + bytes / bandwidth: worked out
// by hand.
TEST(pipeline_stats, a_timeline_worked_by_hand) {
  const pl::schedule s = pl::gpipe::make(2, 2, {.activation_bytes = 100, .gradient_bytes = 100});
  const double L = 0.25 + 100.0 / 400.0;
  const pl::timeline t = pl::simulate(
      s, {.forward = 1, .backward = 1.5, .weight = 0.5, .p2p_latency = 0.25, .p2p_bandwidth = 400});
  const auto span = [&](int r, std::string_view tok) {
    const std::size_t i = find(s, r, tok);
    return std::pair{t.start[static_cast<std::size_t>(r)][i],
                     t.end[static_cast<std::size_t>(r)][i]};
  };
  using P = std::pair<double, double>;
  EXPECT_EQ(span(0, "F0.0"), (P{0, 1}));
  EXPECT_EQ(span(0, "F1.0"), (P{1, 2}));
  EXPECT_EQ(span(1, "recv:F0.0<-0"), (P{0, 1 + L})); // the wait
  EXPECT_EQ(span(1, "F0.0"), (P{1 + L, 2 + L}));
  EXPECT_EQ(span(1, "F1.0"), (P{2 + L, 3 + L}));
  EXPECT_EQ(span(1, "B0.0"), (P{3 + L, 5 + L}));
  EXPECT_EQ(span(1, "B1.0"), (P{5 + L, 7 + L}));
  EXPECT_EQ(span(0, "B0.0"), (P{5 + 2 * L, 7 + 2 * L}));
  EXPECT_EQ(span(0, "B1.0"), (P{7 + 2 * L, 9 + 2 * L}));
  EXPECT_EQ(t.step_time, 9 + 2 * L);
  const pl::statistics st = pl::analyze(
      s, {.forward = 1, .backward = 1.5, .weight = 0.5, .p2p_latency = 0.25, .p2p_bandwidth = 400});
  EXPECT_EQ(st.busy, (std::vector<double>{6, 6}));
  EXPECT_NEAR(st.bubble_over_ideal, (3 + 2 * L) / 6, tol);
  EXPECT_NEAR(st.idle_fraction, 2 * (3 + 2 * L) / (2 * (9 + 2 * L)), tol);
}

// Every compute action starts exactly when its rank is free and its inputs have arrived:
// checked from the definitions, for every generator, uneven costs and a latency.
TEST(pipeline_stats, each_action_starts_when_its_rank_and_its_inputs_are_ready) {
  const pl::costs c{.forward = 1.3, .backward = 2.1, .weight = 0.7, .p2p_latency = 0.4};
  for (const pl::schedule& s :
       {pl::gpipe::make(3, 5), pl::one_f_one_b::make(4, 9), pl::zero_bubble_h1::make(4, 6),
        pl::interleaved<2>::make(3, 6), pl::interleaved<3>::make(2, 6, {.group_size = 3})}) {
    const pl::timeline t = pl::simulate(s, c);
    // When each (kind, microbatch, virtual stage) ends.
    std::map<std::tuple<action_kind, int, int>, double> end;
    for (int r = 0; r < s.stages; ++r) {
      const auto& list = s.ranks[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < list.size(); ++i)
        if (pl::is_compute(list[i].kind))
          end[{list[i].kind, list[i].microbatch, s.virtual_stage(r, list[i].chunk)}] =
              t.end[static_cast<std::size_t>(r)][i];
    }
    const int last = s.virtual_stages() - 1;
    double step = 0;
    for (int r = 0; r < s.stages; ++r) {
      const auto& list = s.ranks[static_cast<std::size_t>(r)];
      double free = 0;
      for (std::size_t i = 0; i < list.size(); ++i) {
        const action& a = list[i];
        if (!pl::is_compute(a.kind)) continue;
        const int v = s.virtual_stage(r, a.chunk);
        const auto arrival = [&](action_kind k, int from) {
          return end.at({k, a.microbatch, from}) + (s.rank_of(from) == r ? 0.0 : c.p2p_latency);
        };
        double ready = free;
        if (a.kind == action_kind::forward && v > 0)
          ready = std::max(ready, arrival(action_kind::forward, v - 1));
        if (a.kind == action_kind::backward && v < last)
          ready = std::max(ready, arrival(action_kind::backward, v + 1));
        const double cost = a.kind == action_kind::forward  ? c.forward
                            : a.kind == action_kind::weight ? c.weight
                            : s.split_backward              ? c.backward
                                                            : c.backward + c.weight;
        const auto ur = static_cast<std::size_t>(r);
        ASSERT_NEAR(t.start[ur][i], ready, tol) << s.name << " rank " << r << " " << pl::token(a);
        ASSERT_NEAR(t.end[ur][i], ready + cost / s.chunks, tol)
            << s.name << " rank " << r << " " << pl::token(a);
        free = t.end[ur][i];
      }
      step = std::max(step, free);
    }
    EXPECT_NEAR(t.step_time, step, tol) << s.name;
  }
}

TEST(pipeline_stats, zero_costs_give_no_bubble) {
  const pl::statistics st =
      pl::analyze(pl::one_f_one_b::make(4, 8), {.forward = 0, .backward = 0, .weight = 0});
  EXPECT_EQ(st.step_time, 0);
  EXPECT_EQ(st.bubble_over_ideal, 0);
  EXPECT_EQ(st.idle_fraction, 0);
}

TEST(pipeline_stats, bad_costs_and_bad_schedules_are_refused) {
  const pl::schedule s = pl::one_f_one_b::make(2, 2);
  try {
    (void)pl::simulate(s, {.forward = -1});
    ADD_FAILURE() << "a negative cost was accepted";
  } catch (const weft::error& e) {
    EXPECT_NE(
        std::string(e.what()).find("the forward cost must be finite and non-negative, not -1"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)pl::simulate(s, {.p2p_latency = std::numeric_limits<double>::quiet_NaN()}),
               weft::error);
  pl::schedule broken = s;
  broken.ranks[1].pop_back();
  EXPECT_THROW((void)pl::analyze(broken), weft::error);
}

} // namespace
