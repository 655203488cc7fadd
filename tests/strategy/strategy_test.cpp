// weft::strategy on in-process ranks: for each mesh of the issue (1x1x1, 2x1x1, 1x2x1, 1x1x2,
// 2x2x2, 2x2x1 with V = 2, 1x4x2 with an uneven layout; TP x PP x DP) and each ZeRO stage, the
// per-step losses of 20 AdamW steps equal those of the same model trained on one rank on the
// whole batch (strategy_support.hpp), within 1e-5 relative; so do the recompute policies,
// sequence parallelism, tied embeddings and gradient clipping by the global norm over the whole
// mesh. Bad configurations fail with a weft::error naming what is wrong.
#include <weft/comm/transport/local.hpp>
#include <weft/pipeline/layout.hpp>
#include <weft/strategy.hpp>

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "strategy/strategy_support.hpp"

namespace {

namespace ts = weft::test::strategy;
using weft::dp;
using weft::mesh;
using weft::pp;
using weft::tp;
using weft::layer::no_sequence_parallel;
using weft::layer::sequence_parallel;
namespace recompute = weft::layer::recompute;
namespace pipeline = weft::pipeline;
namespace optim = weft::optim;

template <class Rule>
const std::vector<double>& reference(const Rule& rule, bool tied = false) {
  static const std::vector<double> r = ts::reference_losses(rule);
  static const std::vector<double> t = ts::reference_losses(rule, true);
  return tied ? t : r;
}

// Every rank's losses; they must agree with each other and with `want`.
template <class S, class Rule>
void expect_losses(weft::strategy_config config, const std::vector<double>& want,
                   const std::string& what, const Rule& rule) {
  std::vector<std::vector<double>> per_rank(S::size);
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    per_rank[static_cast<std::size_t>(world.rank())] = ts::strategy_losses<S>(world, config, rule);
  });
  for (int r = 0; r < S::size; ++r) {
    ts::expect_same_losses(per_rank[static_cast<std::size_t>(r)], want,
                           what + " " + std::string(Rule::name) + " rank " + std::to_string(r));
  }
}

// ... and with the single-rank reference's.
template <class S, class Rule = optim::sgd>
void expect_matches(weft::strategy_config config, const std::string& what,
                    const Rule& rule = ts::sgd_rule) {
  expect_losses<S>(config, reference(rule, config.model.tie_embeddings), what, rule);
}

template <class Mesh, class Schedule, class Recompute = recompute::none,
          class SP = no_sequence_parallel, class Rule = optim::sgd>
void every_zero_stage(weft::strategy_config config, const std::string& what,
                      const Rule& rule = ts::sgd_rule) {
  expect_matches<weft::strategy<Mesh, Schedule, optim::zero<0>, Recompute, SP>>(
      config, what + " zero<0>", rule);
  expect_matches<weft::strategy<Mesh, Schedule, optim::zero<1>, Recompute, SP>>(
      config, what + " zero<1>", rule);
  expect_matches<weft::strategy<Mesh, Schedule, optim::zero<2>, Recompute, SP>>(
      config, what + " zero<2>", rule);
  expect_matches<weft::strategy<Mesh, Schedule, optim::zero<3>, Recompute, SP>>(
      config, what + " zero<3>", rule);
}

// Under a sanitizer (WEFT_TEST_SANITIZED) each strategy type compiles for seconds at -O1 with
// instrumentation, and this file holds dozens. There the meshes of one axis (and the AdamW run)
// take zero<1> alone; the 3D meshes (2x2x2, 1x4x2 uneven) still take every stage, which runs each
// ZeRO stage's code with tensor, pipeline and data parallelism at once. Plain builds run all.
#ifdef WEFT_TEST_SANITIZED
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif

template <class Mesh, class Schedule, class Recompute = recompute::none,
          class SP = no_sequence_parallel, class Rule = optim::sgd>
