// The planner: the published MT-NLG mesh among the top 5, the pruning of memory savers checked
// against brute force on a small cluster, and memory limits honoured; published layouts of three
// runs against the search's best; which layouts weft::strategy runs; the time and memory splits
// of the explanation.
#include <weft/sim/planner.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sim/nemotron_recipe.hpp"
#include "sim/published_runs.hpp"

namespace {

using namespace weft::sim;
namespace pl = weft::pipeline;

TEST(sim_planner, mt_nlg_published_mesh_is_in_the_top_5) {
  const model_spec m = gpt_shaped("mt-nlg-530b", 105, 20480, 128, 50272);
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

TEST(sim_planner, search_of_a_1t_model_on_3072_gpus_takes_under_30_seconds) {
#ifdef WEFT_TEST_SANITIZED
  GTEST_SKIP() << "timing is meaningless under a sanitizer (10-40x slower)";
#else
  const model_spec m = gpt_shaped("gpt-1t", 128, 25600, 160, 51200);
  search_options o;
  o.global_batch = 3072;
  const std::clock_t start = std::clock(); // CPU time: the machine may be shared
  const search_result s = search(m, dgx(a100_80gb, 384), o);
  const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  std::printf("  1T on 3072 A100: %d meshes, %d layouts simulated in %.2f s; best %s\n", s.meshes,
              s.simulated, seconds, describe(s.ranked.front().l).c_str());
  EXPECT_LT(seconds, 30.0);
  EXPECT_GT(s.simulated, 100);
#endif
}

// Each mesh's fastest variant, by brute force over every variant the search could take, against
// the search's own pick. ZeRO-3 also runs as HSDP over the DP ranks of a node: with TP fastest in
// the rank order, a node of G devices holds G / tp of them.
void expect_each_mesh_best_as_brute_force_finds(const model_spec& m, const machine& mc,
                                                const search_options& o) {
  const search_result s = search(m, mc, o);
  const double limit = o.memory_limit > 0 ? o.memory_limit : mc.device.hbm_bytes;
  std::map<std::tuple<int, int, int>, std::pair<double, std::string>> best;
  for (const auto& x : s.ranked) {
    const layout& base = x.l;
    const int per_node = mc.cluster.devices_on(0);
    const int node_dp = per_node % base.tp == 0 ? per_node / base.tp : 0;
    std::vector<std::pair<int, int>> shardings{{0, 0}, {1, 0}, {2, 0}, {3, 0}}; // stage, group
    if (o.hybrid_sharding && node_dp > 1 && node_dp < base.dp && base.dp % node_dp == 0)
      shardings.emplace_back(3, node_dp);
    // ZeRO-3's modes: under the default search every reshard_after_forward with every
    // micro-batch sync, so that the one the search leaves out (keeping the forward's weights
    // under no_sync: once a step's memory, more collectives) is shown never to win.
    std::vector<std::pair<bool, shard_sync>> modes;
    const auto same_modes = [](const std::vector<zero3_mode>& a, const std::vector<zero3_mode>& b) {
      return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
        return x.reshard_after_forward == y.reshard_after_forward && x.sync == y.sync;
      });
    };
    if (same_modes(o.zero3_modes, search_options{}.zero3_modes)) {
      for (bool reshard : {true, false})
        for (shard_sync sync : {shard_sync::every, shard_sync::last, shard_sync::once})
          modes.emplace_back(reshard, sync);
    } else {
      for (const zero3_mode& x : o.zero3_modes)
        modes.emplace_back(x.reshard_after_forward, x.sync);
    }
    for (int mb : o.micro_batches) {
      for (pl::schedule_kind kind : o.schedules) {
        for (int v : {1, 2, 3, 4}) {
          if ((kind == pl::schedule_kind::interleaved) != (v > 1)) continue;
          for (recompute rc : {recompute::none, recompute::selective, recompute::full}) {
            for (const auto& [zero, group] : shardings) {
              for (const auto& [reshard, sync] : modes) {
                for (bool overlap : {false, true}) {
                  if (overlap && (zero != 1 || !o.overlap_param_gather ||
                                  o.engine != weft::sim::pipeline_engine::megatron))
                    continue;
                  layout l = base;
                  l.overlap_param_gather = overlap;
                  l.micro_batch = mb;
                  l.schedule = kind;
                  l.chunks = v;
                  l.recomputation = rc;
                  l.zero = zero;
                  l.shard_group = group;
                  l.reshard_after_forward = zero < 3 || reshard;
                  l.sync = zero < 3 ? shard_sync::every : sync;
                  if (o.global_batch % (l.dp * mb) != 0 || (l.dp == 1 && zero > 0)) continue;
                  if (m.layers % (l.pp * v) != 0) continue; // the search splits the layers evenly
                  step_result r;
                  try {
                    r = simulate_step(m, mc, l);
                  } catch (const weft::error&) {
                    continue; // a schedule that cannot take this many micro-batches
                  }
                  if (r.memory_bytes() > limit) continue;
                  auto& b = best.try_emplace({l.tp, l.pp, l.dp}, r.step_time_s, describe(l))
                                .first->second;
                  if (r.step_time_s < b.first) b = {r.step_time_s, describe(l)};
                }
              }
            }
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

// The search simulates a ZeRO-3 mode once per cadence: with one micro-batch a step no_sync
// reduces as every micro-batch does, and gathering once a step is keeping the forward's weights.
TEST(sim_planner, zero3_modes_of_one_cadence_are_simulated_once) {
  using weft::sim::detail::same_cadence_before;
  layout l{.dp = 8, .micro_batch = 1, .global_batch = 8, .zero = 3};
  ASSERT_EQ(l.microbatches(), 1);
  const std::vector<zero3_mode> full{{true, shard_sync::every}};
  const std::vector<zero3_mode> both{{true, shard_sync::every}, {false, shard_sync::every}};
  l.sync = shard_sync::last;
  EXPECT_TRUE(same_cadence_before(l, full));
  l.sync = shard_sync::once;
  EXPECT_FALSE(same_cadence_before(l, full));
  EXPECT_TRUE(same_cadence_before(l, both));
  l.global_batch = 32; // four micro-batches: every mode its own
  for (shard_sync sync : {shard_sync::last, shard_sync::once}) {
    l.sync = sync;
    EXPECT_FALSE(same_cadence_before(l, both)) << name_of(sync);
  }
  // FSDP1 keeps SHARD_GRAD_OP's weights under no_sync until a backward reduces: once a step.
  use_shard_engine(l, shard_engine::fsdp);
  l.reshard_after_forward = false;
  l.sync = shard_sync::last;
  EXPECT_TRUE(same_cadence_before(l, std::vector<zero3_mode>{{true, shard_sync::once}}));
  use_shard_engine(l, shard_engine::fsdp2);
  l.reshard_after_forward = false;
  l.sync = shard_sync::last;
  EXPECT_FALSE(same_cadence_before(l, std::vector<zero3_mode>{{true, shard_sync::once}}));
}

TEST(sim_planner, pruning_recompute_and_zero_matches_brute_force) {
  search_options o;
  o.global_batch = 64;
  o.memory_limit = 24e9; // tight, so that memory savers matter
  expect_each_mesh_best_as_brute_force_finds(gpt_shaped("gpt-2.7b", 32, 2560, 32, 51200),
                                             dgx(a100_80gb, 2), o);
}

// MT-NLG on 280 nodes: at TP 8 x PP 7 with micro-batches of 1 (ZB-H1), no recomputation fits
// only under ZeRO-2 or 3 (54 s and 122 s a step: they communicate every micro-batch), where
// selective recomputation under ZeRO-1 takes 35.6 s. A search that stopped at the least
// recomputation that fits would miss that variant and rank the mesh on micro-batches of 2.
TEST(sim_planner, less_recomputation_is_not_always_faster) {
  search_options o;
  o.global_batch = 1920;
  expect_each_mesh_best_as_brute_force_finds(gpt_shaped("mt-nlg-530b", 105, 20480, 128, 50272),
                                             dgx(a100_80gb, 280), o);
}

TEST(sim_planner, memory_estimate_is_the_simulated_memory) {
  const model_spec m = gpt_shaped("gpt-6.7b", 32, 4096, 32, 51200);
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
  model_spec m = gpt_shaped("gqa-13b", 40, 5120, 64, 32000);
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
  const model_spec m = gpt_shaped("gpt-175b", 96, 12288, 96, 51200);
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
  const model_spec m = gpt_shaped("gpt-175b", 96, 12288, 96, 51200);
  search_options o;
  o.global_batch = 8;
  EXPECT_THROW((void)search(m, dgx(a100_80gb, 1), o), weft::error);
  o.global_batch = 0;
  EXPECT_THROW((void)search(m, dgx(a100_80gb, 1), o), weft::error);
}

// What weft::strategy refuses, as weft/strategy.hpp and its layers say (the compile-time
// refusals are tests/strategy/compile_fail's): each case's layout and a phrase of the reason, or
// "" where it runs.
TEST(sim_planner, strategy_refusal_follows_what_weft_strategy_accepts) {
  const model_spec g = gpt_shaped("gpt-6.7b", 32, 4096, 32, 51200);
  const model_spec llama_7b = llama_shaped("llama-6.7b", 32, 4096, 32, 8, 0, 51200, 2048);
  model_spec nemotron = llama_7b; // rotary and GQA, but an ungated MLP
  nemotron.gated = false;
  model_spec bloom = g; // ALiBi: no learned positions, an ungated MLP
  bloom.learned_positions = false;
  model_spec gqa_gpt = g;
  gqa_gpt.kv_heads = 8;
  const machine mc = dgx(a100_80gb, 4);
  const auto at = [](int tp, int pp, int dp, pl::schedule_kind k = pl::schedule_kind::one_f_one_b,
                     int chunks = 1) {
    layout l;
    l.tp = tp;
    l.pp = pp;
    l.dp = dp;
    l.schedule = k;
    l.chunks = chunks;
    l.global_batch = 64;
    return l;
  };
  struct kase {
    const char* what;
    model_spec m;
    layout l;
    const char* refusal; // "" : runs
  };
  std::vector<kase> cases = {
      {"1f1b", g, at(8, 2, 2), ""},
      {"gpipe", g, at(4, 4, 2, pl::schedule_kind::gpipe), ""},
      {"interleaved<2>", g, at(8, 2, 2, pl::schedule_kind::interleaved, 2), ""},
      {"interleaved<4> with pp 1", g, at(8, 1, 4, pl::schedule_kind::interleaved, 4), "pp >= 2"},
      {"zb-h1", g, at(8, 2, 2, pl::schedule_kind::zero_bubble_h1), "zb-h1"},
      {"llama", llama_7b, at(8, 4, 1), ""},
      {"llama, tp 16 over 8 kv heads", llama_7b, at(16, 2, 1), "spans nodes"},
      {"nemotron's ungated rotary MLP", nemotron, at(8, 4, 1), "no model of this shape"},
      {"bloom's ALiBi", bloom, at(8, 4, 1), "no model of this shape"},
      {"GQA in a GPT", gqa_gpt, at(8, 4, 1), "no model of this shape"},
      {"tp 16 on nodes of 8", g, at(16, 2, 1), "spans nodes"},
      {"layers uneven over pp 3", g, at(8, 3, 1), "do not split evenly"},
      {"layers uneven over pp 4 x 3 chunks", g, at(8, 4, 1, pl::schedule_kind::interleaved, 3),
       "do not split evenly"},
  };
  layout sp_tp1 = at(1, 4, 8);
  sp_tp1.sequence_parallel = true;
  cases.push_back({"sequence parallel at tp 1", g, sp_tp1, "needs tp >= 2"});
  model_spec odd_seq = g;
  odd_seq.seq = 2047;
  layout sp = at(8, 2, 2);
  sp.sequence_parallel = true;
  cases.push_back({"sequence parallel, 2047 tokens over tp 8", odd_seq, sp, "does not split"});
  cases.push_back({"sequence parallel, 2048 tokens over tp 8", g, sp, ""});
  layout across = at(2, 2, 8);
  across.tp_across_nodes = true;
  cases.push_back({"TP across nodes", g, across, "TP across nodes"});
  for (int zero = 0; zero <= 3; ++zero) {
    for (recompute rc : {recompute::none, recompute::selective, recompute::full}) {
      layout l = at(4, 2, 4);
      l.zero = zero;
      l.sync = shard_sync::last;          // what optim::zero<3> runs; no other stage reads it
      l.overlap_param_gather = zero == 1; // what optim::zero<1> runs (ZeRO-1 only)
      l.recomputation = rc;
      cases.push_back({"every ZeRO stage and recompute", g, l, ""});
      l.micro_batch = 16; // one micro-batch a step
      cases.push_back({"every ZeRO stage and recompute, one micro-batch", g, l, ""});
    }
  }
  // optim::zero<3> under the trainer gathers each unit for every forward and every backward and
  // reduce-scatters its gradients after the step's last backward or after every one
  // (trainer.hpp's enter and leave, config.gradient_sync): FSDP's other modes are priced, not
  // run. With one micro-batch a step every backward is the last.
  layout z3 = at(4, 2, 4); // 4 micro-batches of 4
  z3.zero = 3;
  z3.micro_batch = 4;
  ASSERT_EQ(z3.microbatches(), 4);
  cases.push_back({"ZeRO-3 reduce-scattering every micro-batch", g, z3, ""});
  z3.sync = shard_sync::once;
  cases.push_back({"ZeRO-3 gathered once a step", g, z3, "gathers each unit before every"});
  z3.sync = shard_sync::last;
  z3.reshard_after_forward = false;
  cases.push_back({"ZeRO-3 keeping weights from forward to backward", g, z3, "gathers them again"});
  layout z3_single = at(4, 2, 4);
  z3_single.zero = 3;
  z3_single.micro_batch = 16;
  ASSERT_EQ(z3_single.microbatches(), 1);
  cases.push_back({"ZeRO-3, one micro-batch, every", g, z3_single, ""});
  z3_single.sync = shard_sync::once;
  cases.push_back({"ZeRO-3, one micro-batch, once", g, z3_single, "gathers them again"});
  for (const kase& c : cases) {
    const std::string why = strategy_refusal(c.m, mc, c.l);
    if (std::string(c.refusal).empty()) {
      EXPECT_EQ(why, "") << c.what;
      EXPECT_NO_THROW((void)strategy_type(c.m, mc, c.l)) << c.what;
    } else {
      EXPECT_NE(why.find(c.refusal), std::string::npos) << c.what << ": '" << why << "'";
      EXPECT_THROW((void)strategy_type(c.m, mc, c.l), weft::error) << c.what;
    }
  }
}

TEST(sim_planner, strategy_type_spells_the_layout) {
  const model_spec g = gpt_shaped("gpt-175b", 96, 12288, 96, 51200);
  const machine mc = dgx(a100_80gb, 16);
  layout l;
  l.tp = 8;
  l.pp = 4;
  l.dp = 4;
  l.global_batch = 64;
  l.schedule = pl::schedule_kind::interleaved;
  l.chunks = 3;
  l.zero = 1;
  l.overlap_param_gather = true; // as optim::zero<1> gathers
  l.recomputation = recompute::selective;
  l.sequence_parallel = true;
  EXPECT_EQ(strategy_type(g, mc, l),
            "weft::strategy<weft::mesh<weft::tp<8>, weft::dp<4>, weft::pp<4>>, "
            "weft::pipeline::interleaved<3>, weft::optim::zero<1>, "
            "weft::layer::recompute::selective, weft::layer::sequence_parallel>");
  EXPECT_EQ(strategy_config_of(g, l),
            "{.model = {.vocab = 51200, .hidden = 12288, .heads = 96, .seq = 2048, .layers = 96, "
            ".tie_embeddings = true}, .micro_batch = 1, .global_batch = 64}");
  EXPECT_EQ(launch_line(mc, l, "./train"), "mpirun -n 128 --map-by ppr:8:node ./train");
  // A Llama-shaped model spells its FFN width even where the simulator's 0 says 4 h: 0 in
  // layer::llama_config is Llama's rule (8 h / 3, rounded).
  const model_spec gqa = llama_shaped("llama", 32, 4096, 32, 8, 0);
  l.schedule = pl::schedule_kind::one_f_one_b;
  l.chunks = 1;
  EXPECT_EQ(strategy_config_of(gqa, l),
            "{.model = {.vocab = 32000, .hidden = 4096, .heads = 32, .kv_heads = 8, .ffn = 16384, "
            ".seq = 4096, .layers = 32}, .micro_batch = 1, .global_batch = 64}");
  EXPECT_EQ(strategy_type(gqa, mc, l),
            "weft::strategy<weft::mesh<weft::tp<8>, weft::dp<4>, weft::pp<4>>, "
            "weft::pipeline::one_f_one_b, weft::optim::zero<1>, weft::layer::recompute::selective, "
            "weft::layer::sequence_parallel, weft::layer::llama_model>");
  // Reducing every micro-batch, as the simulator prices ZeRO-2 and ZeRO-3's sync every, is
  // config.gradient_sync every; one micro-batch a step (dp 4 x 16 = 64) needs nothing said.
  const std::string every = ", .gradient_sync = weft::optim::gradient_sync::every}";
  const auto ends_with = [](const std::string& s, const std::string& end) {
    return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
  };
  ASSERT_EQ(l.microbatches(), 16);
  for (const auto& [zero, sync, says_every] :
       {std::tuple{1, shard_sync::every, false}, std::tuple{2, shard_sync::every, true},
        std::tuple{3, shard_sync::every, true}, std::tuple{3, shard_sync::last, false}}) {
    l.zero = zero;
    l.sync = sync;
    EXPECT_EQ(ends_with(strategy_config_of(g, l), every), says_every)
        << "zero " << zero << " sync " << name_of(sync) << ": " << strategy_config_of(g, l);
  }
  l.micro_batch = 16;
  l.zero = 2;
  EXPECT_TRUE(ends_with(strategy_config_of(g, l), ".global_batch = 64}"));
}

// Without the restriction the MT-NLG search ranks ZB-H1 first, which weft::strategy refuses; with
// --runnable every ranked layout is one it runs, each ranked layout's refusal is the rule's, and
// the restricted best is no faster than the unrestricted one.
TEST(sim_planner, a_runnable_search_keeps_to_what_weft_strategy_runs) {
  const model_spec m = gpt_shaped("mt-nlg-530b", 105, 20480, 128, 50272);
  const machine mc = dgx(a100_80gb, 280);
  search_options o;
  o.global_batch = 1920;
  const search_result all = search(m, mc, o);
  EXPECT_EQ(all.ranked.front().l.schedule, pl::schedule_kind::zero_bubble_h1);
  for (const auto& x : all.ranked)
    EXPECT_EQ(x.refusal, strategy_refusal(m, mc, x.l)) << describe(x.l);
  EXPECT_FALSE(all.ranked.front().refusal.empty());
  o.runnable_only = true;
  const search_result runnable = search(m, mc, o);
  ASSERT_FALSE(runnable.ranked.empty());
  for (const auto& x : runnable.ranked) {
    EXPECT_EQ(x.refusal, "") << describe(x.l);
    EXPECT_EQ(strategy_refusal(m, mc, x.l), "") << describe(x.l);
    EXPECT_NE(x.l.schedule, pl::schedule_kind::zero_bubble_h1) << describe(x.l);
    EXPECT_LE(x.l.tp, 8) << describe(x.l);
  }
  EXPECT_GE(runnable.ranked.front().r.step_time_s, all.ranked.front().r.step_time_s);
  // The unrestricted search keeps the restricted one's best.
  ASSERT_TRUE(all.best_runnable.has_value());
  EXPECT_EQ(describe(all.best_runnable->l), describe(runnable.ranked.front().l));
  EXPECT_DOUBLE_EQ(all.best_runnable->r.step_time_s, runnable.ranked.front().r.step_time_s);
  std::printf("  MT-NLG: best %s (%.2f s); best runnable %s (%.2f s)\n",
              describe(all.ranked.front().l).c_str(), all.ranked.front().r.step_time_s,
              describe(runnable.ranked.front().l).c_str(), runnable.ranked.front().r.step_time_s);
}

// The splits add up: time to the step, memory to the simulated bytes, for every ranked layout;
// ZeRO-3's gathers show as buffers, taken from the activations.
TEST(sim_planner, the_time_and_memory_splits_add_up) {
  const model_spec m = gpt_shaped("gpt-175b", 96, 12288, 96, 51200);
  const machine mc = dgx(a100_80gb, 16);
  search_options o;
  o.global_batch = 256;
  const search_result s = search(m, mc, o);
  for (const auto& x : s.ranked) {
    const time_split t = split_time(x.r);
    EXPECT_NEAR(t.compute + t.bubble + t.tp_exposed + t.dp_exposed + t.optimizer, x.r.step_time_s,
                1e-9 * x.r.step_time_s)
        << describe(x.l);
    EXPECT_GT(t.compute, 0) << describe(x.l);
    EXPECT_GE(t.bubble, 0) << describe(x.l);
    const memory_split b = split_memory(x.r);
    EXPECT_NEAR(b.parameters + b.gradients + b.optimizer + b.activations + b.buffers,
                x.r.memory_bytes(), 1e-9 * x.r.memory_bytes())
        << describe(x.l);
  }
  layout z3;
  z3.tp = 8;
  z3.pp = 2;
  z3.dp = 8;
  z3.global_batch = 256;
  z3.zero = 3;
  z3.recomputation = recompute::full;
  const step_result r = simulate_step(m, mc, z3);
  const memory_split b = split_memory(r);
  // a layer's weights in 16 bits, twice (in use and prefetched), over TP 8
  EXPECT_DOUBLE_EQ(b.buffers, 2 * 2 * (12.0 * 12288 * 12288 + 13 * 12288) / 8);
  EXPECT_DOUBLE_EQ(b.parameters, r.states.weights);
  const std::string why = explain_winner(s);
  for (const char* part : {"compute", "bubble", "exposed TP", "exposed DP", "parameters",
                           "gradients", "optimizer state", "activations", "buffers", "#2"})
    EXPECT_NE(why.find(part), std::string::npos) << part << "\n" << why;
}

// Without dropout a layer keeps neither 1-byte mask (sbh each, split over TP by sequence
// parallelism) nor, of the attention core, the mask (a s^2 b) and the dropped probabilities
// (2 a s^2 b, both split over TP), and the first stage no embedding dropout mask; Nemotron-4's
// recipe on 128 H100 (DGX Cloud: TP 8, PP 8, DP 2, 12 chunks, sequence parallelism, ZeRO-1)
// then holds 79.4 GiB instead of 81.3 (sim_memory_test works it out by hand).
TEST(sim_planner, a_model_without_dropout_keeps_no_masks) {
  model_spec m = gpt_shaped("gpt-13b", 40, 5120, 40, 51200);
  model_spec dry = m;
  dry.dropout = false;
  const double s = m.seq, h = m.hidden, a = m.heads, b = 2, t = 4;
  for (recompute rc : {recompute::none, recompute::selective, recompute::full}) {
    for (bool sp : {false, true}) {
      const double masks = rc == recompute::full ? 0 : 2 * s * b * h / (sp ? t : 1);
      const double core = rc == recompute::none ? 3 * a * s * s * b / t : 0;
      EXPECT_DOUBLE_EQ(activation_bytes_per_layer(m, b, 4, sp, rc) -
                           activation_bytes_per_layer(dry, b, 4, sp, rc),
                       masks + core)
          << name_of(rc) << (sp ? " with SP" : "");
    }
  }
  model_spec nemotron = model_named("nemotron4-340b");
  nemotron.dropout = true;
  const layout l = weft_test::nemotron_recipe();
  const double gib = 1024.0 * 1024 * 1024;
  const double with_masks = estimate_memory(nemotron, l);
  nemotron.dropout = false;
  const double without = estimate_memory(nemotron, l);
  std::printf(
      "  Nemotron-4 340B, DGX Cloud recipe: %.1f GiB per GPU with dropout masks, %.1f without\n",
      with_masks / gib, without / gib);
  // 103 one-layer chunks in flight on the first stage (2 (p - 1) + (v - 1) p + 1), two masks of
  // s b h / t bytes each, and the embedding's mask of s b h / t for each of the 103/12
  // micro-batches its first chunk holds
  EXPECT_NEAR(with_masks - without, (103 * 2 + 103.0 / 12) * 4096.0 * 18432 / 8, 1e-6 * with_masks);
}

// Llama-2 13B on 16 A100 nodes whose NICs carry 50 Gb/s each (400 Gb/s a node), one sequence of
// 4,096 per GPU: fms-fsdp's published run (data/sharded_runs.csv, llama2-13b-hsdp-noac-a100-128),
// which chose HSDP. Sharding over all 128 GPUs sends every gather across that network, more than
// the backward hides; HSDP sends only each block's gradient shard across it (an all-reduce over
// 16 replicas), so it is the faster layout here and the search must find it; without
// hybrid_sharding it cannot.
TEST(sim_planner, the_search_shards_over_a_node_where_that_is_faster) {
  const model_spec m = llama_shaped("llama2-13b", 40, 5120, 40, 0, 13824);
  machine mc = dgx(a100_80gb, 16);
  weft::topology::link inter = mc.cluster.inter();
  inter.bandwidth = 50e9 / 8;
  mc.cluster = weft::topology::cluster(mc.cluster.devices_per_node(), mc.cluster.intra(), inter,
                                       mc.cluster.nics_per_node(), mc.cluster.reduce_bandwidth());
  search_options o;
  o.global_batch = 128;
  o.micro_batches = {1};
  o.schedules = {pl::schedule_kind::one_f_one_b};
  o.recomputes = {recompute::none};
  o.zero3_modes = {{true, shard_sync::last}}; // as weft::optim::hybrid<zero<3>, zero<0>> runs it
  expect_each_mesh_best_as_brute_force_finds(m, mc, o);
  const auto mesh_of = [](const search_result& s, int tp, int pp) {
    for (const ranked_layout& x : s.ranked)
      if (x.l.tp == tp && x.l.pp == pp) return x;
    ADD_FAILURE() << "no mesh tp " << tp << " pp " << pp;
    return s.ranked.front();
  };
  const ranked_layout hybrid = mesh_of(search(m, mc, o), 1, 1);
  o.hybrid_sharding = false;
  const ranked_layout whole = mesh_of(search(m, mc, o), 1, 1);
  std::printf("  llama2-13b on 128 A100, 50 Gb/s NICs: %s at %.3f s; without HSDP %s at %.3f s\n",
              describe(hybrid.l).c_str(), hybrid.r.step_time_s, describe(whole.l).c_str(),
              whole.r.step_time_s);
  EXPECT_EQ(hybrid.l.zero, 3);
  EXPECT_EQ(hybrid.l.shards(), 8);
  EXPECT_EQ(whole.l.shards(), 128);
  EXPECT_LT(hybrid.r.step_time_s, whole.r.step_time_s);
  EXPECT_EQ(hybrid.refusal, "") << "weft::optim::hybrid<zero<3>, zero<0>> runs it";
}

// weft::strategy's hybrid<zero<3>, zero<0>> shards over the DP ranks of a node: that layout is
// spelt with it, any other shard group is refused with the reason.
TEST(sim_planner, strategy_type_spells_hsdp_as_optim_hybrid) {
  const model_spec m = llama_shaped("llama", 32, 4096, 32, 0, 0);
  const machine mc = dgx(a100_80gb, 16);
  layout l;
  l.tp = 2;
  l.dp = 64;
  l.global_batch = 64;
  l.zero = 3;
  l.shard_group = 4; // 8 devices a node / tp 2
  EXPECT_EQ(strategy_type(m, mc, l),
            "weft::strategy<weft::mesh<weft::tp<2>, weft::dp<64>, weft::pp<1>>, "
            "weft::pipeline::one_f_one_b, weft::optim::hybrid<weft::optim::zero<3>, "
            "weft::optim::zero<0>>, weft::layer::recompute::none, "
            "weft::layer::no_sequence_parallel, weft::layer::llama_model>");
  l.shard_group = 8;
  EXPECT_EQ(
      strategy_refusal(m, mc, l),
      "shard groups of 8 DP ranks: weft::optim::hybrid shards over the DP ranks of a node (4)");
  l.zero = 1;
  l.overlap_param_gather = true; // as optim::zero<1> gathers
  EXPECT_EQ(strategy_refusal(m, mc, l),
            "ZeRO-1 over groups of 8: the simulator prices shard groups under ZeRO-3 only");
  l.overlap_param_gather = false;
  l.zero = 3;
  l.shard_group = 0;
  EXPECT_EQ(strategy_refusal(m, mc, l), "");
}

// describe() names the engine that runs a layout's ZeRO stage, HSDP's groups and an optimizer
// state other than Adam's fp32 one.
TEST(sim_planner, describe_names_the_shard_engine) {
  layout l;
  l.dp = 128;
  const std::string head = "tp 1 pp 1 dp 128, micro-batch 1, 1f1b, recompute none";
  EXPECT_EQ(describe(l), head);
  l.zero = 2;
  EXPECT_EQ(describe(l), head + ", ZeRO-2");
  use_shard_engine(l, shard_engine::fsdp);
  EXPECT_EQ(describe(l), head + ", ZeRO-3 (fsdp)");
  l.shard_group = 8;
  EXPECT_EQ(describe(l), head + ", ZeRO-3 (hsdp: fsdp over groups of 8, 16 replicas)");
  use_shard_engine(l, shard_engine::fsdp2);
  EXPECT_EQ(describe(l), head + ", ZeRO-3 (hsdp: fsdp2 over groups of 8, 16 replicas)");
  use_shard_engine(l, shard_engine::deepspeed_zero3);
  EXPECT_EQ(describe(l), head + ", ZeRO-3 (deepspeed-zero3 over groups of 8, 16 replicas)");
  l.shard_group = 0;
  EXPECT_EQ(describe(l), head + ", ZeRO-3 (deepspeed-zero3)");
  l.sharding = shard_engine::none;
  l.shard_group = 32;
  EXPECT_EQ(describe(l), head + ", ZeRO-3 over groups of 32, 4 replicas");
  l.shard_group = 0;
  use_shard_engine(l, shard_engine::megatron_distopt);
  l.optimizer_bytes = optimizer_state_named("bf16");
  EXPECT_EQ(describe(l), head + ", ZeRO-1 (megatron-distopt), 4-byte optimizer state");
}

// Published runs: the search, given the run's model, cluster, batch and software (engine, TP
// overlap, gradient accumulation), finds a layout at least as fast in the simulator as the
// published one. `layout_rank`: 1 + the ranked meshes whose best variant is faster than the
// published layout; `mesh_rank`: where the published mesh ranks.
struct published_standing {
  std::size_t layout_rank = 0, mesh_rank = 0;
  double published_s = 0, best_s = 0;
};

// What the run's software could have chosen beyond its layout: ZeRO stages up to max_zero, and
// ZeRO-1 as a distributed optimizer that gathers behind the next forward.
struct software {
  int max_zero = 3;
  bool distributed_optimizer = true;
};

published_standing standing_of_published(const std::string& id, software sw = {}) {
  const auto runs = weft_test::read_published_runs();
  const auto it = std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r.id == id; });
  if (it == runs.end()) throw weft::error("no published run " + id);
  const weft_test::published_run& run = *it;
  const machine mc = dgx(run.device, (run.gpus + 7) / 8);
  search_options o;
  o.global_batch = run.layout.batch();
  // The run's software: its pipeline engine, TP overlap and gradient accumulation; sequence
  // parallelism and selective recomputation (Korthikanti et al. 2022, one release of Megatron-LM)
  // only where the run has either, else none or full recomputation and no sequence parallelism.
  o.engine = engine_of(run.layout);
  if (!run.layout.sequence_parallel && run.layout.recomputation != recompute::selective) {
    o.sequence_parallel = false;
    o.recomputes = {recompute::none, recompute::full};
  }
  o.tp_overlap = run.layout.tp_overlap;
  o.grad_accumulation_bytes = run.layout.grad_accumulation_bytes;
  o.max_zero = sw.max_zero;
  o.overlap_param_gather = sw.distributed_optimizer;
  const search_result s = search(run.model, mc, o);
  const step_result published = simulate_step(run.model, mc, run.layout);
  EXPECT_LE(published.memory_bytes(), mc.device.hbm_bytes) << id;
  published_standing out;
  out.published_s = published.step_time_s;
  out.best_s = s.ranked.front().r.step_time_s;
  out.layout_rank = 1;
  for (std::size_t i = 0; i < s.ranked.size(); ++i) {
    const layout& l = s.ranked[i].l;
    out.layout_rank += s.ranked[i].r.step_time_s < published.step_time_s ? 1 : 0;
    if (l.tp == run.layout.tp && l.pp == run.layout.pp && l.dp == run.layout.dp)
      out.mesh_rank = i + 1;
  }
  std::printf("  %s: published %s at %.2f s ranks #%zu of %zu (its mesh #%zu); best %s at %.2f s\n",
              id.c_str(), describe(run.layout).c_str(), published.step_time_s, out.layout_rank,
              s.ranked.size(), out.mesh_rank, describe(s.ranked.front().l).c_str(), out.best_s);
  EXPECT_LE(out.best_s, out.published_s) << id;
  return out;
}

TEST(sim_planner, published_gpt3_175b_layout_is_in_the_top_5) {
  EXPECT_LE(standing_of_published("gpt-175b").layout_rank, 5u);
}

TEST(sim_planner, published_gpt_530b_layout_is_in_the_top_5) {
  EXPECT_LE(standing_of_published("gpt-530b").layout_rank, 5u);
}

TEST(sim_planner, published_gpt_1t_layout_is_in_the_top_5) {
  EXPECT_LE(standing_of_published("gpt-1t").layout_rank, 5u);
}

// MT-NLG as recorded (micro-batches of 2, which the row assumes: its source does not say) runs
// 120 micro-batches through 35 stages, a bubble of 28% against 14% at micro-batches of 1: four of
// the six meshes' best variants beat it, the published mesh's own by 9%. The mesh ranks in the
// top 5.
TEST(sim_planner, published_mt_nlg_530b_mesh_is_in_the_top_5) {
  const published_standing s = standing_of_published("mt-nlg-530b");
  EXPECT_GE(s.mesh_rank, 1u);
  EXPECT_LE(s.mesh_rank, 5u);
}

// SC21's 1T run against the 3D layouts of its software (Megatron-LM of 2021 shards no weights:
// the search up to ZeRO-1, which also tries 3 and 4 chunks): five meshes beat it, the best by
// 7%, within the simulator's error on published runs (10%); its mesh ranks in the top 5 (#5).
// With ZeRO-3 in the search, TP 4 x DP 768 at micro-batches of 4 wins at 82.0 s against the
// published 101.7 s: one micro-batch of 4 per rank, no bubble, 81.6 s of compute, and 48.7 s of
// gathers and reduce-scatters per step hidden behind it (0.4 s shows; the A100's
// overlap_slowdown, fitted with its other constants on its tuning rows, is 0). No published row
// checks ZeRO-3 beyond 128 GPUs, nor a 1T model under it: that ranking is the simulator's,
// unchecked, and the test asserts only what its split says.
TEST(sim_planner, published_sc21_1t_layout_is_within_10_percent_of_the_best) {
  // Megatron-LM of 2021: no ZeRO-2 or 3, no distributed optimizer.
  const published_standing s =
      standing_of_published("gpt-1008b", {.max_zero = 1, .distributed_optimizer = false});
  EXPECT_LE(s.published_s, 1.10 * s.best_s);
  EXPECT_GE(s.mesh_rank, 1u);
  EXPECT_LE(s.mesh_rank, 5u);
  const published_standing sharded = standing_of_published("gpt-1008b");
  EXPECT_LE(sharded.best_s, s.best_s);
}

// The ZeRO-3 layout that the full search ranks first for SC21's 1T run, as a time split: one
// micro-batch per rank, its step its compute with the gathers and reduce-scatters (over 40% of
// the step) under it, under 2% of the step showing; never faster than its hardware FLOPs at the
// A100's fitted GEMM efficiency (the reference, worked here), and within the GPU's memory.
TEST(sim_planner, sc21_1t_under_zero3_hides_its_gathers_behind_compute) {
  const auto runs = weft_test::read_published_runs();
  const auto it =
      std::find_if(runs.begin(), runs.end(), [](const auto& r) { return r.id == "gpt-1008b"; });
  ASSERT_NE(it, runs.end());
  const machine mc = dgx(it->device, (it->gpus + 7) / 8);
  layout z{.tp = 4, .dp = 768, .micro_batch = 4, .global_batch = 3072, .zero = 3};
  z.recomputation = recompute::full;
  z.sequence_parallel = false;
  z.grad_accumulation_bytes = it->layout.grad_accumulation_bytes;
  const step_result r = simulate_step(it->model, mc, z);
  std::printf(
      "  SC21 1T as ZeRO-3 tp 4 dp 768 micro-batch 4: step %.2f s, forward %.2f s, backward "
      "%.2f s, exposed sharding %.2f s, sharding sent %.2f s, TP %.2f s, memory %.1f GiB\n",
      r.step_time_s, r.forward_s, r.backward_s, r.shard_exposed_s, r.dp.seconds, r.tp.seconds,
      r.memory_bytes() / (1024.0 * 1024 * 1024));
  EXPECT_EQ(r.microbatches, 1);
  EXPECT_LT(r.shard_exposed_s, 0.02 * r.step_time_s);
  EXPECT_GT(r.dp.seconds, 0.4 * r.step_time_s); // a large share of the step, hidden
  EXPECT_LE(r.memory_bytes(), mc.device.hbm_bytes);
  const double flops = it->model.hardware_flops(3072, recompute::full);
  EXPECT_GE(r.step_time_s,
            flops / (3072 * mc.device.peak_flops * calibration_of(mc.device).gemm_peak_fraction));
}

} // namespace

// With context parallelism given (search_options::cp, weft-plan --cp), every mesh the search
// ranks splits each sequence over that many ranks: tp * cp * pp * dp fills the cluster, no
// shard group is a node's (HSDP with CP is not modelled), and weft::strategy, which has no CP
// axis, refuses each by name.
TEST(sim_planner, a_context_parallel_search_keeps_cp_in_every_mesh) {
  const model_spec m = llama_shaped("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 32768);
  const machine mc = dgx(h100_sxm, 2);
  search_options o;
  o.global_batch = 16;
  o.cp = 2;
  const search_result s = search(m, mc, o);
  ASSERT_FALSE(s.ranked.empty());
  for (const auto& x : s.ranked) {
    EXPECT_EQ(x.l.cp, 2) << describe(x.l);
    EXPECT_EQ(x.l.tp * x.l.cp * x.l.pp * x.l.dp, 16) << describe(x.l);
    EXPECT_EQ(x.l.shard_group, 0) << describe(x.l);
    EXPECT_NE(x.refusal.find("context parallelism"), std::string::npos) << x.refusal;
  }
  EXPECT_FALSE(s.best_runnable.has_value());
  // Each ranked figure is the step the simulator gives that layout on its own.
  const auto& best = s.ranked.front();
  EXPECT_DOUBLE_EQ(best.r.step_time_s, simulate_step(m, mc, best.l).step_time_s);
  o.cp = 3; // 32,768 tokens do not split into 6 chunks
  EXPECT_THROW((void)search(m, mc, o), weft::error);
}
