// weft::strategy over MPI processes (one mesh rank per process): for each mesh of the issue
// (1x1x1, 2x1x1, 1x2x1, 1x1x2, 2x2x2, 2x2x1 with V = 2, 1x4x2 with an uneven layout; TP x PP x
// DP) and each ZeRO stage, the per-step losses of 20 SGD steps (and for 2x2x2 also AdamW) equal
// those of the same model trained on one rank on the whole batch (strategy_support.hpp), within
// 1e-5 relative, on every process of the mesh; so do sequence parallelism, tied embeddings and
// gradient clipping; and the Llama model at 2x2x2, TP 4 over two kv heads, with SP, uneven.
// strategy_test.cpp and models_test.cpp run the same on threads.
//
// ctest starts it with 8 processes. A mesh of N < 8 ranks runs on the first N processes (a split
// of the world); the others wait for them in a barrier on the world, which sleeps instead of
// spinning, so the waiting processes leave the cores to the working ones.
#include <weft/comm/transport/mpi.hpp>
#include <weft/layer/llama.hpp>
#include <weft/pipeline/layout.hpp>
#include <weft/strategy.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "comm/transport/mpi/mpi_support.hpp"
#include "strategy/strategy_support.hpp"

namespace {

namespace ts = weft::test::strategy;
using weft::dp;
using weft::mesh;
using weft::pp;
using weft::tp;
using weft::layer::no_sequence_parallel;
namespace recompute = weft::layer::recompute;
namespace pipeline = weft::pipeline;
namespace optim = weft::optim;

// The world the cases split and wait on. Its deadline covers the longest case a waiting process
// sits out (8 processes on 2 cores under a sanitizer); the meshes' own communicators keep the
// shorter weft::test::mpi_test_timeout, so a mesh that stalls still fails within a minute.
weft::mpi::communicator& waiting_world() {
  static weft::mpi::communicator w =
      weft::mpi::world({.timeout = std::chrono::minutes(4), .topology = {}});
  return w;
}

// The single-rank reference, computed once per process, rule and tying, by the first case that
// needs it (and only on the processes that run such a case).
template <class Rule>
const std::vector<double>& reference(const Rule& rule, bool tied) {
  if (tied) {
    static const std::vector<double> t = ts::reference_losses(rule, true);
    return t;
  }
  static const std::vector<double> r = ts::reference_losses(rule);
  return r;
}

// One mesh's check, on the processes of `group`.
template <class S, class Rule>
void check_on(weft::mpi::communicator& group, const weft::strategy_config& config,
              const std::string& what, const Rule& rule) {
  ASSERT_EQ(group.size(), S::size);
  const double bound = config.optimizer.max_grad_norm;
  const std::vector<double> want =
      bound > 0 ? ts::reference_losses(rule, config.model.tie_embeddings, 1, ts::steps, bound)
                : reference(rule, config.model.tie_embeddings);
  const std::vector<double> got = ts::strategy_losses<S>(group, config, rule);
  ts::expect_same_losses(got, want,
                         what + " " + std::string(Rule::name) + " rank " +
                             std::to_string(group.rank()) + " of " + std::to_string(group.size()));
}

// check(group) on the first n processes; the others wait until they are done. Every process
// reaches the barrier, whatever the check did (a failed assertion, a weft::error), so the world
// stays in step and the next case runs.
template <class Check>
void on_first_processes(int n, const std::string& what, Check check) {
  auto& world = waiting_world();
  ASSERT_GE(world.size(), n) << what << " needs " << n << " processes";
  const bool member = world.rank() < n;
  weft::mpi::communicator group = world.split(member ? 0 : 1, world.rank());
  if (member) {
    group.set_timeout(weft::test::mpi_test_timeout);
    try {
      check(group);
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << " on rank " << group.rank() << ": " << e.what();
    }
  }
  world.barrier();
}

// The strategy S on the first S::size processes.
template <class S, class Rule = optim::sgd>
void expect_matches(const weft::strategy_config& config, const std::string& what,
                    const Rule& rule = ts::sgd_rule) {
  on_first_processes(S::size, what, [&](weft::mpi::communicator& group) {
    check_on<S>(group, config, what, rule);
  });
}

// --- Llama: the same checks against layer::llama on one rank
// (tests/strategy/models_test.cpp on threads)
constexpr weft::layer::llama_config llama_shape{.vocab = 53,
                                                .hidden = 16,
                                                .heads = 4,
                                                .kv_heads = 2,
                                                .ffn = 24,
                                                .seq = 8,
                                                .layers = 4,
                                                .rope_theta = 10000};

template <class Mesh, class Sharding, class Schedule = pipeline::one_f_one_b,
          class Recompute = recompute::none, class SP = no_sequence_parallel>
void expect_llama_matches(weft::basic_strategy_config<weft::layer::llama_config> config,
                          const std::string& what) {
  using S = weft::strategy<Mesh, Schedule, Sharding, Recompute, SP, weft::layer::llama_model>;
  static const std::vector<double> want = ts::reference_losses_of<weft::layer::llama_model>(
      llama_shape, [](int s) { return ts::batch_of(s); }, ts::adamw_rule);
  on_first_processes(S::size, what, [&](weft::mpi::communicator& group) {
    config.model = llama_shape;
    config.global_batch = ts::global_batch;
    auto trainer = S::make(group, config, ts::adamw_rule);
    std::vector<double> got;
    for (int s = 0; s < ts::steps; ++s) {
      const auto b = ts::batch_of(s);
      got.push_back(trainer->train_step(b.ids, b.targets));
    }
    ts::expect_same_losses(got, want, what + " rank " + std::to_string(group.rank()));
  });
}

template <class Mesh, class Schedule, class Rule = optim::sgd>
void every_zero_stage(const weft::strategy_config& config, const std::string& what,
                      const Rule& rule = ts::sgd_rule) {
  using R = recompute::none;
  using SP = no_sequence_parallel;
  expect_matches<weft::strategy<Mesh, Schedule, optim::zero<0>, R, SP>>(config, what + " zero<0>",
                                                                        rule);
  expect_matches<weft::strategy<Mesh, Schedule, optim::zero<1>, R, SP>>(config, what + " zero<1>",
                                                                        rule);
  expect_matches<weft::strategy<Mesh, Schedule, optim::zero<2>, R, SP>>(config, what + " zero<2>",
                                                                        rule);
  expect_matches<weft::strategy<Mesh, Schedule, optim::zero<3>, R, SP>>(config, what + " zero<3>",
                                                                        rule);
}

TEST(StrategyMpi, Runs8Processes) {
  // The cases below assume the world ctest starts; with fewer processes they would fail anyway.
  EXPECT_EQ(waiting_world().size(), 8) << "run under mpirun -n 8";
}

TEST(StrategyMpi, OneRankMatchesTheReference) {
  every_zero_stage<mesh<tp<1>, pp<1>, dp<1>>, pipeline::one_f_one_b>({}, "1x1x1");
}

TEST(StrategyMpi, TensorParallel2Matches) {
  every_zero_stage<mesh<tp<2>, pp<1>, dp<1>>, pipeline::one_f_one_b>({.micro_batch = 2}, "2x1x1");
}

TEST(StrategyMpi, PipelineParallel2Matches) {
  every_zero_stage<mesh<tp<1>, pp<2>, dp<1>>, pipeline::one_f_one_b>({.micro_batch = 2}, "1x2x1");
}

TEST(StrategyMpi, DataParallel2Matches) {
  every_zero_stage<mesh<tp<1>, pp<1>, dp<2>>, pipeline::one_f_one_b>({.micro_batch = 2}, "1x1x2");
}

TEST(StrategyMpi, Interleaved2x2x1WithTwoChunksMatches) {
  every_zero_stage<mesh<tp<2>, pp<2>, dp<1>>, pipeline::interleaved<2>>({.micro_batch = 2},
                                                                        "2x2x1 V=2");
}

TEST(StrategyMpi, ThreeD2x2x2Matches) {
  every_zero_stage<mesh<tp<2>, pp<2>, dp<2>>, pipeline::one_f_one_b>({.micro_batch = 1}, "2x2x2");
  // AdamW's step does not see a wrong gradient scale, but it does see a wrong gradient.
  every_zero_stage<mesh<tp<2>, pp<2>, dp<2>>, pipeline::one_f_one_b>({.micro_batch = 1}, "2x2x2",
                                                                     ts::adamw_rule);
}

TEST(StrategyMpi, UnevenLayout1x4x2Matches) {
  // Two blocks on the first stage with the embedding, none on the last (only the loss).
  every_zero_stage<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b>(
      {.micro_batch = 1, .layout = pipeline::parse_layout("Et*2|t|t|L")}, "1x4x2 uneven");
}

// The paths with communication of their own: sequence parallelism (the activations split over
// the TP group) and tied embeddings (the embedding group, a split of the pipeline communicator).
TEST(StrategyMpi, SequenceParallel2x2x2Matches) {
  expect_matches<weft::strategy<mesh<tp<2>, pp<2>, dp<2>>, pipeline::interleaved<2>, optim::zero<1>,
                                recompute::selective, weft::layer::sequence_parallel>>(
      {.micro_batch = 1}, "2x2x2 V=2 SP");
}

TEST(StrategyMpi, TiedEmbeddings1x4x2Matches) {
  expect_matches<weft::strategy<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b, optim::zero<3>,
                                recompute::none>>({.model = {.tie_embeddings = true},
                                                   .micro_batch = 1,
                                                   .layout = pipeline::parse_layout("Et*2|t|t|L")},
                                                  "1x4x2 tied");
}

// Gradient clipping by the global norm: its one all-reduce spans TP, PP and DP (a split of the
// world), tensor-replicated parameters and the tied head counted once. 0.2 is under every step's
// norm (strategy_test checks that), so every step clips.
TEST(StrategyMpi, GradientClippingMatches) {
  weft::strategy_config c{.micro_batch = 1};
  c.optimizer.max_grad_norm = 0.2f;
  expect_matches<weft::strategy<mesh<tp<2>, pp<2>, dp<2>>, pipeline::one_f_one_b, optim::zero<1>,
                                recompute::none>>(c, "2x2x2 clipped");
  c.layout = pipeline::parse_layout("Et*2|t|t|L");
  c.model.tie_embeddings = true;
  expect_matches<weft::strategy<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b, optim::zero<3>,
                                recompute::none>>(c, "1x4x2 tied clipped");
}

TEST(StrategyMpi, LlamaMatches) {
  expect_llama_matches<mesh<tp<2>, pp<2>, dp<2>>, optim::zero<1>>({.micro_batch = 1},
                                                                  "llama 2x2x2 zero<1>");
  expect_llama_matches<mesh<tp<2>, pp<2>, dp<2>>, optim::zero<3>>({.micro_batch = 1},
                                                                  "llama 2x2x2 zero<3>");
  expect_llama_matches<mesh<tp<4>, pp<1>, dp<2>>, optim::zero<2>>({.micro_batch = 2},
                                                                  "llama 4x1x2 replicated kv");
  expect_llama_matches<mesh<tp<2>, pp<2>, dp<2>>, optim::zero<1>, pipeline::interleaved<2>,
                       recompute::selective, weft::layer::sequence_parallel>({.micro_batch = 1},
                                                                             "llama 2x2x2 V=2 SP");
  expect_llama_matches<mesh<tp<1>, pp<4>, dp<2>>, optim::zero<0>>(
      {.micro_batch = 1, .layout = pipeline::parse_layout("Et*2|t|t|L")}, "llama 1x4x2 uneven");
}

} // namespace