void zero_stages(weft::strategy_config config, const std::string& what,
                 const Rule& rule = ts::sgd_rule) {
  if constexpr (sanitized) {
    expect_matches<weft::strategy<Mesh, Schedule, optim::zero<1>, Recompute, SP>>(
        config, what + " zero<1>", rule);
  } else {
    every_zero_stage<Mesh, Schedule, Recompute, SP>(config, what, rule);
  }
}

TEST(strategy, the_reference_learns) {
  const auto& r = reference(ts::adamw_rule);
  ASSERT_EQ(r.size(), static_cast<std::size_t>(ts::steps));
  EXPECT_LT(r.back(), r.front() - 0.1) << "the synthetic pattern should be learnable";
}

TEST(strategy, adamw_three_d_2x2x2_matches) {
  zero_stages<mesh<tp<2>, pp<2>, dp<2>>, pipeline::one_f_one_b, recompute::none,
              no_sequence_parallel>({.micro_batch = 1}, "2x2x2", ts::adamw_rule);
}

TEST(strategy, one_rank_matches_the_reference) {
  zero_stages<mesh<tp<1>, pp<1>, dp<1>>, pipeline::one_f_one_b>({}, "1x1x1");
}

TEST(strategy, tensor_parallel_2_matches) {
  zero_stages<mesh<tp<2>, pp<1>, dp<1>>, pipeline::one_f_one_b>({.micro_batch = 2}, "2x1x1");
}

TEST(strategy, pipeline_parallel_2_matches) {
  zero_stages<mesh<tp<1>, pp<2>, dp<1>>, pipeline::one_f_one_b>({.micro_batch = 2}, "1x2x1");
}

TEST(strategy, data_parallel_2_matches) {
  zero_stages<mesh<tp<1>, pp<1>, dp<2>>, pipeline::one_f_one_b>({.micro_batch = 2}, "1x1x2");
}

TEST(strategy, three_d_2x2x2_matches) {
  every_zero_stage<mesh<tp<2>, pp<2>, dp<2>>, pipeline::one_f_one_b>({.micro_batch = 1}, "2x2x2");
}

TEST(strategy, interleaved_2x2x1_with_two_chunks_matches) {
  zero_stages<mesh<tp<2>, pp<2>, dp<1>>, pipeline::interleaved<2>>({.micro_batch = 2}, "2x2x1 V=2");
}

TEST(strategy, uneven_layout_1x4x2_matches) {
  // Two blocks on the first stage with the embedding, none on the last (only the loss).
  every_zero_stage<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b>(
      {.micro_batch = 1, .layout = pipeline::parse_layout("Et*2|t|t|L")}, "1x4x2 uneven");
}

TEST(strategy, gpipe_and_recompute_policies_match) {
  using M = mesh<tp<2>, pp<2>, dp<1>>;
  expect_matches<weft::strategy<M, pipeline::gpipe, optim::zero<1>, recompute::selective>>(
      {.micro_batch = 2}, "gpipe selective");
  expect_matches<weft::strategy<M, pipeline::one_f_one_b, optim::zero<1>, recompute::full>>(
      {.micro_batch = 2}, "1f1b full");
}

TEST(strategy, sequence_parallel_matches) {
  expect_matches<weft::strategy<mesh<tp<2>, pp<2>, dp<2>>, pipeline::interleaved<2>, optim::zero<1>,
                                recompute::selective, sequence_parallel>>({.micro_batch = 1},
                                                                          "2x2x2 V=2 SP");
}

TEST(strategy, tied_embeddings_match) {
  // The embedding group across pipeline stages; both copies on one stage; an uneven layout.
  expect_matches<weft::strategy<mesh<tp<2>, pp<2>, dp<1>>, pipeline::one_f_one_b, optim::zero<1>,
                                recompute::none>>(
      {.model = {.tie_embeddings = true}, .micro_batch = 2}, "2x2x1 tied");
  expect_matches<weft::strategy<mesh<tp<2>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<2>,
                                recompute::none>>(
      {.model = {.tie_embeddings = true}, .micro_batch = 2}, "2x1x2 tied");
  expect_matches<weft::strategy<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b, optim::zero<3>,
                                recompute::none>>({.model = {.tie_embeddings = true},
                                                   .micro_batch = 1,
                                                   .layout = pipeline::parse_layout("Et*2|t|t|L")},
                                                  "1x4x2 tied");
  // and the tied model is not the untied one
  EXPECT_NE(reference(ts::sgd_rule, true)[1], reference(ts::sgd_rule, false)[1]);
}

