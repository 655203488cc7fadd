// The GPT-2 and Llama models (gpt.hpp, llama.hpp) against plain double models written out here
// from the published definitions, forward and a hand-written backward:
//
//   GPT-2:  x = wte[id] + wpe[pos];  h = x + attn(ln1(x)),  y = h + fc2(gelu_tanh(fc1(ln2(h))));
//           logits = ln_f(y) W^T (W the token table when tied); LayerNorm eps 1e-5
//   Llama:  x = wte[id];  h = x + o(attn(rope(q), rope(k), v)(rms1(x))),
//           y = h + down(silu(gate a) * up a),
//           a = rms2(h); RMSNorm x / sqrt(mean(x^2) + eps) w; RoPE rotate_half with angle
//           pos theta^(-2i/d); query head h reads kv head h / (heads / kv_heads)
//   loss:   cross entropy, the mean over the targets that are not -100
//
// The weights are the weft model's own at TP 1 (parameters(): names and full shapes), with its
// norms and biases moved off 1 and 0 so that they matter. The reference's backward is checked by
// central differences on a sample of each parameter's entries (its largest one among them); weft's
// loss, logits and every gradient are checked against the reference at TP 1, 2 and 4 (shards put
// back at parameter::row0/col0), for GPT untied and tied, Llama with grouped kv heads (replicated
// at TP 4), with kv_heads = heads, in the fused layout (kv_heads 0), and tied. Then the published
// initialisation (residual projections N(0, init_std^2 / (2 layers)), the rest N(0, init_std^2),
// norms 1, biases 0) on a wider model, and the weight-decay groups.
#include <weft/layer/cblas.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/layer/init.hpp>
#include <weft/layer/llama.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "layer/layer_support.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;
using comm_t = weft::local::communicator;
using weights = std::map<std::string, dmat>;

constexpr double tol = 1e-12; // loss, logits and gradients, relative (norm-wise)
constexpr std::size_t batch = 2;
constexpr std::uint64_t seed = 5;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The test's own naming rule for the groups: biases, and the weights of the norms (the blocks'
// ln1 and ln2, the head's final norm).
bool is_bias(const std::string& name) { return ends_with(name, ".bias"); }
bool is_norm(const std::string& name) {
  return contains(name, ".ln1.") || contains(name, ".ln2.") || name.starts_with("head.norm.");
}
bool is_embedding(const std::string& name) { return name.starts_with("embedding."); }
bool is_residual_projection(const std::string& name) {
  return ends_with(name, "attention.out.weight") || ends_with(name, "attention.o.weight") ||
         ends_with(name, "mlp.fc2.weight") || ends_with(name, "mlp.down.weight");
}

// --- the reference model ---------------------------------------------------------------------

enum class family { gpt, llama };

struct arch {
  family kind = family::gpt;
  std::size_t vocab = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, seq = 0, layers = 0;
  bool tied = false;
  double theta = 0;                   // llama
  static constexpr double eps = 1e-5; // GPT-2's LayerNorm, Llama 2's RMSNorm
  [[nodiscard]] std::size_t head_dim() const { return hidden / heads; }
};

arch arch_of(const wl::gpt_config& c) {
  return {family::gpt, c.vocab, c.hidden, c.heads,          c.heads,
          c.ffn,       c.seq,   c.layers, c.tie_embeddings, 0.0};
}
arch arch_of(const wl::llama_config& c) {
  return {
      family::llama, c.vocab, c.hidden, c.heads,          c.kv_heads == 0 ? c.heads : c.kv_heads,
      c.ffn,         c.seq,   c.layers, c.tie_embeddings, c.rope_theta};
}

void add_to(dmat& a, const dmat& b) {
  for (std::size_t i = 0; i < a.flat().size(); ++i)
    a.flat()[i] += b.flat()[i];
}
dmat sum(const dmat& a, const dmat& b) {
  dmat s = a;
  add_to(s, b);
  return s;
}

