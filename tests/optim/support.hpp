#pragma once
// Shared by the optimizer tests: two small models with hand-written forward and backward,
// a serial trainer (the reference: one rank, the full batch, the update rules written again
// here in plain loops), and a data-parallel trainer that drives weft::optim::data_parallel.
#include <weft/comm/transport/local.hpp>
#include <weft/optim.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace weft::test::optim {

/// A model: tensors, and the gradient of the loss summed over samples [begin, end) of a
/// batch, as a flat vector in the param_set's order, divided by `divisor`.
struct model {
  weft::optim::param_set params;
  virtual ~model() = default;
  virtual std::vector<float> gradient(const std::vector<float>& w, int begin, int end) const = 0;
  virtual std::vector<float> initial() const = 0;
};

/// A two-layer perceptron with tanh and a squared loss, float data, averaged over the batch.
struct mlp final : model {
  static constexpr int d = 5, h = 7, o = 3;
  int batch;
  std::vector<float> x, t;
  explicit mlp(int batch_) : batch(batch_) {
    params.add("fc1.w", {h, d});
    params.add("fc1.b", {h});
    params.add("fc2.w", {o, h});
    params.add("fc2.b", {o});
    std::uint32_t s = 12345;
    const auto rnd = [&] {
      s = s * 1664525u + 1013904223u;
      return static_cast<float>(s >> 8) / 16777216.0f * 2.0f - 1.0f;
    };
    x.resize(static_cast<std::size_t>(batch * d));
    t.resize(static_cast<std::size_t>(batch * o));
    for (auto& v : x)
      v = rnd();
    for (auto& v : t)
      v = rnd();
  }
  std::vector<float> initial() const override {
    std::vector<float> w(params.elements());
    std::uint32_t s = 777;
    for (auto& v : w) {
      s = s * 1664525u + 1013904223u;
      v = (static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 0.8f;
    }
    return w;
  }
  std::vector<float> gradient(const std::vector<float>& w, int begin, int end) const override {
    const float* w1 = w.data();
    const float* b1 = w1 + h * d;
    const float* w2 = b1 + h;
    const float* b2 = w2 + o * h;
    std::vector<float> g(w.size(), 0.0f);
    float* g1 = g.data();
    float* gb1 = g1 + h * d;
    float* g2 = gb1 + h;
    float* gb2 = g2 + o * h;
    for (int n = begin; n < end; ++n) {
      const float* xn = &x[static_cast<std::size_t>(n * d)];
      float hid[h], y[o], dy[o], dz[h];
      for (int i = 0; i < h; ++i) {
        float z = b1[i];
        for (int j = 0; j < d; ++j)
          z += w1[i * d + j] * xn[j];
        hid[i] = std::tanh(z);
      }
      for (int i = 0; i < o; ++i) {
        float z = b2[i];
        for (int j = 0; j < h; ++j)
          z += w2[i * h + j] * hid[j];
        y[i] = z;
        dy[i] = (y[i] - t[static_cast<std::size_t>(n * o + i)]) / static_cast<float>(batch);
      }
      for (int i = 0; i < o; ++i) {
        gb2[i] += dy[i];
        for (int j = 0; j < h; ++j)
          g2[i * h + j] += dy[i] * hid[j];
      }
      for (int j = 0; j < h; ++j) {
        float dh = 0;
        for (int i = 0; i < o; ++i)
          dh += w2[i * h + j] * dy[i];
        dz[j] = dh * (1.0f - hid[j] * hid[j]);
        gb1[j] += dz[j];
        for (int k = 0; k < d; ++k)
          g1[j * d + k] += dz[j] * xn[k];
      }
    }
    return g;
  }
};

/// A linear model with an L1 loss on integer data: the gradient of every sample is
/// sign(residual) x input, an integer, so sums are exact in any order (the gradient is the
/// plain sum; the step's multiplier divides by the batch).
struct l1_linear final : model {
  static constexpr int d = 4, o = 3;
  int batch;
  std::vector<float> x, t;
  explicit l1_linear(int batch_) : batch(batch_) {
    params.add("w", {o, d});
    params.add("b", {o});
    for (int n = 0; n < batch; ++n) {
      for (int j = 0; j < d; ++j)
        x.push_back(static_cast<float>((n * 7 + j * 3) % 7 - 3));
      for (int i = 0; i < o; ++i)
        t.push_back(static_cast<float>((n * 5 + i * 11) % 9 - 4));
    }
  }
  std::vector<float> initial() const override {
    std::vector<float> w(params.elements());
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>(static_cast<int>(i % 5) - 2) * 0.25f;
    return w;
  }
  std::vector<float> gradient(const std::vector<float>& w, int begin, int end) const override {
    std::vector<float> g(w.size(), 0.0f);
    for (int n = begin; n < end; ++n) {
      for (int i = 0; i < o; ++i) {
        float y = w[static_cast<std::size_t>(o * d + i)];
        for (int j = 0; j < d; ++j)
          y += w[static_cast<std::size_t>(i * d + j)] * x[static_cast<std::size_t>(n * d + j)];
        const float r = y - t[static_cast<std::size_t>(n * o + i)];
        const float s = r > 0 ? 1.0f : (r < 0 ? -1.0f : 0.0f);
        for (int j = 0; j < d; ++j)
          g[static_cast<std::size_t>(i * d + j)] += s * x[static_cast<std::size_t>(n * d + j)];
        g[static_cast<std::size_t>(o * d + i)] += s;
      }
    }
    return g;
  }
};

enum class rule_kind { sgd, adam, adamw };

inline const char* name_of(rule_kind k) {
  return k == rule_kind::sgd ? "sgd" : (k == rule_kind::adam ? "adam" : "adamw");
}

inline weft::optim::sgd sgd_rule() {
  return {.lr = 0.125f, .momentum = 0.5f, .weight_decay = 0.0f, .nesterov = true};
}
inline weft::optim::adam adam_rule() { return {.lr = 0.01f, .weight_decay = 0.01f}; }
inline weft::optim::adamw adamw_rule() { return {.lr = 0.01f, .weight_decay = 0.1f}; }

/// The serial reference: `steps` steps on the full batch, the rules written out again.
inline std::vector<float> train_serial(const model& m, int batch, rule_kind k, int steps,
                                       float multiplier, float max_norm) {
  std::vector<float> w = m.initial();
  std::vector<float> s0(w.size(), 0.0f), s1(w.size(), 0.0f);
  for (int t = 1; t <= steps; ++t) {
    const std::vector<float> g = m.gradient(w, 0, batch);
    float mul = multiplier;
    if (max_norm > 0) {
      double sq = 0;
      for (float v : g)
        sq += static_cast<double>(v) * static_cast<double>(v);
      const double norm = std::sqrt(sq) * std::fabs(static_cast<double>(multiplier));
      const auto coef = static_cast<float>(static_cast<double>(max_norm) / (norm + 1e-6));
      if (coef < 1.0f) mul = mul * coef;
    }
    for (std::size_t i = 0; i < w.size(); ++i) {
      float gi = g[i] * mul;
      if (k == rule_kind::sgd) {
        const auto r = sgd_rule();
        gi = gi + r.weight_decay * w[i];
        const float b = r.momentum * s0[i] + gi;
        s0[i] = b;
        gi = r.nesterov ? gi + r.momentum * b : b;
        w[i] = w[i] - r.lr * gi;
      } else {
        const bool decoupled = k == rule_kind::adamw;
        const float lr = decoupled ? adamw_rule().lr : adam_rule().lr;
        const float wd = decoupled ? adamw_rule().weight_decay : adam_rule().weight_decay;
        const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
        if (!decoupled) gi = gi + wd * w[i];
        s0[i] = b1 * s0[i] + (1 - b1) * gi;
        s1[i] = b2 * s1[i] + (1 - b2) * gi * gi;
        if (decoupled) w[i] = w[i] - lr * wd * w[i];
        const double mhat = s0[i] / (1.0 - std::pow(0.9, t));
        const double vhat = s1[i] / (1.0 - std::pow(0.999, t));
        w[i] = static_cast<float>(w[i] - lr * mhat / (std::sqrt(vhat) + eps));
      }
    }
  }
  return w;
}

/// How a test reads a parameter tensor and writes a gradient: here, host memory (the device
/// test copies through the stream instead: tests/cuda/data_parallel_test.cu).
struct host_access {
  template <class T>
  void read(std::span<const T> p, float* out) const {
    for (std::size_t i = 0; i < p.size(); ++i)
      out[i] = static_cast<float>(p[i]);
  }
  template <class T>
  void write(std::span<T> g, const float* in, float scale) const {
    for (std::size_t i = 0; i < g.size(); ++i)
      g[i] = static_cast<T>(in[i] * scale);
  }
};

/// What every rank of a data-parallel run does for `steps` steps on samples [begin, end):
/// a forward that fetches every tensor (zero<3> gathers bucket by bucket, prefetching) and
/// releases it; a backward, last tensor first, that reads each tensor again (zero<3>: gathered
/// again), hands over its gradient and marks it ready; then the step.
template <class Opt, class Access = host_access>
void train_steps(Opt& opt, const model& m, int begin, int end, int steps, float multiplier,
                 const Access& access = {}) {
  const auto& ts = m.params.tensors();
  for (int t = 0; t < steps; ++t) {
    std::vector<float> w(m.params.elements());
    for (const auto& ti : ts) {
      access.read(opt.param(ti.name), w.data() + ti.offset);
      opt.release(ti.name);
    }
    const std::vector<float> g = m.gradient(w, begin, end);
    const float scale = opt.loss_scale(); // 1 unless loss scaling is on
    for (auto it = ts.rbegin(); it != ts.rend(); ++it) {
      (void)opt.param(it->name);
      access.write(opt.grad(it->name), g.data() + it->offset, scale);
      opt.grad_ready(it->name);
      opt.release(it->name);
    }
    (void)opt.step(multiplier);
  }
}

/// Rank 0's result, after checking that every rank's is the same bitwise.
inline std::vector<float> agreed(const std::vector<std::vector<float>>& per_rank) {
  for (std::size_t r = 1; r < per_rank.size(); ++r) {
    EXPECT_EQ(per_rank[r], per_rank[0]) << "rank " << r << " differs from rank 0";
  }
  return per_rank.at(0);
}

/// The serial reference's weights as a P-parameter run holds them (rounded once, at the end).
template <class P>
std::vector<float> rounded_to(const std::vector<float>& master) {
  std::vector<float> out;
  for (float v : master)
    out.push_back(static_cast<float>(static_cast<P>(v)));
  return out;
}

/// One training run on `dp` local ranks (over `wrap(c)` of each rank's communicator: by
/// default the communicator itself); returns rank 0's gathered parameters.
template <class Policy, class P = float, class Rule, class Wrap = std::identity>
std::vector<float> train_parallel(const model& m, int batch, int dp, Rule rule, int steps,
                                  float multiplier, weft::optim::data_parallel_options o,
                                  Wrap wrap = {}) {
  std::vector<std::vector<float>> result(static_cast<std::size_t>(dp));
  weft::local::run(dp, [&](weft::local::communicator& c) {
    const int rank = c.rank();
    auto&& comm = wrap(c); // may take c over
    auto opt = weft::optim::make_data_parallel<Policy, P>(comm, m.params, rule, o);
    opt->set_parameters(m.initial());
    train_steps(*opt, m, batch * rank / dp, batch * (rank + 1) / dp, steps, multiplier);
    result[static_cast<std::size_t>(rank)] = opt->gather_parameters();
  });
  return agreed(result);
}

inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

} // namespace weft::test::optim
