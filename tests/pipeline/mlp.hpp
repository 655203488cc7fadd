#pragma once
// The executor tests' model: a small MLP of layers y = tanh(W x + b) with widths that change
// from layer to layer, a squared-error loss, split into virtual stages of uneven layer counts;
// the stage functions that train it through an executor; and, independently of both, the
// serial reference: the whole stack forward and backward on one rank, sample by sample, with the
// gradients accumulated over the microbatches.
#include <weft/pipeline/executor.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft::test::mlp {

struct layer {
  std::size_t in = 0;
  std::size_t out = 0;
  std::vector<float> w; // out x in, row-major
  std::vector<float> b; // out
};

struct model {
  std::vector<layer> layers;
  std::vector<std::size_t> first; // first[v]: virtual stage v's first layer; first.back(): all
  int microbatches = 0;
  std::size_t samples = 0;    // per microbatch
  std::vector<float> inputs;  // the batch: microbatches * samples rows of layers[0].in
  std::vector<float> targets; // microbatches * samples rows of layers.back().out

  [[nodiscard]] int virtual_stages() const { return static_cast<int>(first.size()) - 1; }
  /// Elements per microbatch between virtual stages v and v + 1.
  [[nodiscard]] std::vector<std::size_t> boundaries() const {
    std::vector<std::size_t> out;
    for (int v = 1; v < virtual_stages(); ++v)
      out.push_back(samples * layers[first[static_cast<std::size_t>(v)]].in);
    return out;
  }
};