double gelu(double x) { // the tanh approximation
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double gelu_derivative(double x) {
  const double c = std::sqrt(2.0 / 3.14159265358979323846);
  const double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }
double silu_derivative(double x) { return sigmoid(x) * (1.0 + x * (1.0 - sigmoid(x))); }

struct norm_cache {
  dmat xhat;
  std::vector<double> rstd;
};

// LayerNorm: y = (x - mean) / sqrt(var + eps) g + b.  RMSNorm: y = x / sqrt(mean(x^2) + eps) g.
dmat norm_forward(bool layer, const dmat& x, const dmat& g, const dmat* b, norm_cache& c) {
  const std::size_t n = x.cols();
  dmat y(x.rows(), n);
  c.xhat = dmat(x.rows(), n);
  c.rstd.assign(x.rows(), 0.0);
  for (std::size_t t = 0; t < x.rows(); ++t) {
    double mean = 0.0;
    if (layer) {
      for (std::size_t i = 0; i < n; ++i)
        mean += x(t, i);
      mean /= static_cast<double>(n);
    }
    double sq = 0.0;
    for (std::size_t i = 0; i < n; ++i)
      sq += (x(t, i) - mean) * (x(t, i) - mean);
    c.rstd[t] = 1.0 / std::sqrt(sq / static_cast<double>(n) + arch::eps);
    for (std::size_t i = 0; i < n; ++i) {
      c.xhat(t, i) = (x(t, i) - mean) * c.rstd[t];
      y(t, i) = c.xhat(t, i) * g(0, i) + (b != nullptr ? (*b)(0, i) : 0.0);
    }
  }
  return y;
}

// With e = dy g: LayerNorm dx = rstd (e - mean(e) - xhat mean(e xhat)); RMSNorm drops mean(e).
dmat norm_backward(bool layer, const dmat& dy, const dmat& g, const norm_cache& c, dmat& dg,
                   dmat* db) {
  const std::size_t n = dy.cols();
  dmat dx(dy.rows(), n);
  for (std::size_t t = 0; t < dy.rows(); ++t) {
    double me = 0.0, mex = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      me += dy(t, i) * g(0, i);
      mex += dy(t, i) * g(0, i) * c.xhat(t, i);
    }
    me /= static_cast<double>(n);
    mex /= static_cast<double>(n);
    for (std::size_t i = 0; i < n; ++i) {
      dx(t, i) = c.rstd[t] * (dy(t, i) * g(0, i) - (layer ? me : 0.0) - c.xhat(t, i) * mex);
      dg(0, i) += dy(t, i) * c.xhat(t, i);
      if (db != nullptr) (*db)(0, i) += dy(t, i);
    }
  }
  return dx;
}

// Rotary embedding of `heads` heads of d columns each, rotate_half: (x_i, x_{i+d/2}) turned by
// pos theta^(-2i/d); inverse: the other way (the gradient's).
void rope(dmat& m, std::size_t heads, std::size_t d, std::size_t seq, double theta, bool inverse) {
  for (std::size_t t = 0; t < m.rows(); ++t) {
    const auto pos = static_cast<double>(t % seq);
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < d / 2; ++i) {
        const double angle =
            pos * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const double cs = std::cos(angle), sn = inverse ? -std::sin(angle) : std::sin(angle);
        const double a = m(t, h * d + i), b = m(t, h * d + i + d / 2);
        m(t, h * d + i) = a * cs - b * sn;
        m(t, h * d + i + d / 2) = b * cs + a * sn;
      }
  }
}

class reference {
public:
  reference(const arch& a, const weights& w) : a_(a), w_(&w) {}