// gradient_sync every: zero<2>/<3> reduce-scatter each unit's gradients after every backward
// (4 microbatches a step here) and add them into the shard; the losses are still the one-rank
// reference's. Interleaved with sequence parallelism (a unit's TP partial sums reduced each
// microbatch), tied embeddings (whole over the step, reduced after the pipeline) and an uneven
// layout.
TEST(strategy, gradient_sync_every_microbatch_matches) {
  using every = weft::optim::gradient_sync;
  expect_matches<weft::strategy<mesh<tp<2>, pp<2>, dp<2>>, pipeline::interleaved<2>, optim::zero<2>,
                                recompute::selective, sequence_parallel>>(
      {.micro_batch = 1, .gradient_sync = every::every}, "2x2x2 V=2 SP zero<2> every");
  expect_matches<weft::strategy<mesh<tp<2>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<3>,
                                recompute::none>>(
      {.model = {.tie_embeddings = true}, .micro_batch = 1, .gradient_sync = every::every},
      "2x1x2 tied zero<3> every");
  if constexpr (!sanitized) {
    expect_matches<weft::strategy<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b, optim::zero<3>,
                                  recompute::none>>({.model = {.tie_embeddings = true},
                                                     .micro_batch = 1,
                                                     .layout = pipeline::parse_layout("Et*2|t|t|L"),
                                                     .gradient_sync = every::every},
                                                    "1x4x2 tied uneven zero<3> every");
  }
}

TEST(strategy, gradient_clipping_by_the_global_norm_matches) {
  // The norm spans TP, PP and DP: tensor-replicated parameters (norms, row-parallel biases) and
  // the tied head count once. A bound under every step's norm, so every step clips.
  constexpr double bound = 0.2;
  std::vector<double> norms;
  const auto tied = ts::reference_losses(ts::sgd_rule, true, 1, ts::steps, bound, &norms);
  const auto untied = ts::reference_losses(ts::sgd_rule, false, 1, ts::steps, bound);
  for (std::size_t s = 0; s < norms.size(); ++s)
    EXPECT_GT(norms[s], 1.5 * bound) << "step " << s;
  EXPECT_NE(tied[1], reference(ts::sgd_rule, true)[1]) << "clipping changed nothing";
  const auto clip = [](weft::strategy_config c) {
    c.optimizer.max_grad_norm = static_cast<float>(bound);
    return c;
  };
  // (The strategy types of the tests above: nothing new to compile.)
  expect_losses<weft::strategy<mesh<tp<2>, pp<2>, dp<2>>, pipeline::one_f_one_b, optim::zero<1>,
                               recompute::none>>(clip({.micro_batch = 1}), untied,
                                                 "2x2x2 zero<1> clipped", ts::sgd_rule);
  expect_losses<weft::strategy<mesh<tp<2>, pp<2>, dp<2>>, pipeline::interleaved<2>, optim::zero<1>,
                               recompute::selective, sequence_parallel>>(
      clip({.micro_batch = 1}), untied, "2x2x2 V=2 SP clipped", ts::sgd_rule);
  expect_losses<weft::strategy<mesh<tp<2>, pp<2>, dp<1>>, pipeline::one_f_one_b, optim::zero<1>,
                               recompute::none>>(
      clip({.model = {.tie_embeddings = true}, .micro_batch = 2}), tied, "2x2x1 tied clipped",
      ts::sgd_rule);
  expect_losses<weft::strategy<mesh<tp<2>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<2>,
                               recompute::none>>(
      clip({.model = {.tie_embeddings = true}, .micro_batch = 2}), tied, "2x1x2 tied clipped",
      ts::sgd_rule);
  expect_losses<weft::strategy<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b, optim::zero<3>,
                               recompute::none>>(
      clip({.model = {.tie_embeddings = true},
            .micro_batch = 1,
            .layout = pipeline::parse_layout("Et*2|t|t|L")}),
      tied, "1x4x2 tied clipped", ts::sgd_rule);
}

