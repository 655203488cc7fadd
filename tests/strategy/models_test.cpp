// weft::strategy training models other than its default GPT, on in-process ranks, each against
// the same model on one rank on the whole batch (strategy_support.hpp's reference: a plain
// SGD/AdamW update in double, weight decay on the tensors decays() names), within 1e-5 relative
// over 20 steps:
//   - layer::llama_model (RMSNorm, rotary grouped-query attention, SwiGLU) at 1x1x1, 2x2x2 under
//     every ZeRO stage, TP 4 with its two key/value heads replicated, an uneven 1x4x2 layout,
//     interleaving with sequence parallelism, the recompute policies, a tied head;
//   - a model whose block exists only here (a residual MLP of weft's parallel linears);
//   - loss masks: ignored targets spread unevenly over microbatches and replicas, which only the
//     global count of the counted tokens normalises right;
//   - the first step's gradients of every parameter, put together from every rank, against the
//     one-rank model's (GPT and Llama, with SP, tied, recompute, replicated kv heads).
#include <weft/comm/transport/local.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/llama.hpp>
#include <weft/pipeline/layout.hpp>
#include <weft/strategy.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "strategy/strategy_support.hpp"

namespace {

namespace ts = weft::test::strategy;
namespace wl = weft::layer;
using weft::dp;
using weft::mesh;
using weft::pp;
using weft::tp;
using wl::no_sequence_parallel;
using wl::sequence_parallel;
namespace recompute = wl::recompute;
namespace pipeline = weft::pipeline;
namespace optim = weft::optim;

// The strategy tests' vocabulary and sequence (ts::shape), four query heads sharing two key/value
// heads.
constexpr wl::llama_config llama_shape{.vocab = 53,
                                       .hidden = 16,
                                       .heads = 4,
                                       .kv_heads = 2,
                                       .ffn = 24,
                                       .seq = 8,
                                       .layers = 4,
                                       .rope_theta = 10000};

ts::batch plain_batch(int s) { return ts::batch_of(s); }

// Step s's batch with targets ignored unevenly: sequence q ignores its first (3 q + s) % 7 targets,
// and sequence 5 all of them, so every microbatch and replica counts a different number of tokens.
ts::batch masked_batch(int s) {
  ts::batch b = ts::batch_of(s);
  const std::size_t seq = ts::shape.seq;
  for (std::size_t q = 0; q < ts::global_batch; ++q) {
    const std::size_t ignored = q == 5 ? seq : (3 * q + static_cast<std::size_t>(s)) % 7;
    for (std::size_t t = 0; t < ignored; ++t)
      b.targets[q * seq + t] = -100;
  }
  return b;
}

// Every rank's losses of S; they must agree with each other and with `want`.
template <class S, class Rule, class BatchFor>
void expect_losses(typename S::config config, BatchFor batch_for, const std::vector<double>& want,
                   const std::string& what, const Rule& rule) {
  config.global_batch = ts::global_batch;
  std::vector<std::vector<double>> per_rank(S::size);
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto trainer = S::make(world, config, rule);
    auto& mine = per_rank[static_cast<std::size_t>(world.rank())];
    for (int s = 0; s < ts::steps; ++s) {
      const auto b = batch_for(s);
      mine.push_back(trainer->train_step(b.ids, b.targets));
    }
  });
  for (int r = 0; r < S::size; ++r) {
    ts::expect_same_losses(per_rank[static_cast<std::size_t>(r)], want,
                           what + " rank " + std::to_string(r));
  }
}

template <class Model, class Rule>
std::vector<double> reference(const typename Model::config& model, const Rule& rule,
                              bool masked = false) {
  auto untied = model;
  untied.tie_embeddings = false;
  return masked ? ts::reference_losses_of<Model>(untied, masked_batch, rule, model.tie_embeddings)
                : ts::reference_losses_of<Model>(untied, plain_batch, rule, model.tie_embeddings);
}

template <class Mesh, class Schedule, class Sharding, class Recompute = recompute::none,
          class SP = no_sequence_parallel>
using llama_strategy = weft::strategy<Mesh, Schedule, Sharding, Recompute, SP, wl::llama_model>;

