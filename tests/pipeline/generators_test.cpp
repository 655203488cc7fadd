#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/validate.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace pl = weft::pipeline;

// --- the index math, at compile time --------------------------------------------------------

static_assert(pl::one_f_one_b_warmup(4, 0, 8) == 3);
static_assert(pl::one_f_one_b_warmup(4, 3, 8) == 0);
static_assert(pl::one_f_one_b_warmup(8, 0, 4) == 4); // capped at m
static_assert(pl::interleaved_warmup(4, 0, 2, 4, 8) == 3 * 2 + 1 * 4);
static_assert(pl::interleaved_warmup(4, 3, 3, 4, 8) == 0 + 2 * 4);
static_assert(pl::interleaved_warmup(8, 0, 3, 8, 8) == 24); // 14 + 16, capped at m * V
// Megatron-core's own example (get_schedule_table's comment): PP2, M = 5, N = 3, VP2.
//   virtual_microbatch_id | 0 1 2 3 4 5 6 7 8 9
//   microbatch_id         | 0 1 2 0 1 2 3 4 3 4
//   model_chunk_id        | 0 0 0 1 1 1 0 0 1 1
constexpr bool megatron_example_table() {
  constexpr int mb[] = {0, 1, 2, 0, 1, 2, 3, 4, 3, 4};
  constexpr int chunk[] = {0, 0, 0, 1, 1, 1, 0, 0, 1, 1};
  for (int k = 0; k < 10; ++k) {
    const auto f = pl::interleaved_forward(k, 5, 2, 3);
    const auto b = pl::interleaved_backward(k, 5, 2, 3);
    if (f.first != mb[k] || f.second != chunk[k] || b.first != mb[k] || b.second != 1 - chunk[k])
      return false;
  }
  return true;
}
static_assert(megatron_example_table());

// --- independent references ------------------------------------------------------------------

std::string tok(char kind, int mb, int chunk) {
  return std::string(1, kind) + std::to_string(mb) + "." + std::to_string(chunk);
}

std::vector<std::string> compute_tokens(const pl::schedule& s, int r) {
  std::vector<std::string> out;
  for (const pl::action& a : s.compute(r))
    out.push_back(pl::token(a));
  return out;
}

// Megatron-core's forward_backward_pipelining_without_interleaving (and, for one stage,
// forward_backward_no_pipelining), its loops transcribed.
std::vector<std::string> megatron_1f1b(int p, int rank, int m) {
  std::vector<std::string> out;
  if (p == 1) {
    for (int i = 0; i < m; ++i) {
      out.push_back(tok('F', i, 0));
      out.push_back(tok('B', i, 0));
    }
    return out;
  }
  int warmup = p - rank - 1;
  warmup = std::min(warmup, m);
  const int remaining = m - warmup;
  int next_f = 0;
  int next_b = 0;
  for (int i = 0; i < warmup; ++i)
    out.push_back(tok('F', next_f++, 0));
  for (int i = 0; i < remaining; ++i) {
    out.push_back(tok('F', next_f++, 0));
    out.push_back(tok('B', next_b++, 0)); // input_tensors.pop(0): the oldest forward
  }
  for (int i = 0; i < warmup; ++i)
    out.push_back(tok('B', next_b++, 0));
  return out;
}

// Megatron-core's forward_backward_pipelining_with_interleaving: get_schedule_table,
// get_model_chunk_id and the warmup / steady / cooldown loops. A backward's microbatch is
// whatever its chunk's queue of forwarded inputs holds first (input_tensors[chunk].pop(0)).
std::vector<std::string> megatron_interleaved(int p, int rank, int m, int chunks, int group) {
  std::vector<std::pair<int, int>> table; // (microbatch, chunk)
  for (int first = 0; first < m; first += group) {
    const int end = first + group >= m ? m : first + group;
    for (int c = 0; c < chunks; ++c)
      for (int mb = first; mb < end; ++mb)
        table.emplace_back(mb, c);
  }
  const int total = m * chunks;
  int warmup = (p - rank - 1) * 2 + (chunks - 1) * group;
  if (warmup >= total) warmup = total;
  const int remaining = total - warmup;
  std::vector<std::deque<int>> queued(static_cast<std::size_t>(chunks));
  std::vector<std::string> out;
  const auto forward = [&](int k) {
    const auto [mb, c] = table[static_cast<std::size_t>(k)];
    queued[static_cast<std::size_t>(c)].push_back(mb);
    out.push_back(tok('F', mb, c));
  };
  const auto backward = [&](int k) {
    const int c = chunks - table[static_cast<std::size_t>(k % total)].second - 1;
    auto& q = queued[static_cast<std::size_t>(c)];
    out.push_back(tok('B', q.front(), c));
    q.pop_front();
  };
  for (int k = 0; k < warmup; ++k)
    forward(k);
  for (int k = 0; k < remaining; ++k) {
    forward(k + warmup);
    backward(k);
  }
  for (int k = remaining; k < total; ++k)
    backward(k);
  return out;
}