TEST(strategy, the_stages_hold_the_layout) {
  using S = weft::strategy<mesh<tp<1>, pp<2>, dp<1>>, pipeline::interleaved<2>, optim::zero<0>,
                           recompute::none>;
  std::vector<std::vector<int>> layouts(2);
  std::vector<int> mbs(2);
  weft::local::run(2, [&](weft::local::communicator& world) {
    weft::strategy_config c{.model = ts::shape, .micro_batch = 2, .global_batch = ts::global_batch};
    auto t = S::make(world, c, ts::sgd_rule);
    layouts[static_cast<std::size_t>(world.rank())] = t->layout();
    mbs[static_cast<std::size_t>(world.rank())] = t->microbatches();
  });
  EXPECT_EQ(layouts[0], (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(mbs[0], 4);
}

// --- bad configurations: a clear weft::error on every rank, nothing hangs ----------------------

template <class S>
std::vector<std::string> errors_of(int world_size, weft::strategy_config c) {
  std::vector<std::string> what(static_cast<std::size_t>(world_size));
  c.model = c.model.layers == 0 ? ts::shape : c.model;
  if (c.global_batch == 0) c.global_batch = ts::global_batch;
  weft::local::run(world_size, [&](weft::local::communicator& world) {
    try {
      (void)S::make(world, c, ts::sgd_rule);
    } catch (const weft::error& e) {
      what[static_cast<std::size_t>(world.rank())] = e.what();
    }
  });
  return what;
}

void expect_every_rank_says(const std::vector<std::string>& errors, const std::string& needle) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find(needle), std::string::npos)
        << "rank " << r << ": '" << errors[r] << "'";
  }
}

TEST(strategy_errors, world_size_not_matching_the_mesh) {
  using S = weft::strategy<mesh<tp<2>, pp<2>, dp<1>>, pipeline::one_f_one_b, optim::zero<1>,
                           recompute::none>;
  expect_every_rank_says(errors_of<S>(3, {}), "the mesh has 4 ranks but the world has 3");
}

TEST(strategy_errors, layers_that_do_not_split_evenly) {
  using S = weft::strategy<mesh<tp<1>, pp<3>, dp<1>>, pipeline::one_f_one_b, optim::zero<0>,
                           recompute::none>;
  expect_every_rank_says(errors_of<S>(3, {}), "4 layers do not split evenly over 3 virtual stages");
}

TEST(strategy_errors, a_layout_that_does_not_sum_to_the_layers) {
  using S = weft::strategy<mesh<tp<1>, pp<2>, dp<1>>, pipeline::one_f_one_b, optim::zero<0>,
                           recompute::none>;
  expect_every_rank_says(errors_of<S>(2, {.layout = {3, 2}}),
                         "the stages hold 5 layers, the model has 4");
  expect_every_rank_says(errors_of<S>(2, {.layout = {4}}), "1 entries for 2 virtual stages");
}

TEST(strategy_errors, a_batch_that_does_not_divide) {
  using S = weft::strategy<mesh<tp<1>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<0>,
                           recompute::none>;
  expect_every_rank_says(errors_of<S>(2, {.micro_batch = 3}),
                         "a global batch of 8 sequences does not split into 2 data-parallel ranks "
                         "x microbatches of 3");
}