const std::vector<double>& llama_reference() {
  static const std::vector<double> r = reference<wl::llama_model>(llama_shape, ts::adamw_rule);
  return r;
}

TEST(llama_strategy, the_reference_learns) {
  const auto& r = llama_reference();
  EXPECT_LT(r.back(), r.front() - 0.1) << r.front() << " -> " << r.back();
}

TEST(llama_strategy, one_rank_matches) {
  expect_losses<llama_strategy<mesh<tp<1>, pp<1>, dp<1>>, pipeline::one_f_one_b, optim::zero<0>>>(
      {.model = llama_shape}, plain_batch, llama_reference(), "llama 1x1x1", ts::adamw_rule);
}

TEST(llama_strategy, three_d_2x2x2_every_zero_stage_matches) {
  using M = mesh<tp<2>, pp<2>, dp<2>>;
  const weft::basic_strategy_config<wl::llama_config> c{.model = llama_shape, .micro_batch = 1};
  expect_losses<llama_strategy<M, pipeline::one_f_one_b, optim::zero<0>>>(
      c, plain_batch, llama_reference(), "llama 2x2x2 zero<0>", ts::adamw_rule);
  expect_losses<llama_strategy<M, pipeline::one_f_one_b, optim::zero<1>>>(
      c, plain_batch, llama_reference(), "llama 2x2x2 zero<1>", ts::adamw_rule);
  expect_losses<llama_strategy<M, pipeline::one_f_one_b, optim::zero<2>>>(
      c, plain_batch, llama_reference(), "llama 2x2x2 zero<2>", ts::adamw_rule);
  expect_losses<llama_strategy<M, pipeline::one_f_one_b, optim::zero<3>>>(
      c, plain_batch, llama_reference(), "llama 2x2x2 zero<3>", ts::adamw_rule);
}

// TP 4 over two key/value heads: each is replicated on two ranks, whose gradients sum.
TEST(llama_strategy, replicated_key_value_heads_match) {
  expect_losses<llama_strategy<mesh<tp<4>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<1>>>(
      {.model = llama_shape, .micro_batch = 2}, plain_batch, llama_reference(),
      "llama 4x1x2 zero<1>", ts::adamw_rule);
  expect_losses<llama_strategy<mesh<tp<4>, pp<2>, dp<1>>, pipeline::one_f_one_b, optim::zero<3>>>(
      {.model = llama_shape, .micro_batch = 2}, plain_batch, llama_reference(),
      "llama 4x2x1 zero<3>", ts::adamw_rule);
}

TEST(llama_strategy, uneven_layout_1x4x2_matches) {
  expect_losses<llama_strategy<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b, optim::zero<2>>>(
      {.model = llama_shape, .micro_batch = 1, .layout = pipeline::parse_layout("Et*2|t|t|L")},
      plain_batch, llama_reference(), "llama 1x4x2 uneven", ts::adamw_rule);
}

TEST(llama_strategy, sequence_parallel_and_recompute_match) {
  using M = mesh<tp<2>, pp<2>, dp<2>>;
  expect_losses<llama_strategy<M, pipeline::interleaved<2>, optim::zero<1>, recompute::selective,
                               sequence_parallel>>({.model = llama_shape, .micro_batch = 1},
                                                   plain_batch, llama_reference(),
                                                   "llama 2x2x2 V=2 SP selective", ts::adamw_rule);
  expect_losses<
      llama_strategy<M, pipeline::gpipe, optim::zero<2>, recompute::full, sequence_parallel>>(
      {.model = llama_shape, .micro_batch = 1}, plain_batch, llama_reference(),
      "llama 2x2x2 gpipe SP full", ts::adamw_rule);
}

TEST(llama_strategy, tied_head_and_one_key_value_head_match) {
  auto shape = llama_shape;
  shape.kv_heads = 1;
  shape.tie_embeddings = true;
  expect_losses<llama_strategy<mesh<tp<2>, pp<2>, dp<1>>, pipeline::one_f_one_b, optim::zero<1>>>(
      {.model = shape, .micro_batch = 2}, plain_batch,
      reference<wl::llama_model>(shape, ts::sgd_rule), "llama 2x2x1 tied, 1 kv head", ts::sgd_rule);
}

