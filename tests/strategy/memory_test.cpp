// The strategy's allocation account (trainer::memory()): zero<3> holds a shard of the parameters
// plus the units (blocks, embedding stage, head stage) in use and prefetched, as FSDP does; the
// other stages hold what the ZeRO paper says; the activations are the stashes of the
// microbatches in flight, which the recompute policy and the schedule decide.
//
// The bounds here are computed from the parameters' shapes (every rank's tensors, grouped by the
// unit their name says) and from the model's dimensions; the account is what the optimizer and
// the pipeline stages counted while they allocated.
#include <weft/layer/llama.hpp>
#include <weft/optim/optimizers.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "strategy_support.hpp"

namespace {

namespace ts = weft::test::strategy;
namespace wl = weft::layer;
using weft::dp;
using weft::mesh;
using weft::pp;
using weft::tp;
namespace recompute = wl::recompute;
namespace pipeline = weft::pipeline;
namespace optim = weft::optim;

constexpr wl::gpt_config gpt_shape{
    .vocab = 64, .hidden = 32, .heads = 4, .ffn = 64, .seq = 8, .layers = 8};
constexpr wl::llama_config llama_shape{
    .vocab = 64, .hidden = 32, .heads = 4, .kv_heads = 2, .ffn = 48, .seq = 8, .layers = 8};

template <class Mesh, class Sharding, class Model, class Recompute = recompute::none,
          class Schedule = pipeline::one_f_one_b, class SP = wl::no_sequence_parallel>
using strategy_of = weft::strategy<Mesh, Schedule, Sharding, Recompute, SP, Model>;

// A rank's parameters (elements) by unit: "embedding", "head", "block<i>".
template <class Snapshot>
std::map<std::string, std::size_t> elements_by_unit(const Snapshot& ps) {
  std::map<std::string, std::size_t> units;
  for (const auto& q : ps)
    units[q.name.substr(0, q.name.find('.'))] += q.value.size();
  return units;
}

struct measured {
  weft::memory_account account;
  std::map<std::string, std::size_t> units;
  int dp = 1;
};

// Trains `steps` steps and returns every rank's account and units, by world rank.
template <class S>
std::vector<measured> measure(const typename S::config& cfg, int steps = 2,
                              std::vector<double>* losses = nullptr) {
  std::vector<measured> out(static_cast<std::size_t>(S::size));
  std::mutex mu;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t = S::make(world, cfg, ts::adamw_rule);
    std::vector<double> mine;
    for (int s = 0; s < steps; ++s) {
      const auto b =
          ts::batch_of(s, cfg.global_batch, {.vocab = cfg.model.vocab, .seq = cfg.model.seq});
      mine.push_back(t->train_step(b.ids, b.targets));
    }
    const auto units = elements_by_unit(t->parameter_values());
    std::lock_guard lock(mu);
    out[static_cast<std::size_t>(world.rank())] = {t->memory(), units, t->comms().dp().size()};
    if (losses != nullptr && world.rank() == 0) *losses = mine;
  });
  return out;
}

// zero<3>: the most parameter bytes a rank held at once are at most its shard (P / DP, each
// unit padded to a multiple of DP) plus (1 + prefetch) of its largest units, gathered.
// `many_units`: the rank has enough units that the shard plus the gathered ones are less than all.
void expect_sharded_parameters(const std::vector<measured>& ranks, int prefetch,
                               const std::string& what, bool many_units = true) {
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& m = ranks[r];
    const auto n = static_cast<std::size_t>(m.dp);
    std::size_t shard = 0, largest = 0, all = 0;
    for (const auto& [name, e] : m.units) {
      shard += (e + n - 1) / n;
      largest = std::max(largest, (e + n - 1) / n * n);
      all += e;
    }
    const std::size_t bound = 4 * (shard + static_cast<std::size_t>(1 + prefetch) * largest);
    EXPECT_EQ(m.account.weights.peak, 4 * shard) << what << " rank " << r;
    EXPECT_LE(m.account.peak_parameters(), bound) << what << " rank " << r;
    EXPECT_GT(m.account.gathered_weights.peak, 0u) << what << " rank " << r;
    EXPECT_LE(m.account.gathered_weights.peak, 4 * static_cast<std::size_t>(1 + prefetch) * largest)
        << what << " rank " << r;
    // Under the whole: the point of zero<3>.
    if (many_units) {
      EXPECT_LT(m.account.peak_parameters(), 4 * all) << what << " rank " << r;
    }
    EXPECT_EQ(m.account.gathered_weights.current, 0u)
        << what << " rank " << r << ": nothing stays gathered";
  }
}

