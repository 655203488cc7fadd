#pragma once
// What the strategy tests share: a small GPT, a batch per step, the strategy's losses over
// `steps` steps, and the reference they are checked against: the same model (layer::gpt, one
// seed) trained on one rank on the whole batch, with AdamW written out here.
#include <weft/comm/transport/local.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/strategy.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace weft::test::strategy {

// Vocabulary 53: it does not divide by 2 or 4, so the vocab-parallel layers split it unevenly.
inline constexpr layer::gpt_shape shape{
    .vocab = 53, .hidden = 16, .heads = 4, .ffn = 24, .seq = 8, .layers = 4};
inline constexpr std::size_t global_batch = 8;
inline constexpr int steps = 20;
// SGD with momentum sees a wrong gradient scale (Adam would not: its step is scale-invariant).
inline constexpr optim::sgd sgd_rule{.lr = 0.2f, .momentum = 0.9f, .weight_decay = 0.01f};
inline constexpr optim::adamw adamw_rule{
    .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};

/// Step s's batch: sequences that count up by a stride that depends on the sequence, so the
/// next token is learnable from the last two; the targets are the next tokens.
struct batch {
  std::vector<std::int32_t> ids, targets;
};
inline batch batch_of(int step, std::size_t sequences = global_batch,
                      const layer::gpt_shape& m = shape) {
  batch b;
  for (std::size_t q = 0; q < sequences; ++q) {
    const auto start =
        static_cast<std::uint32_t>((step * 7919 + static_cast<int>(q) * 104729) % 1000003);
    const std::uint32_t stride = 1 + (start / 7) % 5;
    for (std::size_t t = 0; t <= m.seq; ++t) {
      const auto id = static_cast<std::int32_t>((start + stride * t) % m.vocab);
      if (t < m.seq) b.ids.push_back(id);
      if (t > 0) b.targets.push_back(id);
    }
  }
  return b;
}

/// Megatron's parameter groups, by name alone: every weight matrix and embedding table decays,
/// biases and norm parameters (LayerNorm's gamma and beta, RMSNorm's weight) do not.
inline bool decays(const std::string& name) {
  const auto ends = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  const auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  return !(ends("bias") || ends("gamma") || ends("beta") || has("ln1.") || has("ln2.") ||
           has("norm."));
}