// --- gradients ---------------------------------------------------------------------------------

// The first step's gradient of every parameter, as the optimizer applies it (summed over the DP
// replicas), put together from every rank (TP slices in their places, TP-replicated and duplicate
// copies once), equals the one-rank model's on the whole batch: losses over 20 steps could hide a
// gradient that is off where it barely moves the loss. The layers compute in the optimizer's
// buffers, whose gradients are gone after the step, so the test reads them from a plain SGD step
// (lr 1024, no momentum or decay): g = (w0 - w1) / 1024, to float's precision relative to g.
template <class S, class Model>
void expect_first_gradients_match(const typename Model::config& model, std::size_t micro_batch,
                                  const std::string& what) {
  using grads = std::map<std::string, std::vector<double>>;
  const auto b = masked_batch(0);
  grads want;
  weft::local::run(1, [&](weft::local::communicator& c) {
    wl::sequential<Model, float, weft::local::communicator, wl::cblas> one(c, model, 1);
    one.zero_grad();
    (void)one.forward(b.ids, b.targets);
    one.backward();
    for (auto& q : one.parameters()) {
      auto& g = want[q.name];
      for (std::size_t r = 0; r < q.grad.rows(); ++r)
        for (std::size_t col = 0; col < q.grad.cols(); ++col)
          g.push_back(q.grad(r, col));
    }
  });
  grads got;
  std::mutex mu;
  constexpr float lr = 1024.0f;
  weft::local::run(S::size, [&](weft::local::communicator& world) {
    auto t = S::make(world,
                     {.model = model, .micro_batch = micro_batch, .global_batch = ts::global_batch},
                     optim::sgd{.lr = lr});
    const auto before = t->parameter_values();
    std::vector<std::vector<float>> w0;
    for (const auto& q : before)
      w0.emplace_back(q.value.flat().begin(), q.value.flat().end());
    (void)t->train_step(b.ids, b.targets);
    const auto& after = t->parameter_values();
    const int tp_rank = t->comms().tp().rank();
    if (t->comms().dp().rank() != 0) return;
    std::lock_guard lock(mu);
    for (std::size_t k = 0; k < after.size(); ++k) {
      const auto& q = after[k];
      if ((q.replicated && tp_rank != 0) || q.duplicate) continue;
      auto& g = got[q.name];
      g.resize(q.full_rows * q.full_cols, 0.0);
      for (std::size_t r = 0; r < q.value.rows(); ++r)
        for (std::size_t col = 0; col < q.value.cols(); ++col) {
          const double w = w0[k][r * q.value.cols() + col];
          g[(q.row0 + r) * q.full_cols + q.col0 + col] =
              (w - static_cast<double>(q.value(r, col))) / lr;
        }
    }
  });
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name;
    const auto& g = got.at(name);
    ASSERT_EQ(g.size(), w.size()) << what << ": " << name;
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      diff = std::max(diff, std::abs(g[i] - w[i]));
      scale = std::max(scale, std::abs(w[i]));
    }
    EXPECT_LT(diff, 1e-5 * scale) << what << ": " << name << " differs by " << diff << " (largest "
                                  << scale << ")";
  }
}

TEST(gradients_strategy, the_first_steps_gradients_equal_one_ranks) {
  using M = mesh<tp<2>, pp<2>, dp<2>>;
  expect_first_gradients_match<
      weft::strategy<M, pipeline::one_f_one_b, optim::zero<1>, recompute::none>, wl::gpt_model>(
      ts::shape, 1, "gpt 2x2x2");
  expect_first_gradients_match<weft::strategy<M, pipeline::interleaved<2>, optim::zero<3>,
                                              recompute::selective, sequence_parallel>,
                               wl::gpt_model>(ts::shape, 1, "gpt 2x2x2 V=2 SP zero<3>");
  auto tied = ts::shape;
  tied.tie_embeddings = true;
  expect_first_gradients_match<weft::strategy<mesh<tp<1>, pp<4>, dp<2>>, pipeline::one_f_one_b,
                                              optim::zero<2>, recompute::full>,
                               wl::gpt_model>(tied, 1, "gpt 1x4x2 tied full recompute");
  expect_first_gradients_match<
      llama_strategy<M, pipeline::one_f_one_b, optim::zero<2>, recompute::full, sequence_parallel>,
      wl::llama_model>(llama_shape, 1, "llama 2x2x2 SP");
  expect_first_gradients_match<
      llama_strategy<mesh<tp<4>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<0>>,
      wl::llama_model>(llama_shape, 2, "llama 4x1x2 replicated kv");
}