TEST(memory_strategy, zero3_holds_a_shard_and_the_units_in_use_gpt_and_llama) {
  using dp4 = mesh<tp<1>, pp<1>, dp<4>>;
  using tp2dp2 = mesh<tp<2>, pp<1>, dp<2>>;
  expect_sharded_parameters(measure<strategy_of<dp4, optim::zero<3>, wl::gpt_model>>(
                                {.model = gpt_shape, .micro_batch = 1, .global_batch = 8}),
                            1, "gpt 1x1x4");
  expect_sharded_parameters(measure<strategy_of<tp2dp2, optim::zero<3>, wl::gpt_model>>(
                                {.model = gpt_shape, .micro_batch = 1, .global_batch = 8}),
                            1, "gpt 2x1x2");
  expect_sharded_parameters(measure<strategy_of<dp4, optim::zero<3>, wl::llama_model>>(
                                {.model = llama_shape, .micro_batch = 1, .global_batch = 8}),
                            1, "llama 1x1x4");
  expect_sharded_parameters(measure<strategy_of<tp2dp2, optim::zero<3>, wl::llama_model>>(
                                {.model = llama_shape, .micro_batch = 1, .global_batch = 8}),
                            1, "llama 2x1x2");
  // A vocabulary large enough that the embedding and head stages are the largest units.
  constexpr wl::gpt_config wide{
      .vocab = 1024, .hidden = 32, .heads = 4, .ffn = 64, .seq = 8, .layers = 8};
  expect_sharded_parameters(measure<strategy_of<dp4, optim::zero<3>, wl::gpt_model>>(
                                {.model = wide, .micro_batch = 1, .global_batch = 8}),
                            1, "gpt 1x1x4, vocabulary 1024");
  // With pipeline stages and interleaving: a rank's units are its chunks' blocks.
  expect_sharded_parameters(
      measure<strategy_of<mesh<tp<1>, pp<2>, dp<2>>, optim::zero<3>, wl::gpt_model,
                          recompute::selective, pipeline::interleaved<2>>>(
          {.model = gpt_shape, .micro_batch = 1, .global_batch = 8}),
      1, "gpt 1x2x2 interleaved");
}

// HSDP: zero<3> inside groups of 2 DP ranks, replicated across them. The same losses as one
// rank, and a shard of half the units.
TEST(memory_strategy, hybrid_zero3_shards_inside_the_group_and_trains_as_one_rank) {
  using S = weft::strategy<mesh<tp<1>, pp<2>, dp<4>>, pipeline::one_f_one_b,
                           optim::hybrid<optim::zero<3>, optim::zero<0>>, recompute::none>;
  const auto want = ts::reference_losses(ts::adamw_rule);
  std::vector<double> got;
  std::vector<weft::memory_account> accounts(S::size);
  std::vector<std::map<std::string, std::size_t>> units(S::size);
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    weft::strategy_config c{.micro_batch = 1};
    c.optimizer.inner_size = 2;
    auto losses = ts::strategy_losses<S>(world, c, ts::adamw_rule, 3);
    c.model = ts::shape;
    c.global_batch = ts::global_batch;
    auto t = S::make(world, c, ts::adamw_rule);
    const auto b = ts::batch_of(0);
    (void)t->train_step(b.ids, b.targets);
    units[static_cast<std::size_t>(world.rank())] = elements_by_unit(t->parameter_values());
    accounts[static_cast<std::size_t>(world.rank())] = t->memory();
    if (world.rank() == 0) got = losses;
  });
  ts::expect_same_losses(got, std::vector<double>(want.begin(), want.begin() + 3),
                         "hybrid<zero<3>, zero<0>> 1x2x4");
  std::vector<measured> ranks;
  for (int r = 0; r < S::size; ++r)
    ranks.push_back({accounts[static_cast<std::size_t>(r)], units[static_cast<std::size_t>(r)], 2});
  // (2 blocks a stage, each a third of the stage's parameters: the shard and 2 units are all of
  // them)
  expect_sharded_parameters(ranks, 1, "hybrid 1x2x4, groups of 2", false);
}

TEST(memory_strategy, prefetch_depth_bounds_the_gathered_units_and_not_the_result) {
  using S = strategy_of<mesh<tp<1>, pp<1>, dp<4>>, optim::zero<3>, wl::llama_model>;
  std::vector<double> first;
  for (int depth : {0, 1, 2}) {
    std::vector<double> losses;
    const auto ranks = measure<S>(
        {.model = llama_shape, .micro_batch = 1, .global_batch = 8, .prefetch = depth}, 3, &losses);
    expect_sharded_parameters(ranks, depth, "prefetch " + std::to_string(depth));
    // Blocks are the largest units here and run one after another: with depth d, d + 1 of them
    // are gathered at once.
    std::size_t block = 0;
    for (const auto& [name, e] : ranks[0].units) {
      if (name.rfind("block", 0) == 0) block = std::max(block, (e + 3) / 4 * 4);
    }
    EXPECT_GE(ranks[0].account.gathered_weights.peak,
              4 * static_cast<std::size_t>(depth + 1) * block)
        << "prefetch " << depth;
    if (first.empty()) {
      first = losses;
    } else {
      EXPECT_EQ(losses, first) << "prefetch " << depth << " trains differently from prefetch 0";
    }
  }
}