// Megatron-core's preconditions on the interleaved schedule (and one pipeline stage, which
// it runs without pipelining, has no chunks).
bool megatron_accepts_interleaved(int p, int m, int chunks, int group) {
  if (chunks > 1 && p == 1) return false;
  if (group > m || group < p) return false;
  const int last = m % group;
  return !(last > 0 && last < p);
}

// ZB-H1 as the paper draws it and PaddlePaddle's ZBH1 pass builds it: p - s forwards; s times
// an input gradient and a forward; then full backwards (B and W) with forwards; the remaining
// full backwards; finally the s held-back weight gradients.
std::vector<std::string> zb_h1_reference(int p, int s, int m) {
  std::vector<std::string> out;
  int f = 0;
  int b = 0;
  for (int i = 0; i < p - s; ++i)
    out.push_back(tok('F', f++, 0));
  for (int i = 0; i < s; ++i) {
    out.push_back(tok('B', b++, 0));
    out.push_back(tok('F', f++, 0));
  }
  for (int i = 0; i < m - p; ++i) {
    out.push_back(tok('B', b, 0));
    out.push_back(tok('W', b++, 0));
    out.push_back(tok('F', f++, 0));
  }
  for (int i = 0; i < p - s; ++i) {
    out.push_back(tok('B', b, 0));
    out.push_back(tok('W', b++, 0));
  }
  for (int i = 0; i < s; ++i)
    out.push_back(tok('W', i, 0));
  return out;
}

std::vector<std::string> gpipe_reference(int m) {
  std::vector<std::string> out;
  for (int i = 0; i < m; ++i)
    out.push_back(tok('F', i, 0));
  for (int i = 0; i < m; ++i)
    out.push_back(tok('B', i, 0));
  return out;
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> out;
  std::size_t from = 0;
  while (from < line.size()) {
    const std::size_t space = std::min(line.find(' ', from), line.size());
    out.push_back(line.substr(from, space - from));
    from = space + 1;
  }
  return out;
}

// --- literal orders -------------------------------------------------------------------------

TEST(pipeline_generators, one_f_one_b_p4_m8) {
  const pl::schedule s = pl::one_f_one_b::make(4, 8);
  EXPECT_EQ(
      compute_tokens(s, 0),
      split("F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 F6.0 B3.0 F7.0 B4.0 B5.0 B6.0 B7.0"));
  EXPECT_EQ(
      compute_tokens(s, 2),
      split("F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 F4.0 B3.0 F5.0 B4.0 F6.0 B5.0 F7.0 B6.0 B7.0"));
  EXPECT_EQ(
      compute_tokens(s, 3),
      split("F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0 F6.0 B6.0 F7.0 B7.0"));
  EXPECT_FALSE(s.split_backward);
  EXPECT_EQ(s.name, "1f1b");
}

TEST(pipeline_generators, interleaved_p2_m4_v2) {
  // Rank 0: warmup (2-0-1)*2 + (2-1)*2 = 4; rank 1: 0 + 2 = 2.
  const pl::schedule s = pl::interleaved<2>::make(2, 4);
  EXPECT_EQ(
      compute_tokens(s, 0),
      split("F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0"));
  EXPECT_EQ(
      compute_tokens(s, 1),
      split("F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0"));
  EXPECT_EQ(s.chunks, 2);
  EXPECT_EQ(s.name, "interleaved<2>");
}