  /// The mean cross entropy over the targets that are not -100; keeps what backward needs.
  double forward(const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& targets) {
    const std::size_t n = ids.size();
    ids_ = ids;
    targets_ = targets;
    dmat x(n, a_.hidden);
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < a_.hidden; ++i) {
        x(t, i) = w("embedding.wte.weight")(static_cast<std::size_t>(ids[t]), i);
        if (gpt()) x(t, i) += w("embedding.wpe.weight")(t % a_.seq, i);
      }
    blocks_.assign(a_.layers, {});
    for (std::size_t l = 0; l < a_.layers; ++l)
      x = block_forward(l, x, blocks_[l]);
    normed_ = norm("head.norm.", x, final_norm_);
    logits_ = tl::ref_linear(normed_, w(output_name()), nullptr);
    double total = 0.0;
    counted_ = 0;
    probs_ = dmat(n, a_.vocab);
    for (std::size_t t = 0; t < n; ++t) {
      double top = logits_(t, 0);
      for (std::size_t v = 0; v < a_.vocab; ++v)
        top = std::max(top, logits_(t, v));
      double s = 0.0;
      for (std::size_t v = 0; v < a_.vocab; ++v)
        s += std::exp(logits_(t, v) - top);
      for (std::size_t v = 0; v < a_.vocab; ++v)
        probs_(t, v) = std::exp(logits_(t, v) - top) / s;
      if (targets[t] == -100) continue;
      ++counted_;
      total += std::log(s) + top - logits_(t, static_cast<std::size_t>(targets[t]));
    }
    return total / static_cast<double>(counted_);
  }

  /// Every parameter's gradient; tied, the token table's and the output layer's are both the sum.
  weights backward() {
    grads_.clear();
    const std::size_t n = ids_.size();
    dmat dlogits(n, a_.vocab);
    for (std::size_t t = 0; t < n; ++t) {
      if (targets_[t] == -100) continue;
      for (std::size_t v = 0; v < a_.vocab; ++v)
        dlogits(t, v) = (probs_(t, v) - (v == static_cast<std::size_t>(targets_[t]) ? 1.0 : 0.0)) /
                        static_cast<double>(counted_);
    }
    add_to(grad(output_name()), tl::ref_linear_dw(dlogits, normed_));
    dmat dx = norm_back("head.norm.", tl::ref_linear_dx(dlogits, w(output_name())), final_norm_);
    for (std::size_t l = a_.layers; l-- > 0;)
      dx = block_backward(l, dx, blocks_[l]);
    for (std::size_t t = 0; t < n; ++t)
      for (std::size_t i = 0; i < a_.hidden; ++i) {
        grad("embedding.wte.weight")(static_cast<std::size_t>(ids_[t]), i) += dx(t, i);
        if (gpt()) grad("embedding.wpe.weight")(t % a_.seq, i) += dx(t, i);
      }
    if (a_.tied) grads_["head.output.weight"] = grads_.at("embedding.wte.weight");
    return grads_;
  }

  [[nodiscard]] const dmat& logits() const { return logits_; }