// --- a model whose block is the test's own ---------------------------------------------------

// y = x + down(tanh(up(x))): a column-parallel and a row-parallel linear of weft's, the
// nonlinearity and the residual written here.
template <class T, class Comm, class Gemm, class SP, class Recompute>
class residual_mlp_block {
public:
  residual_mlp_block(Comm& tp, const wl::gpt_config& c, std::size_t layer, std::uint64_t seed,
                     Gemm gemm)
      : tp_(&tp),
        up_(tp, c.hidden, c.ffn, seed, 1 + 4 * layer, {}, gemm),
        down_(tp, c.ffn, c.hidden, seed, 2 + 4 * layer, {.init_std = 0.01}, gemm) {}

  void forward(weft::matrix_view<const T> x, weft::matrix_view<T> y) {
    const std::size_t tokens =
        SP::enabled ? x.rows() * static_cast<std::size_t>(tp_->size()) : x.rows();
    h_.resize(tokens, up_.out_local());
    up_.forward(x, h_.view());
    weft::matrix<T> a(tokens, up_.out_local());
    for (std::size_t i = 0; i < tokens; ++i)
      for (std::size_t j = 0; j < a.cols(); ++j)
        a(i, j) = std::tanh(h_(i, j));
    down_.forward(a.view(), y);
    for (std::size_t i = 0; i < y.rows(); ++i)
      for (std::size_t j = 0; j < y.cols(); ++j)
        y(i, j) += x(i, j);
  }
  void backward(weft::matrix_view<const T> dy, weft::matrix_view<T> dx) {
    weft::matrix<T> da(h_.rows(), h_.cols());
    down_.backward(dy, da.view());
    for (std::size_t i = 0; i < da.rows(); ++i)
      for (std::size_t j = 0; j < da.cols(); ++j) {
        const T t = std::tanh(h_(i, j));
        da(i, j) *= T{1} - t * t;
      }
    up_.backward(da.view(), dx);
    for (std::size_t i = 0; i < dx.rows(); ++i)
      for (std::size_t j = 0; j < dx.cols(); ++j)
        dx(i, j) += dy(i, j);
  }
  [[nodiscard]] std::vector<wl::parameter<T>> parameters() {
    std::vector<wl::parameter<T>> ps;
    wl::append_parameters(ps, "up.", up_.parameters());
    wl::append_parameters(ps, "down.", down_.parameters());
    return ps;
  }
  void zero_grad() {
    up_.zero_grad();
    down_.zero_grad();
  }
  struct activations {
    typename wl::column_parallel_linear<T, Comm, Gemm, SP>::activations up;
    typename wl::row_parallel_linear<T, Comm, Gemm, SP>::activations down;
    weft::matrix<T> h;
  };
  activations stash() { return {up_.stash(), down_.stash(), std::exchange(h_, {})}; }
  void restore(activations a) {
    up_.restore(std::move(a.up));
    down_.restore(std::move(a.down));
    h_ = std::move(a.h);
  }

private:
  Comm* tp_;
  wl::column_parallel_linear<T, Comm, Gemm, SP> up_;
  wl::row_parallel_linear<T, Comm, Gemm, SP> down_;
  weft::matrix<T> h_;
};

struct residual_mlp_model {
  using config = wl::gpt_config;
  template <class T, class Comm, class Gemm, class SP, class Recompute>
  struct parts {
    using embedding = wl::gpt_embedding<T, Comm, Gemm, SP>;
    using block = residual_mlp_block<T, Comm, Gemm, SP, Recompute>;
    using head = wl::gpt_head<T, Comm, Gemm, SP>;
  };
};