TEST(pipeline_generators, zero_bubble_h1_p3_m4) {
  const pl::schedule s = pl::zero_bubble_h1::make(3, 4);
  EXPECT_EQ(compute_tokens(s, 0),
            split("F0.0 F1.0 F2.0 B0.0 W0.0 F3.0 B1.0 W1.0 B2.0 W2.0 B3.0 W3.0"));
  EXPECT_EQ(compute_tokens(s, 1),
            split("F0.0 F1.0 B0.0 F2.0 B1.0 W1.0 F3.0 B2.0 W2.0 B3.0 W3.0 W0.0"));
  EXPECT_EQ(compute_tokens(s, 2),
            split("F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 W2.0 F3.0 B3.0 W3.0 W0.0 W1.0"));
  EXPECT_TRUE(s.split_backward);
}

TEST(pipeline_generators, gpipe_runs_all_forwards_first) {
  const pl::schedule s = pl::gpipe::make(3, 3);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(compute_tokens(s, r), split("F0.0 F1.0 F2.0 B0.0 B1.0 B2.0"));
}

// --- every size -----------------------------------------------------------------------------

// p in 1..8, m in p..4p, V in 1..3: every schedule a generator accepts validates and has the
// reference's order; interleaved refuses exactly what Megatron-core refuses.
TEST(pipeline_generators, every_size_validates_and_matches_the_references) {
  int interleaved_checked = 0;
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 4 * p; ++m) {
      const pl::schedule gp = pl::gpipe::make(p, m);
      const pl::schedule ofob = pl::one_f_one_b::make(p, m);
      const pl::schedule zb = pl::zero_bubble_h1::make(p, m);
      for (const pl::schedule* s : {&gp, &ofob, &zb}) {
        ASSERT_NO_THROW(pl::validate(*s)) << s->name << " p=" << p << " m=" << m;
      }
      for (int r = 0; r < p; ++r) {
        ASSERT_EQ(compute_tokens(gp, r), gpipe_reference(m))
            << "p=" << p << " m=" << m << " rank " << r;
        ASSERT_EQ(compute_tokens(ofob, r), megatron_1f1b(p, r, m))
            << "p=" << p << " m=" << m << " rank " << r;
        ASSERT_EQ(compute_tokens(zb, r), zb_h1_reference(p, r, m))
            << "p=" << p << " m=" << m << " rank " << r;
      }
      for (int v = 1; v <= 3; ++v) {
        for (const int group : {0, p + 1}) {
          const int g = group == 0 ? p : group;
          if (!megatron_accepts_interleaved(p, m, v, g)) {
            EXPECT_THROW(
                pl::generate(pl::schedule_kind::interleaved, p, m, v, {.group_size = group}),
                weft::error)
                << "p=" << p << " m=" << m << " V=" << v << " G=" << g;
            continue;
          }
          const pl::schedule s =
              pl::generate(pl::schedule_kind::interleaved, p, m, v, {.group_size = group});
          ASSERT_NO_THROW(pl::validate(s)) << "p=" << p << " m=" << m << " V=" << v << " G=" << g;
          for (int r = 0; r < p; ++r) {
            ASSERT_EQ(compute_tokens(s, r), megatron_interleaved(p, r, m, v, g))
                << "p=" << p << " m=" << m << " V=" << v << " G=" << g << " rank " << r;
          }
          ++interleaved_checked;
        }
      }
    }
  }
  EXPECT_GT(interleaved_checked, 100); // the sweep is not vacuous
}

TEST(pipeline_generators, policy_types_and_run_time_choice_agree) {
  EXPECT_EQ(pl::interleaved<3>::make(4, 8).ranks,
            pl::generate(pl::schedule_kind::interleaved, 4, 8, 3).ranks);
  EXPECT_EQ(pl::zero_bubble_h1::make(4, 8).ranks,
            pl::generate(pl::schedule_kind::zero_bubble_h1, 4, 8).ranks);
  EXPECT_EQ(pl::one_f_one_b::make(4, 8).ranks,
            pl::generate(pl::schedule_kind::one_f_one_b, 4, 8).ranks);
  EXPECT_EQ(pl::gpipe::make(4, 8).ranks, pl::generate(pl::schedule_kind::gpipe, 4, 8).ranks);
  static_assert(pl::interleaved<2>::chunks == 2);
  static_assert(pl::zero_bubble_h1::split_backward && !pl::one_f_one_b::split_backward);
}