private:
  struct block_cache {
    dmat x, a1, q, k, v, ctx, h, a2, pre, up, act; // q, k: rotated (Llama)
    norm_cache n1, n2;
    std::vector<dmat> probs; // (sequence, head): seq x seq
  };

  [[nodiscard]] bool gpt() const { return a_.kind == family::gpt; }
  // Llama with kv_heads 0 keeps GPT's fused per-head [q|k|v] rows.
  [[nodiscard]] bool fused(const std::string& p) const {
    return w_->count(p + "attention.qkv.weight") != 0;
  }
  [[nodiscard]] std::string output_name() const {
    return a_.tied ? "embedding.wte.weight" : "head.output.weight";
  }

  const dmat& w(const std::string& name) const {
    const auto it = w_->find(name);
    if (it == w_->end()) throw std::runtime_error("reference: the model has no parameter " + name);
    return it->second;
  }
  const dmat* bias(const std::string& name) const {
    const auto it = w_->find(name);
    return it == w_->end() ? nullptr : &it->second;
  }
  dmat& grad(const std::string& name) {
    const dmat& v = w(name);
    return grads_.try_emplace(name, v.rows(), v.cols()).first->second;
  }

  dmat norm(const std::string& p, const dmat& x, norm_cache& c) const {
    return gpt() ? norm_forward(true, x, w(p + "gamma"), &w(p + "beta"), c)
                 : norm_forward(false, x, w(p + "weight"), nullptr, c);
  }
  dmat norm_back(const std::string& p, const dmat& dy, const norm_cache& c) {
    if (gpt())
      return norm_backward(true, dy, w(p + "gamma"), c, grad(p + "gamma"), &grad(p + "beta"));
    return norm_backward(false, dy, w(p + "weight"), c, grad(p + "weight"), nullptr);
  }
  dmat linear(const std::string& p, const dmat& x) const {
    return tl::ref_linear(x, w(p + "weight"), bias(p + "bias"));
  }
  dmat linear_back(const std::string& p, const dmat& dy, const dmat& x) {
    add_to(grad(p + "weight"), tl::ref_linear_dw(dy, x));
    if (bias(p + "bias") != nullptr) add_to(grad(p + "bias"), tl::ref_colsum(dy, 0, dy.rows()));
    return tl::ref_linear_dx(dy, w(p + "weight"));
  }

  // Causal softmax attention of every (sequence, query head h) with kv head h / (heads / kv_heads).
  dmat attention(const dmat& q, const dmat& k, const dmat& v, std::vector<dmat>& probs) const {
    const std::size_t d = a_.head_dim(), group = a_.heads / a_.kv_heads, n = q.rows();
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    dmat ctx(n, a_.heads * d);
    probs.assign(n / a_.seq * a_.heads, dmat(a_.seq, a_.seq));
    for (std::size_t b = 0; b < n / a_.seq; ++b)
      for (std::size_t h = 0; h < a_.heads; ++h) {
        const std::size_t g = h / group, r0 = b * a_.seq;
        dmat& p = probs[b * a_.heads + h];
        for (std::size_t i = 0; i < a_.seq; ++i) {
          double top = -1e300;
          for (std::size_t j = 0; j <= i; ++j) {
            double s = 0.0;
            for (std::size_t e = 0; e < d; ++e)
              s += q(r0 + i, h * d + e) * k(r0 + j, g * d + e);
            p(i, j) = s * scale;
            top = std::max(top, p(i, j));
          }
          double z = 0.0;
          for (std::size_t j = 0; j <= i; ++j)
            z += (p(i, j) = std::exp(p(i, j) - top));
          for (std::size_t j = 0; j <= i; ++j)
            p(i, j) /= z;
          for (std::size_t e = 0; e < d; ++e) {
            double s = 0.0;
            for (std::size_t j = 0; j <= i; ++j)
              s += p(i, j) * v(r0 + j, g * d + e);
            ctx(r0 + i, h * d + e) = s;
          }
        }
      }
    return ctx;
  }
  // dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K, dK += scale dS^T Q.
  void attention_back(const dmat& dctx, const block_cache& c, dmat& dq, dmat& dk, dmat& dv) const {
    const std::size_t d = a_.head_dim(), group = a_.heads / a_.kv_heads, n = dctx.rows();
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    dq = dmat(n, a_.heads * d);
    dk = dmat(n, a_.kv_heads * d);
    dv = dmat(n, a_.kv_heads * d);
    for (std::size_t b = 0; b < n / a_.seq; ++b)
      for (std::size_t h = 0; h < a_.heads; ++h) {
        const std::size_t g = h / group, r0 = b * a_.seq;
        const dmat& p = c.probs[b * a_.heads + h];
        for (std::size_t i = 0; i < a_.seq; ++i) {
          std::vector<double> dp(i + 1);
          double rowsum = 0.0;
          for (std::size_t j = 0; j <= i; ++j) {
            for (std::size_t e = 0; e < d; ++e) {
              dp[j] += dctx(r0 + i, h * d + e) * c.v(r0 + j, g * d + e);
              dv(r0 + j, g * d + e) += p(i, j) * dctx(r0 + i, h * d + e);
            }
            rowsum += p(i, j) * dp[j];
          }
          for (std::size_t j = 0; j <= i; ++j) {
            const double ds = p(i, j) * (dp[j] - rowsum) * scale;
            for (std::size_t e = 0; e < d; ++e) {
              dq(r0 + i, h * d + e) += ds * c.k(r0 + j, g * d + e);
              dk(r0 + j, g * d + e) += ds * c.q(r0 + i, h * d + e);
            }
          }
        }
      }
  }

  dmat block_forward(std::size_t l, const dmat& x, block_cache& c) {
    const std::string p = "block" + std::to_string(l) + ".";
    const std::size_t d = a_.head_dim(), n = x.rows();
    c.x = x;
    c.a1 = norm(p + "ln1.", x, c.n1);
    if (fused(p)) { // head h's rows [3 h d, 3 h d + 3 d): q, k, v
      const dmat qkv = linear(p + "attention.qkv.", c.a1);
      c.q = dmat(n, a_.heads * d);
      c.k = dmat(n, a_.heads * d);
      c.v = dmat(n, a_.heads * d);
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t h = 0; h < a_.heads; ++h)
          for (std::size_t e = 0; e < d; ++e) {
            c.q(t, h * d + e) = qkv(t, 3 * h * d + e);
            c.k(t, h * d + e) = qkv(t, 3 * h * d + d + e);
            c.v(t, h * d + e) = qkv(t, 3 * h * d + 2 * d + e);
          }
    } else {
      c.q = linear(p + "attention.q.", c.a1);
      c.k = linear(p + "attention.k.", c.a1);
      c.v = linear(p + "attention.v.", c.a1);
    }
    if (!gpt()) {
      rope(c.q, a_.heads, d, a_.seq, a_.theta, false);
      rope(c.k, a_.kv_heads, d, a_.seq, a_.theta, false);
    }
    c.ctx = attention(c.q, c.k, c.v, c.probs);
    c.h = sum(x, linear(p + (fused(p) ? "attention.out." : "attention.o."), c.ctx));
    c.a2 = norm(p + "ln2.", c.h, c.n2);
    if (gpt()) {
      c.pre = linear(p + "mlp.fc1.", c.a2);
      c.act = c.pre;
      for (auto& e : c.act.flat())
        e = gelu(e);
      return sum(c.h, linear(p + "mlp.fc2.", c.act));
    }
    c.pre = linear(p + "mlp.gate.", c.a2);
    c.up = linear(p + "mlp.up.", c.a2);
    c.act = c.pre;
    for (std::size_t i = 0; i < c.act.flat().size(); ++i)
      c.act.flat()[i] = silu(c.pre.flat()[i]) * c.up.flat()[i];
    return sum(c.h, linear(p + "mlp.down.", c.act));
  }

  dmat block_backward(std::size_t l, const dmat& dy, const block_cache& c) {
    const std::string p = "block" + std::to_string(l) + ".";
    const std::size_t d = a_.head_dim(), n = dy.rows();
    dmat da2;
    if (gpt()) {
      dmat dpre = linear_back(p + "mlp.fc2.", dy, c.act);
      for (std::size_t i = 0; i < dpre.flat().size(); ++i)
        dpre.flat()[i] *= gelu_derivative(c.pre.flat()[i]);
      da2 = linear_back(p + "mlp.fc1.", dpre, c.a2);
    } else {
      const dmat dact = linear_back(p + "mlp.down.", dy, c.act);
      dmat dgate = dact, dup = dact;
      for (std::size_t i = 0; i < dact.flat().size(); ++i) {
        dgate.flat()[i] = dact.flat()[i] * c.up.flat()[i] * silu_derivative(c.pre.flat()[i]);
        dup.flat()[i] = dact.flat()[i] * silu(c.pre.flat()[i]);
      }
      da2 = sum(linear_back(p + "mlp.gate.", dgate, c.a2), linear_back(p + "mlp.up.", dup, c.a2));
    }
    const dmat dh = sum(dy, norm_back(p + "ln2.", da2, c.n2));
    const dmat dctx = linear_back(p + (fused(p) ? "attention.out." : "attention.o."), dh, c.ctx);
    dmat dq, dk, dv;
    attention_back(dctx, c, dq, dk, dv);
    if (!gpt()) {
      rope(dq, a_.heads, d, a_.seq, a_.theta, true);
      rope(dk, a_.kv_heads, d, a_.seq, a_.theta, true);
    }
    dmat da1;
    if (fused(p)) {
      dmat dqkv(n, 3 * a_.heads * d);
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t h = 0; h < a_.heads; ++h)
          for (std::size_t e = 0; e < d; ++e) {
            dqkv(t, 3 * h * d + e) = dq(t, h * d + e);
            dqkv(t, 3 * h * d + d + e) = dk(t, h * d + e);
            dqkv(t, 3 * h * d + 2 * d + e) = dv(t, h * d + e);
          }
      da1 = linear_back(p + "attention.qkv.", dqkv, c.a1);
    } else {
      da1 = sum(
          sum(linear_back(p + "attention.q.", dq, c.a1), linear_back(p + "attention.k.", dk, c.a1)),
          linear_back(p + "attention.v.", dv, c.a1));
    }
    return sum(dh, norm_back(p + "ln1.", da1, c.n1));
  }

  arch a_;
  const weights* w_;
  std::vector<std::int32_t> ids_, targets_;
  std::vector<block_cache> blocks_;
  norm_cache final_norm_;
  dmat normed_, logits_, probs_;
  std::size_t counted_ = 0;
  weights grads_;
};