/// The reference: layer::gpt on one in-process rank, the whole batch per step, the update
/// written out in double: SGD as PyTorch defines it (L2 decay, momentum buffer b = mu b + g),
/// AdamW as Loshchilov & Hutter write it (decoupled decay, bias-corrected moments); weight decay
/// on the tensors decays() names.
/// Tied: the head's weight is set to the embedding table at the start and both get the sum
/// of their gradients each step, so they stay one matrix used twice. max_grad_norm > 0: the
/// gradients are scaled by min(1, max / (norm + 1e-6)), the norm over every parameter once (the
/// tied matrix once); `norms` (if given) receives each step's norm.
/// `Model` with configuration `config` (untied: the reference ties by hand), step s's batch
/// `batch_for(s)`.
template <class Model, class Rule, class BatchFor>
std::vector<double> reference_losses_of(const typename Model::config& config, BatchFor batch_for,
                                        const Rule& rule, bool tied = false, std::uint64_t seed = 1,
                                        int n = steps, double max_grad_norm = 0,
                                        std::vector<double>* norms = nullptr) {
  std::vector<double> losses;
  local::run(1, [&](local::communicator& c) {
    layer::sequential<Model, float, local::communicator, layer::cblas> model(c, config, seed);
    auto ps = model.parameters();
    const auto find = [&](const std::string& name) {
      for (auto& p : ps) {
        if (p.name == name) return p;
      }
      throw std::runtime_error("no parameter " + name);
    };
    const auto table = find("embedding.wte.weight");
    const auto head = find("head.output.weight");
    if (tied) {
      for (std::size_t r = 0; r < table.value.rows(); ++r)
        for (std::size_t c = 0; c < table.value.cols(); ++c)
          head.value(r, c) = table.value(r, c);
    }
    std::vector<std::vector<double>> m(ps.size()), v(ps.size());
    for (std::size_t k = 0; k < ps.size(); ++k) {
      m[k].assign(ps[k].value.size(), 0.0);
      v[k].assign(ps[k].value.size(), 0.0);
    }
    for (int s = 0; s < n; ++s) {
      const auto b = batch_for(s);
      model.zero_grad();
      losses.push_back(model.forward(b.ids, b.targets));
      model.backward();
      if (tied) {
        for (std::size_t r = 0; r < table.grad.rows(); ++r)
          for (std::size_t c = 0; c < table.grad.cols(); ++c)
            table.grad(r, c) = head.grad(r, c) += table.grad(r, c);
      }
      double clip = 1.0;
      if (max_grad_norm > 0) {
        double sq = 0;
        for (const auto& q : ps) {
          if (tied && q.name == "head.output.weight") continue;
          for (std::size_t r = 0; r < q.grad.rows(); ++r)
            for (std::size_t c = 0; c < q.grad.cols(); ++c)
              sq += double{q.grad(r, c)} * double{q.grad(r, c)};
        }
        const double norm = std::sqrt(sq);
        if (norms) norms->push_back(norm);
        clip = std::min(1.0, max_grad_norm / (norm + 1e-6));
      }
      double c1 = 1.0, c2 = 1.0;
      if constexpr (std::is_same_v<Rule, optim::adamw>) {
        c1 = 1.0 - std::pow(double{rule.beta1}, s + 1);
        c2 = 1.0 - std::pow(double{rule.beta2}, s + 1);
      }
      for (std::size_t k = 0; k < ps.size(); ++k) {
        auto w = ps[k].value;
        auto g = ps[k].grad;
        const double decay = decays(ps[k].name) ? 1.0 : 0.0;
        std::size_t i = 0;
        for (std::size_t r = 0; r < w.rows(); ++r) {
          for (std::size_t col = 0; col < w.cols(); ++col, ++i) {
            double gi = clip * g(r, col);
            double wi = w(r, col);
            if constexpr (std::is_same_v<Rule, optim::sgd>) {
              gi += decay * double{rule.weight_decay} * wi;
              m[k][i] = rule.momentum * m[k][i] + gi;
              wi -= double{rule.lr} * m[k][i];
            } else {
              static_assert(std::is_same_v<Rule, optim::adamw>);
              m[k][i] = rule.beta1 * m[k][i] + (1.0 - rule.beta1) * gi;
              v[k][i] = rule.beta2 * v[k][i] + (1.0 - rule.beta2) * gi * gi;
              wi -= decay * double{rule.lr} * rule.weight_decay * wi;
              wi -= double{rule.lr} * (m[k][i] / c1) / (std::sqrt(v[k][i] / c2) + rule.eps);
            }
            w(r, col) = static_cast<float>(wi);
          }
        }
      }
    }
  });
  return losses;
}

template <class Rule>
std::vector<double> reference_losses(const Rule& rule, bool tied = false, std::uint64_t seed = 1,
                                     int n = steps, double max_grad_norm = 0,
                                     std::vector<double>* norms = nullptr) {
  return reference_losses_of<layer::gpt_model>(
      shape, [](int s) { return batch_of(s); }, rule, tied, seed, n, max_grad_norm, norms);
}

/// The strategy S's losses over `n` steps on `world` (every rank gets them).
template <class S, class Comm, class Rule>
std::vector<double> strategy_losses(Comm& world, strategy_config config, const Rule& rule,
                                    int n = steps) {
  const bool tied = config.model.tie_embeddings;
  config.model = shape;
  config.model.tie_embeddings = tied;
  config.global_batch = global_batch;
  auto trainer = S::make(world, config, rule);
  std::vector<double> losses;
  for (int s = 0; s < n; ++s) {
    const auto b = batch_of(s);
    losses.push_back(trainer->train_step(b.ids, b.targets));
  }
  return losses;
}

/// The first steps' losses within 1e-6 relative of the reference's, every later step's within
/// 1e-4. Float sums in another order (tensor parallelism splits them, and the host BLAS orders
/// them by the CPU's kernels) drift apart at a rate that grows over the steps: with OpenBLAS's
/// AVX-512 kernels the nineteenth step differs by 3e-5 where its AVX2 kernels stay under 1e-5.
/// A wrong gradient shows from the second step, the first after an update, far beyond 1e-6.
inline void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want,
                               const std::string& what) {
  constexpr std::size_t early_steps = 5;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t s = 0; s < want.size(); ++s) {
    const double bound = s < early_steps ? 1e-6 : 1e-4;
    EXPECT_LT(std::abs(got[s] - want[s]), bound * std::abs(want[s]))
        << what << ", step " << s << ": " << got[s] << " vs the single rank's " << want[s]
        << " (bound " << bound << " relative)";
  }
}

} // namespace weft::test::strategy