TEST(pipeline_generators, message_sizes_are_the_options) {
  const pl::schedule s =
      pl::one_f_one_b::make(3, 4, {.activation_bytes = 1000, .gradient_bytes = 10});
  for (const auto& list : s.ranks) {
    for (const pl::action& a : list) {
      if (a.kind == pl::action_kind::send_activation ||
          a.kind == pl::action_kind::recv_activation) {
        EXPECT_EQ(a.bytes, 1000U);
      } else if (a.kind == pl::action_kind::send_gradient ||
                 a.kind == pl::action_kind::recv_gradient) {
        EXPECT_EQ(a.bytes, 10U);
      }
    }
  }
}

// --- refusals -------------------------------------------------------------------------------

// Whether f throws a weft::error whose message holds `text`.
template <class F>
::testing::AssertionResult throws_with(F f, std::string_view text) {
  try {
    (void)f();
  } catch (const weft::error& e) {
    if (std::string_view(e.what()).find(text) != std::string_view::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "the error \"" << e.what() << "\" lacks \"" << text << "\"";
  }
  return ::testing::AssertionFailure() << "no weft::error";
}

TEST(pipeline_generators, zero_sizes_are_refused) {
  EXPECT_TRUE(throws_with([] { return pl::gpipe::make(0, 4); },
                          "pipeline::gpipe: stages must be at least 1, not 0"));
  EXPECT_TRUE(throws_with([] { return pl::one_f_one_b::make(4, 0); },
                          "pipeline::1f1b: microbatches must be at least 1, not 0"));
  EXPECT_TRUE(throws_with([] { return pl::zero_bubble_h1::make(-1, 4); },
                          "pipeline::zb-h1: stages must be at least 1, not -1"));
  EXPECT_TRUE(throws_with([] { return pl::interleaved<2>::make(4, 0); },
                          "pipeline::interleaved<2>: microbatches must be at least 1, not 0"));
  EXPECT_TRUE(throws_with([] { return pl::generate(pl::schedule_kind::interleaved, 4, 8, 0); },
                          "chunks must be at least 1, not 0"));
}

TEST(pipeline_generators, interleaved_refuses_what_megatron_refuses) {
  EXPECT_TRUE(throws_with([] { return pl::interleaved<2>::make(4, 10); },
                          "10 microbatches are not a multiple of the group size 4"));
  EXPECT_TRUE(throws_with([] { return pl::interleaved<2>::make(1, 4); },
                          "model chunks need at least 2 stages"));
  EXPECT_TRUE(throws_with([] { return pl::interleaved<2>::make(4, 8, {.group_size = 3}); },
                          "group size 3 must lie in [stages, microbatches] = [4, 8]"));
  EXPECT_TRUE(throws_with([] { return pl::interleaved<2>::make(4, 8, {.group_size = 9}); },
                          "group size 9 must lie in"));
  EXPECT_TRUE(throws_with([] { return pl::interleaved<2>::make(4, 3); },
                          "group size 4 must lie in [stages, microbatches] = [4, 3]"));
  EXPECT_TRUE(throws_with([] { return pl::interleaved<2>::make(4, 8, {.group_size = -1}); },
                          "group size must be positive"));
  // A last group of at least p microbatches is fine (Megatron-core's own example: p = 2, m = 5, G =
  // 3).
  EXPECT_NO_THROW(pl::validate(pl::interleaved<2>::make(2, 5, {.group_size = 3})));
  EXPECT_NO_THROW(pl::validate(pl::interleaved<1>::make(1, 3)));
}

TEST(pipeline_generators, zero_bubble_needs_a_microbatch_per_stage) {
  EXPECT_TRUE(throws_with([] { return pl::zero_bubble_h1::make(4, 3); },
                          "needs at least as many microbatches as stages, not 3 for 4 stages"));
}

TEST(pipeline_generators, only_interleaved_takes_chunks) {
  EXPECT_TRUE(throws_with([] { return pl::generate(pl::schedule_kind::one_f_one_b, 4, 8, 2); },
                          "pipeline::1f1b: runs one model chunk per rank, not 2"));
  EXPECT_EQ(pl::name_of(pl::schedule_kind::zero_bubble_h1), "zb-h1");
}

} // namespace