// --- the data --------------------------------------------------------------------------------

struct batch_data {
  std::vector<std::int32_t> ids, targets;
};

batch_data make_batch(std::size_t vocab, std::size_t seq) {
  std::mt19937 g(11);
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab) - 1);
  batch_data b;
  for (std::size_t t = 0; t < batch * seq; ++t) {
    b.ids.push_back(token(g));
    b.targets.push_back(token(g));
  }
  for (const std::size_t t : {std::size_t{1}, seq + 2, 2 * seq - 1})
    b.targets[t] = -100; // not counted
  return b;
}

// Norm weights and biases start at 1 and 0 (checked below); here they move off, so that the
// comparison sees them. A function of the full index: every TP rank sets the same model.
double moved(const std::string& name, std::size_t index) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char ch : name)
    h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  const double u = wl::normal_at(17, h, index);
  return ends_with(name, ".bias") || ends_with(name, ".beta") ? 0.2 * u : 1.0 + 0.2 * u;
}

// --- weft's side -----------------------------------------------------------------------------

struct weft_run {
  double loss = 0;
  dmat logits;
  weights values, grads;
  std::size_t replicas = 0; // slices marked duplicate (a kv head another rank holds too)
};

struct shard {
  std::string name;
  std::size_t row0, col0;
  dmat value;
};