static_assert(wl::model<residual_mlp_model, float, weft::local::communicator, wl::cblas,
                        no_sequence_parallel, recompute::none>);
static_assert(!wl::model<wl::gpt_config, float, weft::local::communicator, wl::cblas,
                         no_sequence_parallel, recompute::none>);

TEST(own_model_strategy, a_block_defined_here_trains_at_2x2x2) {
  const auto want = reference<residual_mlp_model>(ts::shape, ts::adamw_rule);
  EXPECT_LT(want.back(), want.front() - 0.1) << want.front() << " -> " << want.back();
  using M = mesh<tp<2>, pp<2>, dp<2>>;
  expect_losses<weft::strategy<M, pipeline::one_f_one_b, optim::zero<1>, recompute::none,
                               no_sequence_parallel, residual_mlp_model>>(
      {.model = ts::shape, .micro_batch = 1}, plain_batch, want, "own block 2x2x2", ts::adamw_rule);
  expect_losses<weft::strategy<M, pipeline::one_f_one_b, optim::zero<3>, recompute::none,
                               sequence_parallel, residual_mlp_model>>(
      {.model = ts::shape, .micro_batch = 1}, plain_batch, want, "own block 2x2x2 SP zero<3>",
      ts::adamw_rule);
}

// --- loss masks ------------------------------------------------------------------------------

TEST(loss_mask_strategy, unevenly_ignored_targets_match_one_rank) {
  const auto gpt_want = reference<wl::gpt_model>(ts::shape, ts::sgd_rule, true);
  const auto gpt_plain = reference<wl::gpt_model>(ts::shape, ts::sgd_rule, false);
  EXPECT_GT(std::abs(gpt_want[0] - gpt_plain[0]), 1e-3) << "the mask changes the loss";
  using M = mesh<tp<2>, pp<2>, dp<2>>;
  expect_losses<weft::strategy<M, pipeline::one_f_one_b, optim::zero<1>, recompute::none>>(
      {.model = ts::shape, .micro_batch = 1}, masked_batch, gpt_want, "gpt 2x2x2 masked",
      ts::sgd_rule);
  expect_losses<weft::strategy<mesh<tp<1>, pp<1>, dp<2>>, pipeline::one_f_one_b, optim::zero<2>,
                               recompute::none>>({.model = ts::shape, .micro_batch = 2},
                                                 masked_batch, gpt_want, "gpt 1x1x2 masked",
                                                 ts::sgd_rule);
  expect_losses<llama_strategy<M, pipeline::one_f_one_b, optim::zero<3>>>(
      {.model = llama_shape, .micro_batch = 1}, masked_batch,
      reference<wl::llama_model>(llama_shape, ts::sgd_rule, true), "llama 2x2x2 masked",
      ts::sgd_rule);
}

// The loss of a masked batch is the mean over its counted tokens: a 1-rank model's loss on two
// halves, each weighted by its share of the counted tokens, is its loss on the whole.
TEST(loss_mask_strategy, the_mask_weighs_tokens_not_sequences) {
  weft::local::run(1, [](weft::local::communicator& c) {
    wl::gpt<double, weft::local::communicator> model(c, ts::shape, 1);
    const auto b = masked_batch(0);
    const std::size_t half = b.ids.size() / 2;
    const std::span<const std::int32_t> ids(b.ids), targets(b.targets);
    const auto count = [](std::span<const std::int32_t> t) {
      return static_cast<double>(
          std::count_if(t.begin(), t.end(), [](std::int32_t x) { return x != -100; }));
    };
    const double n1 = count(targets.first(half)), n2 = count(targets.subspan(half));
    ASSERT_NE(n1, n2);
    const double whole = model.forward(ids, targets);
    const double l1 = model.forward(ids.first(half), targets.first(half));
    const double l2 = model.forward(ids.subspan(half), targets.subspan(half));
    EXPECT_NEAR(whole, (n1 * l1 + n2 * l2) / (n1 + n2), 1e-12);
    EXPECT_GT(std::abs(whole - (l1 + l2) / 2), 1e-6);
  });
}

} // namespace