TEST(memory_strategy, zero_stages_hold_what_the_zero_paper_says) {
  // One bucket (the default holds 40M elements): P padded to a multiple of the shard group.
  const auto check = [](const std::vector<measured>& ranks, int stage, const std::string& what) {
    for (const auto& m : ranks) {
      const auto n = static_cast<std::size_t>(stage == 0 ? 1 : m.dp);
      std::size_t p = 0;
      for (const auto& [name, e] : m.units)
        p += e;
      const std::size_t padded = (p + n - 1) / n * n, shard = padded / n;
      EXPECT_EQ(m.account.weights.current, 4 * padded) << what;
      EXPECT_EQ(m.account.gradients.current, 4 * (stage >= 2 ? shard : padded)) << what;
      EXPECT_EQ(m.account.optimizer_state.current, 4 * 2 * optim::slot_stride(shard)) << what;
      EXPECT_EQ(m.account.master_weights.current, 0u) << what;
      EXPECT_EQ(m.account.gathered_weights.peak, 0u) << what;
      // zero<2>: the bucket the backward writes, full size, until it is reduce-scattered.
      EXPECT_EQ(m.account.gradient_buckets.peak, stage >= 2 ? 4 * padded : 0u) << what;
      EXPECT_EQ(m.account.gradient_buckets.current, 0u) << what;
    }
  };
  using M = mesh<tp<2>, pp<2>, dp<2>>;
  const strategy_of<M, optim::zero<0>, wl::gpt_model>::config cfg{
      .model = gpt_shape, .micro_batch = 1, .global_batch = 8};
  check(measure<strategy_of<M, optim::zero<0>, wl::gpt_model>>(cfg), 0, "zero<0>");
  check(measure<strategy_of<M, optim::zero<1>, wl::gpt_model>>(cfg), 1, "zero<1>");
  check(measure<strategy_of<M, optim::zero<2>, wl::gpt_model>>(cfg), 2, "zero<2>");
}

// zero<2> over 4 microbatches: gradient_sync last holds the whole gradients (one bucket of every
// unit) until the step's last backward; every holds one unit's bucket at a time (reductions
// inline, overlap off), the largest unit padded to a multiple of DP, and trains the same model.
// With overlap, at most one reduction runs behind the backward: two units' buckets at most.
TEST(memory_strategy, zero2_reducing_every_microbatch_holds_one_unit_of_gradients) {
  using M = mesh<tp<1>, pp<1>, dp<2>>;
  using S = strategy_of<M, optim::zero<2>, wl::gpt_model>;
  S::config cfg{.model = gpt_shape, .micro_batch = 1, .global_batch = 8};
  cfg.optimizer.overlap = false;
  std::vector<double> last_losses, every_losses;
  const auto last = measure<S>(cfg, 2, &last_losses);
  cfg.gradient_sync = optim::gradient_sync::every;
  const auto every = measure<S>(cfg, 2, &every_losses);
  cfg.optimizer.overlap = true;
  const auto overlapped = measure<S>(cfg, 2);
  for (std::size_t r = 0; r < every.size(); ++r) {
    const auto n = static_cast<std::size_t>(every[r].dp);
    std::size_t all = 0, largest = 0;
    for (const auto& [name, e] : every[r].units) {
      all += e;
      largest = std::max(largest, (e + n - 1) / n * n);
    }
    EXPECT_EQ(last[r].account.gradient_buckets.peak, 4 * ((all + n - 1) / n * n)) << "rank " << r;
    EXPECT_EQ(every[r].account.gradient_buckets.peak, 4 * largest) << "rank " << r;
    EXPECT_LE(overlapped[r].account.gradient_buckets.peak, 2 * 4 * largest) << "rank " << r;
    EXPECT_LT(4 * largest, 4 * all / 2) << "the model should have several units";
    EXPECT_EQ(every[r].account.gradient_buckets.current, 0u);
  }
  ASSERT_EQ(every_losses.size(), last_losses.size());
  for (std::size_t s = 0; s < every_losses.size(); ++s)
    EXPECT_NEAR(every_losses[s], last_losses[s], 1e-5 * std::abs(last_losses[s])) << "step " << s;
}