// Copies a rank's shard into the full matrix at (row0, col0).
void place(weights& into, const shard& s, std::size_t full_rows, std::size_t full_cols) {
  dmat& m = into.try_emplace(s.name, full_rows, full_cols).first->second;
  for (std::size_t r = 0; r < s.value.rows(); ++r)
    for (std::size_t c = 0; c < s.value.cols(); ++c)
      m(s.row0 + r, s.col0 + c) = s.value(r, c);
}
shard shard_of(const wl::parameter<double>& p, weft::matrix_view<double> v) {
  dmat m(v.rows(), v.cols());
  for (std::size_t r = 0; r < v.rows(); ++r)
    for (std::size_t c = 0; c < v.cols(); ++c)
      m(r, c) = v(r, c);
  return {p.name, p.row0, p.col0, std::move(m)};
}

template <class Model>
weft_run run_weft(int tp, const typename Model::config& config, const batch_data& data) {
  weft_run out;
  out.logits = dmat(data.ids.size(), config.vocab);
  std::mutex mu;
  std::vector<double> losses(static_cast<std::size_t>(tp));
  std::vector<shard> copies; // the slices of a kv head that another rank holds too
  tl::run_ranks(tp, [&](comm_t& c) {
    wl::sequential<Model, double, comm_t, wl::cblas> model(c, config, seed);
    for (auto& p : model.parameters()) {
      if (!is_bias(p.name) && !is_norm(p.name)) continue;
      for (std::size_t r = 0; r < p.value.rows(); ++r)
        for (std::size_t col = 0; col < p.value.cols(); ++col)
          p.value(r, col) = moved(p.name, (p.row0 + r) * p.full_cols + p.col0 + col);
    }
    model.zero_grad();
    const double loss = model.forward(data.ids, data.targets);
    model.backward();
    std::lock_guard lock(mu);
    losses[static_cast<std::size_t>(c.rank())] = loss;
    const auto vr = wl::split_range(config.vocab, tp, c.rank());
    const auto logits = model.logits();
    for (std::size_t t = 0; t < logits.rows(); ++t)
      for (std::size_t v = 0; v < logits.cols(); ++v)
        out.logits(t, vr.begin + v) = logits(t, v);
    for (auto& p : model.parameters()) {
      shard value = shard_of(p, p.value), grad = shard_of(p, p.grad);
      if (p.duplicate) {
        copies.push_back(std::move(grad));
        continue;
      }
      place(out.values, value, p.full_rows, p.full_cols);
      place(out.grads, grad, p.full_rows, p.full_cols);
    }
  });
  out.loss = losses[0];
  for (std::size_t r = 1; r < losses.size(); ++r)
    EXPECT_EQ(losses[r], losses[0]) << "rank " << r;
  out.replicas = copies.size();
  for (const auto& s : copies) { // the replica's gradient is the one the first copy has
    const dmat& full = out.grads.at(s.name);
    EXPECT_EQ(tl::rel_err(s.value, tl::block(full, s.row0, s.value.rows(), s.col0, s.value.cols())),
              0.0)
        << s.name << " replica";
  }
  return out;
}

double relative(double got, double want) { return std::abs(got - want) / std::abs(want); }

// The reference's gradient against central differences of its own loss, on four entries of each
// parameter (its largest among them), norm-wise over the parameter. Returns the worst.
double check_reference_gradients(const arch& a, weights w, const batch_data& data) {
  reference ref(a, w);
  (void)ref.forward(data.ids, data.targets);
  const weights g = ref.backward();
  EXPECT_EQ(g.size(), w.size());
  const double h = 1e-5;
  double worst = 0.0;
  std::mt19937 pick(3);
  for (const auto& [name, grad] : g) {
    if (a.tied && name == "head.output.weight") continue; // the token table itself
    const auto flat = grad.flat();
    const std::size_t top = static_cast<std::size_t>(
        std::max_element(flat.begin(), flat.end(),
                         [](double x, double y) { return std::abs(x) < std::abs(y); }) -
        flat.begin());
    const double scale = std::abs(flat[top]);
    EXPECT_GT(scale, 0.0) << name;
    for (const std::size_t i : {top, std::size_t{0}, flat.size() - 1, pick() % flat.size()}) {
      double& x = w.at(name).flat()[i];
      const double keep = x;
      x = keep + h;
      const double up = reference(a, w).forward(data.ids, data.targets);
      x = keep - h;
      const double down = reference(a, w).forward(data.ids, data.targets);
      x = keep;
      const double e = std::abs((up - down) / (2 * h) - flat[i]) / scale;
      EXPECT_LT(e, 1e-6) << name << " entry " << i << ": differences " << (up - down) / (2 * h)
                         << ", backward " << flat[i];
      worst = std::max(worst, e);
    }
  }
  return worst;
}