// Reducing every microbatch into a shard needs a sharded gradient (zero<2>/<3>) and a bucket per
// unit (what the trainer reduces after a unit's backward).
TEST(strategy_errors, gradient_sync_every_where_it_cannot_run) {
  using Z1 = weft::strategy<mesh<tp<1>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<1>,
                            recompute::none>;
  using Z2 = weft::strategy<mesh<tp<1>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<2>,
                            recompute::none>;
  expect_every_rank_says(errors_of<Z1>(2, {.gradient_sync = optim::gradient_sync::every}),
                         "zero<1> keeps whole gradients");
  weft::strategy_config c{.gradient_sync = optim::gradient_sync::every};
  c.optimizer.bucket_elements = 1000;
  expect_every_rank_says(errors_of<Z2>(2, c), "leave optimizer.bucket_elements 0 (or 1), not 1000");
}

// The strategy trains in float and scales no loss: a loss scale would shrink every update.
TEST(strategy_errors, loss_scaling_asked_of_a_float_strategy) {
  using S = weft::strategy<mesh<tp<1>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<1>,
                           recompute::none>;
  weft::strategy_config c{.micro_batch = 2};
  c.optimizer.loss_scaling = true;
  expect_every_rank_says(errors_of<S>(2, c),
                         "optimizer.loss_scaling: the strategy trains in float");
}

TEST(strategy_errors, heads_that_do_not_divide_over_tp) {
  using S = weft::strategy<mesh<tp<3>, pp<1>, dp<1>>, pipeline::one_f_one_b, optim::zero<0>,
                           recompute::none>;
  expect_every_rank_says(errors_of<S>(3, {}),
                         "4 heads do not divide over a tensor-parallel group of 3");
}

TEST(strategy_errors, a_tensor_parallel_group_across_nodes) {
  using S = weft::strategy<mesh<tp<2>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<0>,
                           recompute::none>;
  // 4 nodes of one device: every TP pair spans two nodes.
  expect_every_rank_says(errors_of<S>(4, {.cluster = weft::topology::parse("4x1")}), "tp");
}

TEST(strategy_errors, a_train_step_with_the_wrong_batch) {
  using S = weft::strategy<mesh<tp<1>, pp<1>, dp<1>>, pipeline::one_f_one_b, optim::zero<0>,
                           recompute::none>;
  std::string what;
  weft::local::run(1, [&](weft::local::communicator& world) {
    auto t = S::make(world, {.model = ts::shape, .global_batch = ts::global_batch}, ts::sgd_rule);
    const auto b = ts::batch_of(0, 2);
    try {
      (void)t->train_step(b.ids, b.targets);
    } catch (const weft::error& e) {
      what = e.what();
    }
  });
  EXPECT_NE(what.find("16 ids and 16 targets, expected global_batch x seq = 64"), std::string::npos)
      << what;
}

// --- layout strings ---------------------------------------------------------------------------

TEST(pipeline_layout, parses_megatron_style_strings) {
  EXPECT_EQ(pipeline::parse_layout("Et*3|t*2|t*2|tL"), (std::vector<int>{3, 2, 2, 1}));
  EXPECT_EQ(pipeline::parse_layout("E|(tt|)*3tL"), (std::vector<int>{0, 2, 2, 2, 1}));
  EXPECT_EQ(pipeline::parse_layout(" t | t t |L "), (std::vector<int>{1, 2, 0}));
  EXPECT_EQ(pipeline::even_layout(8, 4), (std::vector<int>{2, 2, 2, 2}));
}

TEST(pipeline_layout, refuses_bad_strings_naming_the_place) {
  const auto says = [](const char* text, const char* needle) {
    try {
      (void)pipeline::parse_layout(text);
      ADD_FAILURE() << "'" << text << "' parsed";
    } catch (const weft::error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << text << ": " << e.what();
    }
  };
  says("t|Et", "'E' may only open the first stage");
  says("tL|t", "'L' must close the last stage");
  says("t*0", "a count of at least 1");
  says("tx", "unexpected 'x'");
  says("(t|*2", "'(' without ')'");
  says("t)", "')' without '('");
  says("(t)", "must be followed by '*N'");
  says("((((((((((((((((((t)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2)*2",
       "nested too deep");
  says("((t)*1000)*1000000", "too long");
  says("", "empty");
}

} // namespace