// Full recompute keeps each block's input (tokens x hidden floats) and the embedding stage its
// token ids; a pipeline of one stage runs 1F1B one microbatch at a time and GPipe all of them
// before the first backward.
TEST(memory_strategy, activations_are_the_stashes_in_flight) {
  constexpr std::size_t micro = 2, batch = 8, tokens = micro * gpt_shape.seq;
  const std::size_t per_microbatch = gpt_shape.layers * tokens * gpt_shape.hidden * 4 + tokens * 4;
  using one = mesh<tp<1>, pp<1>, dp<1>>;
  const auto full_1f1b = measure<strategy_of<one, optim::zero<0>, wl::gpt_model, recompute::full>>(
      {.model = gpt_shape, .micro_batch = micro, .global_batch = batch});
  EXPECT_EQ(full_1f1b[0].account.activations.peak, per_microbatch);
  EXPECT_EQ(full_1f1b[0].account.activations.current, 0u);
  const auto full_gpipe =
      measure<strategy_of<one, optim::zero<0>, wl::gpt_model, recompute::full, pipeline::gpipe>>(
          {.model = gpt_shape, .micro_batch = micro, .global_batch = batch});
  EXPECT_EQ(full_gpipe[0].account.activations.peak, batch / micro * per_microbatch);
  // Keeping more costs more: none keeps the attention probabilities, selective drops them.
  const auto none = measure<strategy_of<one, optim::zero<0>, wl::gpt_model, recompute::none>>(
      {.model = gpt_shape, .micro_batch = micro, .global_batch = batch});
  const auto selective =
      measure<strategy_of<one, optim::zero<0>, wl::gpt_model, recompute::selective>>(
          {.model = gpt_shape, .micro_batch = micro, .global_batch = batch});
  const std::size_t probabilities =
      gpt_shape.layers * micro * gpt_shape.heads * gpt_shape.seq * gpt_shape.seq * 4;
  EXPECT_EQ(none[0].account.activations.peak - selective[0].account.activations.peak,
            probabilities);
  EXPECT_GT(selective[0].account.activations.peak, full_1f1b[0].account.activations.peak);
}

// The layers' other host buffers (the workspace) are allocated once and reused: the same after
// every step, whatever the recompute policy; full recompute frees what its backward rebuilt, so
// its workspace is no larger than selective's.
TEST(memory_strategy, the_workspace_does_not_grow_from_step_to_step) {
  const auto workspace_per_step = [](auto tag) {
    using S = decltype(tag);
    std::vector<std::size_t> per_step;
    weft::local::run(S::size, [&](weft::local::communicator& world) {
      auto t =
          S::make(world, {.model = gpt_shape, .micro_batch = 1, .global_batch = 8}, ts::adamw_rule);
      for (int s = 0; s < 4; ++s) {
        const auto b = ts::batch_of(s, 8, {.vocab = gpt_shape.vocab, .seq = gpt_shape.seq});
        (void)t->train_step(b.ids, b.targets);
        const auto m = t->memory();
        EXPECT_EQ(m.activations.current, 0u);
        if (world.rank() == 0) per_step.push_back(m.workspace.current);
      }
    });
    return per_step;
  };
  using M = mesh<tp<2>, pp<2>, dp<1>>;
  const auto full =
      workspace_per_step(strategy_of<M, optim::zero<1>, wl::gpt_model, recompute::full>{});
  const auto selective =
      workspace_per_step(strategy_of<M, optim::zero<1>, wl::gpt_model, recompute::selective>{});
  for (const auto* w : {&full, &selective}) {
    ASSERT_EQ(w->size(), 4u);
    EXPECT_GT(w->front(), 0u);
    for (std::size_t s = 1; s < w->size(); ++s)
      EXPECT_EQ((*w)[s], (*w)[1]) << "step " << s;
  }
  EXPECT_LE(full.back(), selective.back());
}

TEST(memory_strategy, prefetch_is_refused_where_it_means_nothing) {
  using S1 = strategy_of<mesh<tp<1>, pp<1>, dp<2>>, optim::zero<1>, wl::gpt_model>;
  using S3 = strategy_of<mesh<tp<1>, pp<1>, dp<2>>, optim::zero<3>, wl::gpt_model>;
  const auto fails = [](auto make, const std::string& says) {
    weft::local::run(2, [&](weft::local::communicator& world) {
      try {
        make(world);
        ADD_FAILURE() << "no error";
      } catch (const weft::error& e) {
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      }
    });
  };
  fails([](auto& w) { (void)S1::make(w, {.model = gpt_shape, .global_batch = 2, .prefetch = 1}); },
        "only zero<3>");
  fails([](auto& w) { (void)S3::make(w, {.model = gpt_shape, .global_batch = 2, .prefetch = -1}); },
        "prefetch must be 0 or more");
}

} // namespace