// weft at TP 1, 2 and 4 against the reference built from TP 1's weights.
template <class Model>
void matches_reference(const typename Model::config& config) {
  const arch a = arch_of(config);
  const batch_data data = make_batch(config.vocab, config.seq);
  const weft_run one = run_weft<Model>(1, config, data);
  const double fd = check_reference_gradients(a, one.values, data);
  reference ref(a, one.values);
  const double loss = ref.forward(data.ids, data.targets);
  const weights grads = ref.backward();
  ASSERT_GT(loss, 0.5);
  double worst = 0.0;
  for (const int tp : {1, 2, 4}) {
    SCOPED_TRACE("tp=" + std::to_string(tp));
    const weft_run r = tp == 1 ? one : run_weft<Model>(tp, config, data);
    EXPECT_EQ(r.replicas > 0, a.kv_heads < static_cast<std::size_t>(tp))
        << r.replicas << " replicated slices";
    const double le = relative(r.loss, loss);
    EXPECT_LT(le, tol) << "loss " << r.loss << " vs " << loss;
    const double ge = tl::rel_err(r.logits, ref.logits());
    EXPECT_LT(ge, tol) << "logits";
    worst = std::max({worst, le, ge});
    ASSERT_EQ(r.grads.size(), grads.size());
    for (const auto& [name, want] : grads) {
      ASSERT_TRUE(r.grads.count(name)) << name;
      EXPECT_EQ(tl::rel_err(r.values.at(name), one.values.at(name)), 0.0)
          << name << ": not TP 1's weights";
      const double e = tl::rel_err(r.grads.at(name), want);
      EXPECT_LT(e, tol) << name;
      worst = std::max(worst, e);
    }
  }
  std::printf(
      "[ model    ] loss %.6f; worst relative error vs the reference %.3g; reference vs "
      "differences %.3g\n",
      loss, worst, fd);
}

constexpr wl::gpt_config gpt_small{
    .vocab = 29, .hidden = 12, .heads = 4, .ffn = 20, .seq = 5, .layers = 2, .init_std = 0.3};
constexpr wl::llama_config llama_small{.vocab = 29,
                                       .hidden = 16,
                                       .heads = 4,
                                       .kv_heads = 2,
                                       .ffn = 20,
                                       .seq = 5,
                                       .layers = 2,
                                       .rope_theta = 100,
                                       .init_std = 0.3};

TEST(ModelReference, GptUntied) { matches_reference<wl::gpt_model>(gpt_small); }
TEST(ModelReference, GptTied) {
  auto c = gpt_small;
  c.tie_embeddings = true;
  matches_reference<wl::gpt_model>(c);
}
// Two kv heads: split at TP 2, each replicated on two ranks at TP 4.
TEST(ModelReference, LlamaGroupedQuery) { matches_reference<wl::llama_model>(llama_small); }
TEST(ModelReference, LlamaMultiHead) {
  auto c = llama_small;
  c.kv_heads = c.heads;
  matches_reference<wl::llama_model>(c);
}
// kv_heads 0: multi-head in GPT's fused per-head [q|k|v] layout, rotated.
TEST(ModelReference, LlamaFusedLayout) {
  auto c = llama_small;
  c.kv_heads = 0;
  matches_reference<wl::llama_model>(c);
}
TEST(ModelReference, LlamaTied) {
  auto c = llama_small;
  c.tie_embeddings = true;
  matches_reference<wl::llama_model>(c);
}

// --- initialisation and parameter groups -------------------------------------------------------

