// The simulator's memory of weft's own host trainer (weft::sim::host_memory_of) beside what the
// trainer counted (trainer->memory()), rank by rank, for the same model and layout: weights,
// gradients, optimizer state and master weights to the byte, the gathered units and the gradient
// buckets at their peak too, and the peak activations (asked within 5%; they agree to the byte).
// The layouts cover TP 1-2, PP 1-2 (1F1B, GPipe and interleaved), DP 1-4, ZeRO 0-3, every recompute
// policy, sequence parallelism on and off, GPT and Llama.
//
// The simulator knows the model only from its dimensions and weft's layer and bucket rules
// (sim/host.hpp); the trainer's account is what its optimizer allocated and its stages stashed.
#include <weft/layer/llama.hpp>
#include <weft/sim/host.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "strategy_support.hpp"

namespace {

namespace ts = weft::test::strategy;
namespace wl = weft::layer;
namespace sim = weft::sim;
using weft::dp;
using weft::mesh;
using weft::pp;
using weft::tp;
namespace recompute = wl::recompute;
namespace pipeline = weft::pipeline;
namespace optim = weft::optim;

constexpr wl::gpt_config gpt{
    .vocab = 61, .hidden = 32, .heads = 4, .ffn = 48, .seq = 8, .layers = 4};
constexpr wl::llama_config llama{
    .vocab = 61, .hidden = 32, .heads = 4, .kv_heads = 2, .ffn = 40, .seq = 8, .layers = 4};

template <class Schedule>
constexpr pipeline::schedule_kind kind_of() {
  if constexpr (std::is_same_v<Schedule, pipeline::gpipe>) {
    return pipeline::schedule_kind::gpipe;
  } else if constexpr (std::is_same_v<Schedule, pipeline::one_f_one_b>) {
    return pipeline::schedule_kind::one_f_one_b;
  } else {
    return pipeline::schedule_kind::interleaved;
  }
}

template <class Recompute>
constexpr sim::recompute recompute_of() {
  if constexpr (std::is_same_v<Recompute, recompute::none>) {
    return sim::recompute::none;
  } else if constexpr (std::is_same_v<Recompute, recompute::selective>) {
    return sim::recompute::selective;
  } else {
    return sim::recompute::full;
  }
}

sim::host_model host_of(const wl::gpt_config& c) {
  return {.family = sim::host_family::gpt,
          .vocab = c.vocab,
          .hidden = c.hidden,
          .heads = c.heads,
          .ffn = c.ffn,
          .seq = c.seq,
          .layers = c.layers,
          .tied = c.tie_embeddings};
}
sim::host_model host_of(const wl::llama_config& c) {
  return {.family = sim::host_family::llama,
          .vocab = c.vocab,
          .hidden = c.hidden,
          .heads = c.heads,
          .kv_heads = c.kv_heads,
          .ffn = c.ffn,
          .seq = c.seq,
          .layers = c.layers,
          .tied = c.tie_embeddings};
}

// Trains two steps with S on `model` and compares every rank's account with the prediction.
// gradient_sync every: the gradient buckets are predicted as a bound (host.hpp), the rest exactly.
template <class Mesh, class Schedule, class Sharding, class Recompute, class SP, class Model>
void expect_predicted(const typename Model::config& model, std::size_t micro_batch,
                      std::size_t global_batch,
                      optim::gradient_sync sync = optim::gradient_sync::last) {
  using S = weft::strategy<Mesh, Schedule, Sharding, Recompute, SP, Model>;
  const sim::host_layout layout{.tp = S::tp_size,
                                .pp = S::pp_size,
                                .dp = S::dp_size,
                                .chunks = S::chunks,
                                .schedule = kind_of<Schedule>(),
                                .micro_batch = static_cast<int>(micro_batch),
                                .global_batch = static_cast<int>(global_batch),
                                .zero = Sharding::stage,
                                .recomputation = recompute_of<Recompute>(),
                                .sequence_parallel = SP::enabled,
                                .gradient_sync = sync};
  const char* recompute_name = layout.recomputation == sim::recompute::none        ? "none"
                               : layout.recomputation == sim::recompute::selective ? "selective"
                                                                                   : "full";
  const std::string what =
      std::string(sim::name_of(host_of(model).family)) + " " + std::to_string(S::tp_size) + "x" +
      std::to_string(S::pp_size) + "x" + std::to_string(S::dp_size) + " zero<" +
      std::to_string(Sharding::stage) + "> V=" + std::to_string(S::chunks) + " " + recompute_name +
      (SP::enabled ? " SP" : "") + (sync == optim::gradient_sync::every ? " every" : "");
  std::mutex mu;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t = S::make(world,
                     {.model = model,
                      .micro_batch = micro_batch,
                      .global_batch = global_batch,
                      .gradient_sync = sync},
                     ts::adamw_rule);
    for (int s = 0; s < 2; ++s) {
      const auto b = ts::batch_of(s, global_batch, {.vocab = model.vocab, .seq = model.seq});
      (void)t->train_step(b.ids, b.targets);
    }
    const weft::memory_account got = t->memory();
    const auto& c = t->comms().coord();
    const sim::host_memory want = sim::host_memory_of(host_of(model), layout, c.pp, c.tp);
    const std::string where = what + ", rank " + std::to_string(world.rank());
    std::lock_guard lock(mu);
    EXPECT_EQ(got.weights.peak, want.weights) << where;
    EXPECT_EQ(got.gradients.peak, want.gradients) << where;
    EXPECT_EQ(got.optimizer_state.peak, want.optimizer_state) << where;
    EXPECT_EQ(got.master_weights.peak, want.master_weights) << where;
    EXPECT_EQ(got.gathered_weights.peak, want.gathered_weights) << where;
    if (sync == optim::gradient_sync::every) {
      EXPECT_LE(got.gradient_buckets.peak, want.gradient_buckets) << where;
      EXPECT_GT(got.gradient_buckets.peak, 0u) << where;
    } else {
      EXPECT_EQ(got.gradient_buckets.peak, want.gradient_buckets) << where;
    }
    EXPECT_TRUE(got.activations_counted) << where;
    // The issue asks for 5%; the simulator walks the schedule with each stash's bytes, so it is
    // exact.
    EXPECT_EQ(got.activations.peak, want.activations) << where;
  });
}

