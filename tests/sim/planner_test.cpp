// The planner: the published MT-NLG mesh among the top 5, the pruning of memory savers checked
// against brute force on a small cluster, and memory limits honoured.
#include <weft/sim/planner.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <map>
#include <tuple>

#include "sim/gpt.hpp"

namespace {

using namespace weft::sim;
namespace pl = weft::pipeline;

using weft_test::gpt;

TEST(sim_planner, mt_nlg_published_mesh_is_in_the_top_5) {
  const model_spec m = gpt("mt-nlg-530b", 105, 20480, 128, 50272);
  const machine mc = dgx(a100_80gb, 280);
  search_options o;
  o.global_batch = 1920;
  const std::clock_t start = std::clock(); // CPU time: the machine may be shared
  const search_result s = search(m, mc, o);
  const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  std::size_t rank = 0;
  for (std::size_t i = 0; i < s.ranked.size(); ++i)
    if (s.ranked[i].l.tp == 8 && s.ranked[i].l.pp == 35 && s.ranked[i].l.dp == 8) rank = i + 1;
  std::printf("  MT-NLG 530B on 280 DGX A100: tp 8 pp 35 dp 8 ranks #%zu of %zu (search %.2f s)\n",
              rank, s.ranked.size(), seconds);
  ASSERT_GE(rank, 1u);
  EXPECT_LE(rank, 5u);
  // Top 5 of few meshes says little by itself: the published mesh must also be as fast as the best
  // within the simulator's error on published runs (10%), and faster than every mesh whose TP
  // group spans nodes (TP 16 on nodes of 8).
  EXPECT_GE(s.ranked.size(), 6u);
  EXPECT_LT(s.ranked[rank - 1].r.step_time_s, 1.10 * s.ranked.front().r.step_time_s);
  std::size_t across = 0;
  for (std::size_t i = 0; i < s.ranked.size(); ++i) {
    if (s.ranked[i].l.tp <= 8) continue;
    ++across;
    EXPECT_GT(i + 1, rank) << describe(s.ranked[i].l);
  }
  EXPECT_GE(across, 1u);
  // Every ranked layout fits, and the best keeps TP inside a node.
  for (const auto& x : s.ranked)
    EXPECT_LE(x.r.memory_bytes(), a100_80gb.hbm_bytes) << describe(x.l);
  EXPECT_LE(s.ranked.front().l.tp, 8);
  const std::string why = explain(s, mc);
  EXPECT_NE(why.find("Why TP stays inside a node"), std::string::npos) << why;
  EXPECT_NE(why.find("What the bubble costs"), std::string::npos) << why;
}

TEST(sim_planner, search_of_a_1t_model_on_3072_gpus_takes_under_a_minute) {
#ifdef WEFT_TEST_SANITIZED
  GTEST_SKIP() << "timing is meaningless under a sanitizer (10-40x slower)";
#else
  const model_spec m = gpt("gpt-1t", 128, 25600, 160, 51200);
  search_options o;
  o.global_batch = 3072;
  const std::clock_t start = std::clock(); // CPU time: the machine may be shared
  const search_result s = search(m, dgx(a100_80gb, 384), o);
  const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  std::printf("  1T on 3072 A100: %d meshes, %d layouts simulated in %.2f s; best %s\n", s.meshes,
              s.simulated, seconds, describe(s.ranked.front().l).c_str());
  EXPECT_LT(seconds, 60.0);
  EXPECT_GT(s.simulated, 100);
#endif
}

// Each mesh's fastest variant, by brute force over every variant the search could take, against
// the search's own pick.
void expect_each_mesh_best_as_brute_force_finds(const model_spec& m, const machine& mc,
                                                const search_options& o) {
  const search_result s = search(m, mc, o);
  const double limit = o.memory_limit > 0 ? o.memory_limit : mc.device.hbm_bytes;
  std::map<std::tuple<int, int, int>, std::pair<double, std::string>> best;
  for (const auto& x : s.ranked) {
    const layout& base = x.l;
    for (int mb : o.micro_batches) {
      for (pl::schedule_kind kind : o.schedules) {
        for (recompute rc : {recompute::none, recompute::selective, recompute::full}) {
          for (int zero = 0; zero <= 3; ++zero) {
            layout l = base;
            l.micro_batch = mb;
            l.schedule = kind;
            l.chunks = kind == pl::schedule_kind::interleaved ? 2 : 1;
            l.recomputation = rc;
            l.zero = zero;
            if (o.global_batch % (l.dp * mb) != 0 || (l.dp == 1 && zero > 0)) continue;
            step_result r;
            try {
              r = simulate_step(m, mc, l);
            } catch (const weft::error&) {
              continue; // a schedule that cannot take this many micro-batches
            }
            if (r.memory_bytes() > limit) continue;
            auto& b =
                best.try_emplace({l.tp, l.pp, l.dp}, r.step_time_s, describe(l)).first->second;
            if (r.step_time_s < b.first) b = {r.step_time_s, describe(l)};
          }
        }
      }
    }
  }
  for (const auto& x : s.ranked) {
    const auto it = best.find({x.l.tp, x.l.pp, x.l.dp});
    ASSERT_NE(it, best.end()) << describe(x.l);
    EXPECT_NEAR(x.r.step_time_s, it->second.first, it->second.first * 1e-9)
        << "the search took " << describe(x.l) << "; the fastest that fits is "
        << it->second.second;
  }
}

TEST(sim_planner, pruning_recompute_and_zero_matches_brute_force) {
  search_options o;
  o.global_batch = 64;
  o.memory_limit = 24e9; // tight, so that memory savers matter
  expect_each_mesh_best_as_brute_force_finds(gpt("gpt-2.7b", 32, 2560, 32, 51200),
                                             dgx(a100_80gb, 2), o);
}

// MT-NLG on 280 nodes: at TP 8 x PP 7 with micro-batches of 1 (ZB-H1), no recomputation fits
// only under ZeRO-2 or 3 (54 s and 122 s a step: they communicate every micro-batch), where
// selective recomputation under ZeRO-1 takes 35.6 s. A search that stopped at the least
// recomputation that fits would miss that variant and rank the mesh on micro-batches of 2.
TEST(sim_planner, less_recomputation_is_not_always_faster) {
  search_options o;
  o.global_batch = 1920;
  expect_each_mesh_best_as_brute_force_finds(gpt("mt-nlg-530b", 105, 20480, 128, 50272),
                                             dgx(a100_80gb, 280), o);
}

TEST(sim_planner, memory_estimate_is_the_simulated_memory) {
  const model_spec m = gpt("gpt-6.7b", 32, 4096, 32, 51200);
  const machine mc = dgx(a100_80gb, 1);
  for (pl::schedule_kind kind : {pl::schedule_kind::one_f_one_b, pl::schedule_kind::interleaved,
                                 pl::schedule_kind::zero_bubble_h1, pl::schedule_kind::gpipe}) {
    layout l;
    l.tp = 2;
    l.pp = 4;
    l.global_batch = 16;
    l.schedule = kind;
    l.chunks = kind == pl::schedule_kind::interleaved ? 2 : 1;
    const step_result r = simulate_step(m, mc, l);
    EXPECT_NEAR(estimate_memory(m, l), r.memory_bytes(), r.memory_bytes() * 1e-12)
        << pl::name_of(kind);
  }
}

TEST(sim_planner, grouped_query_attention_keeps_tp_within_the_key_value_heads) {
  // 64 query heads in 4 key-value groups on 2 DGX H100: TP 8 and 16 divide the heads but not
  // the groups, so only TP 1, 2 and 4 are meshes (Megatron-core splits the groups over TP).
  model_spec m = gpt("gqa-13b", 40, 5120, 64, 32000);
  m.kv_heads = 4;
  search_options o;
  o.global_batch = 64;
  const search_result s = search(m, dgx(h100_sxm, 2), o);
  ASSERT_FALSE(s.ranked.empty());
  std::map<int, int> by_tp;
  for (const ranked_layout& x : s.ranked)
    ++by_tp[x.l.tp];
  for (const auto& [tp, n] : by_tp) {
    std::printf("  tp %d: %d meshes\n", tp, n);
    EXPECT_EQ(4 % tp, 0) << "tp " << tp;
  }
  EXPECT_EQ(by_tp.count(4), 1u);
}

// DeepSpeed's pipeline engine runs 1F1B only, under ZeRO 0 or 1: a search for it offers nothing
// else where PP > 1, prices those layouts with its sends and its reduction after the flush, and
// leaves PP 1 (no pipeline engine) as it is. Its best is no faster than Megatron-LM's best.
TEST(sim_planner, a_deepspeed_search_keeps_to_what_its_pipeline_engine_runs) {
  const model_spec m = gpt("gpt-175b", 96, 12288, 96, 51200);
  const machine mc = dgx(a100_80gb, 16);
  search_options o;
  o.global_batch = 256;
  const search_result megatron = search(m, mc, o);
  o.engine = pipeline_engine::deepspeed;
  const search_result deepspeed = search(m, mc, o);
  ASSERT_FALSE(deepspeed.ranked.empty());
  int pipelined = 0;
  for (const auto& x : deepspeed.ranked) {
    if (x.l.pp == 1) {
      EXPECT_EQ(engine_of(x.l), pipeline_engine::megatron) << describe(x.l);
      continue;
    }
    ++pipelined;
    EXPECT_EQ(x.l.schedule, pl::schedule_kind::one_f_one_b) << describe(x.l);
    EXPECT_LE(x.l.zero, 1) << describe(x.l);
    EXPECT_TRUE(x.l.p2p_blocking && !x.l.p2p_scatter_gather && !x.l.overlap_dp) << describe(x.l);
    EXPECT_NE(describe(x.l).find("DeepSpeed's pipeline engine"), std::string::npos)
        << describe(x.l);
  }
  EXPECT_GE(pipelined, 3);
  bool megatron_has_others = false; // the restriction removed something
  for (const auto& x : megatron.ranked)
    megatron_has_others =
        megatron_has_others ||
        (x.l.pp > 1 && (x.l.schedule != pl::schedule_kind::one_f_one_b || x.l.zero > 1));
  EXPECT_TRUE(megatron_has_others);
  EXPECT_GE(deepspeed.ranked.front().r.step_time_s, megatron.ranked.front().r.step_time_s);
  std::printf(
      "  GPT-3 175B on 16 DGX A100, batch 256: best %s at %.2f s; for DeepSpeed %s at %.2f s\n",
      describe(megatron.ranked.front().l).c_str(), megatron.ranked.front().r.step_time_s,
      describe(deepspeed.ranked.front().l).c_str(), deepspeed.ranked.front().r.step_time_s);
}

TEST(sim_planner, nothing_fits_throws) {
  const model_spec m = gpt("gpt-175b", 96, 12288, 96, 51200);
  search_options o;
  o.global_batch = 8;
  EXPECT_THROW((void)search(m, dgx(a100_80gb, 1), o), weft::error);
  o.global_batch = 0;
  EXPECT_THROW((void)search(m, dgx(a100_80gb, 1), o), weft::error);
}

} // namespace