template <class Model>
void check_initialisation(const typename Model::config& config) {
  tl::run_ranks(1, [&](comm_t& c) {
    wl::sequential<Model, double, comm_t, wl::cblas> model(c, config, 3);
    const double residual = config.init_std / std::sqrt(2.0 * static_cast<double>(config.layers));
    std::size_t matrices = 0;
    for (const auto& p : model.parameters()) {
      const std::string& name = p.name;
      const std::size_t n = p.value.rows() * p.value.cols();
      double s = 0.0, s2 = 0.0;
      for (std::size_t r = 0; r < p.value.rows(); ++r)
        for (std::size_t col = 0; col < p.value.cols(); ++col) {
          s += p.value(r, col);
          s2 += p.value(r, col) * p.value(r, col);
        }
      const double mean = s / static_cast<double>(n);
      const double sd = std::sqrt(s2 / static_cast<double>(n) - mean * mean);
      if (is_bias(name) || ends_with(name, ".beta")) {
        EXPECT_EQ(s2, 0.0) << name << " starts at 0";
      } else if (is_norm(name)) {
        EXPECT_EQ(mean, 1.0) << name << " starts at 1";
        EXPECT_EQ(sd, 0.0) << name << " starts at 1";
      } else {
        ++matrices;
        const double want = is_residual_projection(name) ? residual : config.init_std;
        EXPECT_NEAR(sd, want, 0.1 * want) << name << " (" << n << " elements)";
        EXPECT_LT(std::abs(mean), 0.1 * want) << name;
      }
    }
    EXPECT_GE(matrices, 3 * config.layers);
  });
}

TEST(ModelReference, GptInitialisation) {
  check_initialisation<wl::gpt_model>(
      {.vocab = 64, .hidden = 256, .heads = 4, .seq = 16, .layers = 3});
}
TEST(ModelReference, LlamaInitialisation) {
  check_initialisation<wl::llama_model>(
      {.vocab = 64, .hidden = 256, .heads = 4, .kv_heads = 2, .ffn = 512, .seq = 16, .layers = 3});
}

// Decay: not for biases and norm weights; for every matrix; for the embedding tables unless
// decay_embeddings is false (the output layer is a matrix like the others).
template <class Model>
void check_groups(typename Model::config config) {
  for (const bool decay_embeddings : {true, false}) {
    config.decay_embeddings = decay_embeddings;
    SCOPED_TRACE(decay_embeddings ? "embeddings decay" : "embeddings exempt");
    tl::run_ranks(2, [&](comm_t& c) {
      wl::sequential<Model, double, comm_t, wl::cblas> model(c, config, 3);
      std::size_t decayed = 0, exempt = 0;
      for (const auto& p : model.parameters()) {
        const bool want = is_bias(p.name) || is_norm(p.name) ? false
                          : is_embedding(p.name)             ? decay_embeddings
                                                             : true;
        EXPECT_EQ(p.decay, want) << p.name;
        (p.decay ? decayed : exempt) += 1;
      }
      EXPECT_GT(decayed, 2 * config.layers);
      EXPECT_GT(exempt, 2 * config.layers);
    });
  }
}

// A tied model's head weight is the token table: the optimizer updates both copies, so they must
// be in the same group, or weight decay pulls them apart (decay_embeddings false: the table is
// exempt, its copy in the head must be too).
template <class Model>
void check_tied_group(typename Model::config config) {
  config.tie_embeddings = true;
  for (const bool decay_embeddings : {true, false}) {
    config.decay_embeddings = decay_embeddings;
    SCOPED_TRACE(decay_embeddings ? "embeddings decay" : "embeddings exempt");
    tl::run_ranks(1, [&](comm_t& c) {
      wl::sequential<Model, double, comm_t, wl::cblas> model(c, config, 3);
      std::map<std::string, bool> decay;
      for (const auto& p : model.parameters())
        decay[p.name] = p.decay;
      EXPECT_EQ(decay.at("embedding.wte.weight"), decay_embeddings);
      EXPECT_EQ(decay.at("head.output.weight"), decay.at("embedding.wte.weight"))
          << "the head's copy of the tied table is in another weight-decay group than the table";
    });
  }
}

TEST(ModelReference, GptDecayGroups) { check_groups<wl::gpt_model>(gpt_small); }
TEST(ModelReference, LlamaDecayGroups) { check_groups<wl::llama_model>(llama_small); }
TEST(ModelReference, GptTiedTableIsOneDecayGroup) { check_tied_group<wl::gpt_model>(gpt_small); }
TEST(ModelReference, LlamaTiedTableIsOneDecayGroup) {
  check_tied_group<wl::llama_model>(llama_small);
}

} // namespace