/// A deterministic value in [-1, 1) from three integers.
inline float noise(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t x = (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^ (c + 0x165667B1);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

/// `stages` virtual stages whose layer counts cycle through {1, 3, 2}; widths cycle through
/// {3, 5, 4, 6, 2}, so every boundary has its own size.
inline model make(int virtual_stages, int microbatches, std::size_t samples = 2) {
  constexpr std::size_t counts[] = {1, 3, 2};
  constexpr std::size_t widths[] = {3, 5, 4, 6, 2};
  model m;
  m.microbatches = microbatches;
  m.samples = samples;
  std::size_t n = 0;
  for (int v = 0; v < virtual_stages; ++v) {
    m.first.push_back(n);
    n += counts[static_cast<std::size_t>(v) % 3];
  }
  m.first.push_back(n);
  for (std::size_t l = 0; l < n; ++l) {
    layer y;
    y.in = widths[l % 5];
    y.out = widths[(l + 1) % 5];
    const float scale = 1.5f / std::sqrt(static_cast<float>(y.in));
    for (std::size_t k = 0; k < y.in * y.out; ++k)
      y.w.push_back(scale * noise(1, l, k));
    for (std::size_t k = 0; k < y.out; ++k)
      y.b.push_back(0.1f * noise(2, l, k));
    m.layers.push_back(std::move(y));
  }
  const auto rows = static_cast<std::size_t>(microbatches) * samples;
  for (std::size_t k = 0; k < rows * m.layers.front().in; ++k)
    m.inputs.push_back(noise(3, 0, k));
  for (std::size_t k = 0; k < rows * m.layers.back().out; ++k)
    m.targets.push_back(0.8f * noise(4, 0, k));
  return m;
}

/// Gradients of every layer's W and b.
template <class T>
struct gradients {
  std::vector<std::vector<T>> w;
  std::vector<std::vector<T>> b;

  explicit gradients(const model& m) {
    for (const layer& y : m.layers) {
      w.emplace_back(y.w.size(), T(0));
      b.emplace_back(y.b.size(), T(0));
    }
  }
};

struct reference_result {
  std::vector<double> losses;
  gradients<float> grads;
};

/// The serial reference: each sample forward through every layer, loss 1/2 |y - t|^2,
/// backward through every layer; gradients summed over the samples of every microbatch in
/// order. No executor, no stages. In float, as the stages: float against double would
/// measure float's rounding over two dozen layers, not the executor.
inline reference_result reference(const model& m) {
  reference_result r{{}, gradients<float>(m)};
  const std::size_t in0 = m.layers.front().in;
  const std::size_t out_n = m.layers.back().out;
  for (int mb = 0; mb < m.microbatches; ++mb) {
    r.losses.push_back(0.0);
    for (std::size_t s = 0; s < m.samples; ++s) {
      const std::size_t row = static_cast<std::size_t>(mb) * m.samples + s;
      std::vector<std::vector<float>> acts; // acts[l]: the input of layer l; back(): output
      acts.emplace_back(m.inputs.begin() + static_cast<std::ptrdiff_t>(row * in0),
                        m.inputs.begin() + static_cast<std::ptrdiff_t>((row + 1) * in0));
      for (const layer& y : m.layers) {
        std::vector<float> next(y.out);
        for (std::size_t o = 0; o < y.out; ++o) {
          float z = y.b[o];
          for (std::size_t i = 0; i < y.in; ++i)
            z += y.w[o * y.in + i] * acts.back()[i];
          next[o] = std::tanh(z);
        }
        acts.push_back(std::move(next));
      }
      std::vector<float> g(out_n);
      for (std::size_t o = 0; o < out_n; ++o) {
        const float d = acts.back()[o] - m.targets[row * out_n + o];
        r.losses.back() += 0.5 * static_cast<double>(d) * d;
        g[o] = d;
      }
      for (std::size_t l = m.layers.size(); l-- > 0;) {
        const layer& y = m.layers[l];
        std::vector<float> gx(y.in, 0.0f);
        for (std::size_t o = 0; o < y.out; ++o) {
          const float out = acts[l + 1][o];
          const float gz = g[o] * (1 - out * out);
          r.grads.b[l][o] += gz;
          for (std::size_t i = 0; i < y.in; ++i) {
            r.grads.w[l][o * y.in + i] += gz * acts[l][i];
            gx[i] += y.w[o * y.in + i] * gz;
          }
        }
        g = std::move(gx);
      }
    }
  }
  return r;
}

/// The stage functions of one rank: its chunks' layers, in float. With Split, backward gives
/// only the input gradient and weight_grad the weight gradient (B and W); without, backward
/// does both and there is no weight_grad.
template <bool Split>
class stage {
public:
  stage(const model& m, int rank, int stages) : grads(m), m_(&m), rank_(rank), stages_(stages) {
    saved_.resize(static_cast<std::size_t>(m.microbatches * m.virtual_stages()));
  }

  std::span<const float> input(int mb) const {
    return pipeline::microbatch(std::span<const float>(m_->inputs), m_->layers.front().in,
                                m_->microbatches, mb);
  }

  std::vector<float> forward(int mb, int chunk, std::span<const float> x) {
    auto& s = saved(mb, chunk);
    s.acts.assign(1, std::vector<float>(x.begin(), x.end()));
    for (std::size_t l = first(chunk); l < end(chunk); ++l) {
      const layer& y = m_->layers[l];
      std::vector<float> next(m_->samples * y.out);
      for (std::size_t r = 0; r < m_->samples; ++r) {
        for (std::size_t o = 0; o < y.out; ++o) {
          float z = y.b[o];
          for (std::size_t i = 0; i < y.in; ++i)
            z += y.w[o * y.in + i] * s.acts.back()[r * y.in + i];
          next[r * y.out + o] = std::tanh(z);
        }
      }
      s.acts.push_back(std::move(next));
    }
    return s.acts.back();
  }

  pipeline::loss_result<float> loss(int mb, std::span<const float> y) const {
    const std::span<const float> t = pipeline::microbatch(
        std::span<const float>(m_->targets), m_->layers.back().out, m_->microbatches, mb);
    pipeline::loss_result<float> r;
    for (std::size_t k = 0; k < y.size(); ++k) {
      const float d = y[k] - t[k];
      r.loss += 0.5 * static_cast<double>(d) * d;
      r.gradient.push_back(d);
    }
    return r;
  }

  std::vector<float> backward(int mb, int chunk, std::span<const float> gy) {
    auto& s = saved(mb, chunk);
    std::vector<float> g(gy.begin(), gy.end());
    s.gz.assign(end(chunk) - first(chunk), {});
    for (std::size_t l = end(chunk); l-- > first(chunk);) {
      const layer& y = m_->layers[l];
      const auto& out = s.acts[l - first(chunk) + 1];
      auto& gz = s.gz[l - first(chunk)];
      gz.resize(g.size());
      std::vector<float> gx(m_->samples * y.in, 0.0f);
      for (std::size_t r = 0; r < m_->samples; ++r) {
        for (std::size_t o = 0; o < y.out; ++o) {
          const float v = out[r * y.out + o];
          gz[r * y.out + o] = g[r * y.out + o] * (1 - v * v);
          for (std::size_t i = 0; i < y.in; ++i)
            gx[r * y.in + i] += y.w[o * y.in + i] * gz[r * y.out + o];
        }
      }
      g = std::move(gx);
    }
    if constexpr (!Split) accumulate(s, chunk);
    return g;
  }

  void weight_grad(int mb, int chunk) requires Split { accumulate(saved(mb, chunk), chunk); }

  /// Whether every microbatch's saved state was used up (forward, backward and W all ran).
  [[nodiscard]] bool drained() const {
    return std::all_of(saved_.begin(), saved_.end(),
                       [](const auto& s) { return s.acts.empty() && s.gz.empty(); });
  }

  [[nodiscard]] int virtual_stage(int chunk) const { return chunk * stages_ + rank_; }
  [[nodiscard]] std::size_t first(int chunk) const {
    return m_->first[static_cast<std::size_t>(virtual_stage(chunk))];
  }
  [[nodiscard]] std::size_t end(int chunk) const {
    return m_->first[static_cast<std::size_t>(virtual_stage(chunk)) + 1];
  }

  gradients<float> grads;

private:
  struct state {
    std::vector<std::vector<float>> acts; // the chunk's input, then each layer's output
    std::vector<std::vector<float>> gz;   // each layer's pre-activation gradient
  };

  state& saved(int mb, int chunk) {
    return saved_[static_cast<std::size_t>(mb * m_->virtual_stages() + virtual_stage(chunk))];
  }

  void accumulate(state& s, int chunk) {
    for (std::size_t l = first(chunk); l < end(chunk); ++l) {
      const layer& y = m_->layers[l];
      const auto& x = s.acts[l - first(chunk)];
      const auto& gz = s.gz[l - first(chunk)];
      for (std::size_t r = 0; r < m_->samples; ++r) {
        for (std::size_t o = 0; o < y.out; ++o) {
          grads.b[l][o] += gz[r * y.out + o];
          for (std::size_t i = 0; i < y.in; ++i)
            grads.w[l][o * y.in + i] += gz[r * y.out + o] * x[r * y.in + i];
        }
      }
    }
    s.acts.clear();
    s.gz.clear();
  }

  const model* m_;
  int rank_;
  int stages_;
  std::vector<state> saved_;
};

/// |got - want| within 1e-5 of the largest |want| of the tensor, element by element.
inline ::testing::AssertionResult close(const std::vector<float>& got,
                                        const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << got.size() << " elements where the reference has " << want.size();
  }
  double scale = 0;
  for (float w : want)
    scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (std::size_t k = 0; k < got.size(); ++k) {
    if (std::abs(static_cast<double>(got[k]) - want[k]) > 1e-5 * scale) {
      return ::testing::AssertionFailure()
             << "element " << k << ": " << got[k] << " where the "
             << "reference has " << want[k] << " (scale " << scale << ")";
    }
  }
  if (scale == 0) return ::testing::AssertionFailure() << "the reference is all zeros";
  return ::testing::AssertionSuccess();
}

/// Checks one rank's gradients after a step of its stage `st` (and the step's losses, on the
/// last rank) against the reference.
template <bool Split>
void expect_matches(const model& m, const reference_result& ref, const stage<Split>& st,
                    const gradients<float>& grads, int chunks, const std::vector<double>& losses,
                    bool has_loss, const std::string& where) {
  EXPECT_TRUE(st.drained()) << where << ": some microbatch state was never consumed";
  for (int c = 0; c < chunks; ++c) {
    for (std::size_t l = st.first(c); l < st.end(c); ++l) {
      EXPECT_TRUE(close(grads.w[l], ref.grads.w[l])) << where << ": dW of layer " << l;
      EXPECT_TRUE(close(grads.b[l], ref.grads.b[l])) << where << ": db of layer " << l;
    }
  }
  if (!has_loss) {
    EXPECT_TRUE(losses.empty()) << where;
    return;
  }
  ASSERT_EQ(losses.size(), static_cast<std::size_t>(m.microbatches)) << where;
  for (int mb = 0; mb < m.microbatches; ++mb) {
    const auto k = static_cast<std::size_t>(mb);
    EXPECT_NEAR(losses[k], ref.losses[k], 1e-5 * std::abs(ref.losses[k]))
        << where << ": loss of microbatch " << mb;
  }
}

/// A schedule of p = 2 stages in GPipe's shape whose rank 1 takes the microbatches in reverse:
/// it needs first the activation rank 0 sent last, and sends its gradients in the order rank 0
/// does not want them. Valid (validate() matches messages by what they carry), and a test of
/// the executor's receiving in the sender's order.
struct reversed_receiver {
  static constexpr bool split_backward = false;
  static pipeline::schedule make(int stages, int microbatches, const pipeline::options& = {}) {
    using pipeline::action_kind;
    std::vector<std::vector<pipeline::action>> compute(2);
    for (int i = 0; i < microbatches; ++i)
      compute[0].push_back({action_kind::forward, i, 0});
    for (int i = 0; i < microbatches; ++i)
      compute[0].push_back({action_kind::backward, i, 0});
    for (int i = microbatches; i-- > 0;)
      compute[1].push_back({action_kind::forward, i, 0});
    for (int i = microbatches; i-- > 0;)
      compute[1].push_back({action_kind::backward, i, 0});
    compute.resize(static_cast<std::size_t>(stages));
    return pipeline::from_compute_order("reversed", stages, microbatches, 1, false, compute, 0, 0);
  }
};

} // namespace weft::test::mlp