using none = recompute::none;
using selective = recompute::selective;
using full = recompute::full;
using no_sp = wl::no_sequence_parallel;
using sp = wl::sequence_parallel;

TEST(sim_memory, one_rank_and_data_parallel) {
  expect_predicted<mesh<tp<1>, pp<1>, dp<1>>, pipeline::one_f_one_b, optim::zero<0>, none, no_sp,
                   wl::gpt_model>(gpt, 2, 4);
  expect_predicted<mesh<tp<1>, pp<1>, dp<4>>, pipeline::gpipe, optim::zero<3>, none, no_sp,
                   wl::llama_model>(llama, 1, 8);
  expect_predicted<mesh<tp<1>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<2>, full, no_sp,
                   wl::gpt_model>(gpt, 2, 8);
}

TEST(sim_memory, tensor_parallel_with_and_without_sequence_parallelism) {
  expect_predicted<mesh<tp<2>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<1>, selective, sp,
                   wl::gpt_model>(gpt, 2, 8);
  expect_predicted<mesh<tp<2>, pp<1>, dp<1>>, pipeline::one_f_one_b, optim::zero<0>, none, no_sp,
                   wl::llama_model>(llama, 2, 4);
}

TEST(sim_memory, pipelines_1f1b_and_interleaved) {
  expect_predicted<mesh<tp<1>, pp<2>, dp<2>>, pipeline::interleaved<2>, optim::zero<2>, full, no_sp,
                   wl::llama_model>(llama, 1, 8);
  expect_predicted<mesh<tp<2>, pp<2>, dp<1>>, pipeline::interleaved<2>, optim::zero<3>, selective,
                   sp, wl::gpt_model>(gpt, 1, 4);
  expect_predicted<mesh<tp<2>, pp<2>, dp<2>>, pipeline::one_f_one_b, optim::zero<1>, full, sp,
                   wl::llama_model>(llama, 1, 8);
  expect_predicted<mesh<tp<1>, pp<2>, dp<4>>, pipeline::one_f_one_b, optim::zero<3>, selective,
                   no_sp, wl::gpt_model>(gpt, 1, 16);
}

// gradient_sync every: zero<2> in a bucket per unit (each padded to a multiple of DP: the
// weights, gradients and state change with it), the buckets held bounded; tied units whole.
TEST(sim_memory, gradient_sync_every) {
  constexpr auto every = optim::gradient_sync::every;
  // DP 3: a block's 7,504 elements pad to 7,506, where one bucket of the whole pads by 2 only.
  expect_predicted<mesh<tp<1>, pp<1>, dp<3>>, pipeline::one_f_one_b, optim::zero<2>, full, no_sp,
                   wl::gpt_model>(gpt, 1, 6, every);
  expect_predicted<mesh<tp<1>, pp<2>, dp<2>>, pipeline::interleaved<2>, optim::zero<3>, none, no_sp,
                   wl::llama_model>(llama, 1, 8, every);
  wl::gpt_config tied = gpt;
  tied.tie_embeddings = true;
  expect_predicted<mesh<tp<2>, pp<2>, dp<2>>, pipeline::one_f_one_b, optim::zero<2>, selective, sp,
                   wl::gpt_model>(tied, 1, 8, every);
}

} // namespace
