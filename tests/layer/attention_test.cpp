// parallel_attention with grouped-query attention and rotary position embedding: a causal attention
// written out in the test in double from the full weights (projections, rotation, scores / sqrt(d),
// causal softmax, context, output) and its backward, itself checked by central finite differences;
// the layer at TP 1, 2, 3, 4 against it (outputs, dx, every parameter's value and gradient as its
// slice of the full tensor), in float and double, with and without bias, sequence parallelism and
// kept probabilities, in the fused multi-head layout and the grouped one (kv heads split over the
// ranks, and replicated on several); the same model at every TP size; micro-batches stashed and
// restored, their gradients accumulated; a device-like policy's results bit for bit; the errors.
#include <weft/layer/attention.hpp>
#include <weft/layer/init.hpp>
#include <weft/layer/rotary.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "layer/layer_support.hpp"
#include "layer/reversed_elements.hpp"

namespace {

namespace wl = weft::layer;
using namespace weft::test::layer;
using comm_t = weft::local::communicator;

constexpr std::uint64_t seed = 20261130;
constexpr std::uint64_t tensor_id = 5;
constexpr double init_std = 0.5; // large enough that the softmax is far from uniform
constexpr double out_init_std = 0.3;

// --- the reference ----------------------------------------------------------------------------

struct shape {
  std::size_t heads = 4, kv = 4, d = 4, seq = 6; // kv: key/value heads (the fused layout: heads)
  double theta = 0;                              // 0: no rotation
  [[nodiscard]] std::size_t hidden() const { return heads * d; }
};

// Weights, biases, or their gradients: q heads*d x hidden, k and v kv*d x hidden, o hidden x
// hidden, the biases 1 x their rows.
struct tensors {
  dmat wq, wk, wv, wo, bq, bk, bv, bo;
};

// Rotates (sign -1: back) the d columns from col0 of every row, position row % seq, angle
// pos * theta^(-2i/d) for the pair (i, i + d/2).
void rotate(dmat& m, std::size_t col0, const shape& s, double sign) {
  const std::size_t half = s.d / 2;
  for (std::size_t t = 0; t < m.rows(); ++t) {
    const double pos = static_cast<double>(t % s.seq);
    for (std::size_t i = 0; i < half; ++i) {
      const double angle =
          pos * std::pow(s.theta, -2.0 * static_cast<double>(i) / static_cast<double>(s.d));
      const double c = std::cos(angle), sn = sign * std::sin(angle);
      const double a = m(t, col0 + i), b = m(t, col0 + i + half);
      m(t, col0 + i) = a * c - b * sn;
      m(t, col0 + i + half) = b * c + a * sn;
    }
  }
}

struct forward_pass {
  dmat q, k, v, ctx, y; // q, k rotated
  std::vector<dmat> p;  // per (sequence, head): seq x seq, zero above the diagonal
};

forward_pass ref_forward(const shape& s, const tensors& w, const dmat& x, bool bias) {
  forward_pass f;
  f.q = ref_linear(x, w.wq, bias ? &w.bq : nullptr);
  f.k = ref_linear(x, w.wk, bias ? &w.bk : nullptr);
  f.v = ref_linear(x, w.wv, bias ? &w.bv : nullptr);
  if (s.theta != 0) {
    for (std::size_t h = 0; h < s.heads; ++h)
      rotate(f.q, h * s.d, s, 1.0);
    for (std::size_t g = 0; g < s.kv; ++g)
      rotate(f.k, g * s.d, s, 1.0);
  }
  const std::size_t batch = x.rows() / s.seq, group = s.heads / s.kv;
  f.ctx = dmat(x.rows(), s.hidden());
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      const std::size_t g = h / group;
      dmat p(s.seq, s.seq);
      for (std::size_t i = 0; i < s.seq; ++i) {
        double top = -1e300;
        for (std::size_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::size_t e = 0; e < s.d; ++e)
            dot += f.q(b * s.seq + i, h * s.d + e) * f.k(b * s.seq + j, g * s.d + e);
          p(i, j) = dot / std::sqrt(static_cast<double>(s.d));
          top = std::max(top, p(i, j));
        }
        double sum = 0.0;
        for (std::size_t j = 0; j <= i; ++j)
          sum += (p(i, j) = std::exp(p(i, j) - top));
        for (std::size_t j = 0; j <= i; ++j)
          p(i, j) /= sum;
        for (std::size_t e = 0; e < s.d; ++e) {
          double o = 0.0;
          for (std::size_t j = 0; j <= i; ++j)
            o += p(i, j) * f.v(b * s.seq + j, g * s.d + e);
          f.ctx(b * s.seq + i, h * s.d + e) = o;
        }
      }
      f.p.push_back(p);
    }
  }
  f.y = ref_linear(f.ctx, w.wo, bias ? &w.bo : nullptr);
  return f;
}

struct backward_pass {
  tensors g;
  dmat dx;
};

backward_pass ref_backward(const shape& s, const tensors& w, const dmat& x, const forward_pass& f,
                           const dmat& dy) {
  backward_pass out;
  const std::size_t tokens = x.rows(), batch = tokens / s.seq, group = s.heads / s.kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  out.g.wo = ref_linear_dw(dy, f.ctx);
  out.g.bo = ref_colsum(dy, 0, tokens);
  const dmat dctx = ref_linear_dx(dy, w.wo);
  dmat dq(tokens, s.heads * s.d), dk(tokens, s.kv * s.d), dv(tokens, s.kv * s.d);
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      const std::size_t g = h / group;
      const dmat& p = f.p[b * s.heads + h];
      for (std::size_t i = 0; i < s.seq; ++i) {
        const std::size_t ti = b * s.seq + i;
        std::vector<double> dp(i + 1);
        double dot = 0.0;
        for (std::size_t j = 0; j <= i; ++j) {
          const std::size_t tj = b * s.seq + j;
          for (std::size_t e = 0; e < s.d; ++e) {
            dp[j] += dctx(ti, h * s.d + e) * f.v(tj, g * s.d + e);
            dv(tj, g * s.d + e) += p(i, j) * dctx(ti, h * s.d + e);
          }
          dot += p(i, j) * dp[j];
        }
        for (std::size_t j = 0; j <= i; ++j) {
          const std::size_t tj = b * s.seq + j;
          const double ds = p(i, j) * (dp[j] - dot) * scale;
          for (std::size_t e = 0; e < s.d; ++e) {
            dq(ti, h * s.d + e) += ds * f.k(tj, g * s.d + e);
            dk(tj, g * s.d + e) += ds * f.q(ti, h * s.d + e);
          }
        }
      }
    }
  }
  if (s.theta != 0) {
    for (std::size_t h = 0; h < s.heads; ++h)
      rotate(dq, h * s.d, s, -1.0);
    for (std::size_t g = 0; g < s.kv; ++g)
      rotate(dk, g * s.d, s, -1.0);
  }
  out.g.wq = ref_linear_dw(dq, x);
  out.g.wk = ref_linear_dw(dk, x);
  out.g.wv = ref_linear_dw(dv, x);
  out.g.bq = ref_colsum(dq, 0, tokens);
  out.g.bk = ref_colsum(dk, 0, tokens);
  out.g.bv = ref_colsum(dv, 0, tokens);
  out.dx = ref_linear_dx(dq, w.wq);
  const dmat dxk = ref_linear_dx(dk, w.wk), dxv = ref_linear_dx(dv, w.wv);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t c = 0; c < s.hidden(); ++c)
      out.dx(t, c) += dxk(t, c) + dxv(t, c);
  return out;
}

// The reference's backward against central differences of its forward, L = sum(y .* r), on a
// grouped, rotated, biased case whose softmax is far from uniform.
TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  const shape s{.heads = 4, .kv = 2, .d = 4, .seq = 5, .theta = 50.0};
  const std::size_t tokens = 2 * s.seq;
  tensors w{random_dmat(s.heads * s.d, s.hidden(), 1, 0.6),
            random_dmat(s.kv * s.d, s.hidden(), 2, 0.6),
            random_dmat(s.kv * s.d, s.hidden(), 3, 0.6),
            random_dmat(s.hidden(), s.hidden(), 4, 0.6),
            random_dmat(1, s.heads * s.d, 5, 0.5),
            random_dmat(1, s.kv * s.d, 6, 0.5),
            random_dmat(1, s.kv * s.d, 7, 0.5),
            random_dmat(1, s.hidden(), 8, 0.5)};
  dmat x = random_dmat(tokens, s.hidden(), 9);
  const dmat r = random_dmat(tokens, s.hidden(), 10);
  const auto loss = [&] {
    const dmat y = ref_forward(s, w, x, true).y;
    double l = 0.0;
    for (std::size_t i = 0; i < tokens; ++i)
      for (std::size_t j = 0; j < s.hidden(); ++j)
        l += y(i, j) * r(i, j);
    return l;
  };
  const backward_pass g = ref_backward(s, w, x, ref_forward(s, w, x, true), r);
  std::size_t checked = 0;
  const auto check = [&](const std::string& what, const dmat& analytic, dmat& value) {
    const std::size_t n = value.rows() * value.cols();
    for (std::size_t k = 0; k < n; k += std::max<std::size_t>(1, n / 9)) {
      const std::size_t i = k / value.cols(), j = k % value.cols();
      const double keep = value(i, j), h = 1e-5;
      value(i, j) = keep + h;
      const double up = loss();
      value(i, j) = keep - h;
      const double down = loss();
      value(i, j) = keep;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic(i, j), numeric, 1e-7 * (1.0 + std::abs(numeric)))
          << what << "(" << i << "," << j << ")";
      ++checked;
    }
  };
  check("dx", g.dx, x);
  check("wq", g.g.wq, w.wq);
  check("wk", g.g.wk, w.wk);
  check("wv", g.g.wv, w.wv);
  check("wo", g.g.wo, w.wo);
  check("bq", g.g.bq, w.bq);
  check("bk", g.g.bk, w.bk);
  check("bv", g.g.bv, w.bv);
  check("bo", g.g.bo, w.bo);
  EXPECT_GT(checked, 70u);
}

// --- the layer against it ---------------------------------------------------------------------

// The full tensors by parameter name: the fused layout interleaves q, k, v per head (head h's at
// rows [3hd, 3hd + 3d)), the grouped one names them apart.
std::map<std::string, dmat> by_name(const shape& s, bool fused, const tensors& t, bool bias) {
  std::map<std::string, dmat> m;
  if (fused) {
    dmat w(3 * s.hidden(), s.hidden()), b(1, 3 * s.hidden());
    for (std::size_t h = 0; h < s.heads; ++h)
      for (std::size_t which = 0; which < 3; ++which) {
        const dmat& src = which == 0 ? t.wq : which == 1 ? t.wk : t.wv;
        const dmat& bsrc = which == 0 ? t.bq : which == 1 ? t.bk : t.bv;
        for (std::size_t e = 0; e < s.d; ++e) {
          for (std::size_t c = 0; c < s.hidden(); ++c)
            w((3 * h + which) * s.d + e, c) = src(h * s.d + e, c);
          b(0, (3 * h + which) * s.d + e) = bsrc(0, h * s.d + e);
        }
      }
    m["qkv.weight"] = w;
    m["out.weight"] = t.wo;
    if (bias) {
      m["qkv.bias"] = b;
      m["out.bias"] = t.bo;
    }
    return m;
  }
  m["q.weight"] = t.wq;
  m["k.weight"] = t.wk;
  m["v.weight"] = t.wv;
  m["o.weight"] = t.wo;
  if (bias) {
    m["q.bias"] = t.bq;
    m["k.bias"] = t.bk;
    m["v.bias"] = t.bv;
    m["o.bias"] = t.bo;
  }
  return m;
}

// The weights as the layer draws them (documented in attention.hpp: the input projection's full
// tensor from tensor_id, the output's from tensor_id + 1), rounded to T; random biases.
template <class T>
tensors model_weights(const shape& s, bool fused) {
  tensors t;
  const std::size_t hd = s.heads * s.d, kvd = s.kv * s.d;
  if (fused) {
    dmat full(3 * s.hidden(), s.hidden());
    wl::init_normal(full.view(), s.hidden(), 0, 0, seed, tensor_id, init_std);
    t.wq = dmat(hd, s.hidden());
    t.wk = dmat(hd, s.hidden());
    t.wv = dmat(hd, s.hidden());
    for (std::size_t h = 0; h < s.heads; ++h)
      for (std::size_t e = 0; e < s.d; ++e)
        for (std::size_t c = 0; c < s.hidden(); ++c) {
          t.wq(h * s.d + e, c) = full(3 * h * s.d + e, c);
          t.wk(h * s.d + e, c) = full(3 * h * s.d + s.d + e, c);
          t.wv(h * s.d + e, c) = full(3 * h * s.d + 2 * s.d + e, c);
        }
  } else {
    dmat full(hd + 2 * kvd, s.hidden());
    wl::init_normal(full.view(), s.hidden(), 0, 0, seed, tensor_id, init_std);
    t.wq = block(full, 0, hd, 0, s.hidden());
    t.wk = block(full, hd, kvd, 0, s.hidden());
    t.wv = block(full, hd + kvd, kvd, 0, s.hidden());
  }
  t.wo = dmat(s.hidden(), s.hidden());
  wl::init_normal(t.wo.view(), s.hidden(), 0, 0, seed, tensor_id + 1, out_init_std);
  t.bq = random_dmat(1, hd, 51, 0.5);
  t.bk = random_dmat(1, kvd, 52, 0.5);
  t.bv = random_dmat(1, kvd, 53, 0.5);
  t.bo = random_dmat(1, s.hidden(), 54, 0.5);
  for (dmat* m : {&t.wq, &t.wk, &t.wv, &t.wo, &t.bq, &t.bk, &t.bv, &t.bo})
    round_to<T>(*m);
  return t;
}

struct layer_case {
  std::size_t heads = 4, kv_heads = 0, d = 4; // kv_heads 0: the fused layout
  int tp = 1;
  bool bias = true;
  double theta = 100.0;
  [[nodiscard]] shape ref_shape() const {
    return {heads, kv_heads == 0 ? heads : kv_heads, d, 6, theta};
  }
  [[nodiscard]] wl::attention_options options() const {
    return {.kv_heads = kv_heads,
            .bias = bias,
            .rope_theta = theta,
            .init_std = init_std,
            .out_init_std = out_init_std};
  }
  [[nodiscard]] std::string str() const {
    return "heads " + std::to_string(heads) + " kv " + std::to_string(kv_heads) + " d " +
           std::to_string(d) + " tp " + std::to_string(tp) + (bias ? " bias" : " no bias") +
           " theta " + std::to_string(theta);
  }
};

template <class T>
dmat rounded(dmat m) {
  round_to<T>(m);
  return m;
}

template <class T>
dmat as_dmat(weft::matrix_view<T> v) {
  dmat m(v.rows(), v.cols());
  for (std::size_t i = 0; i < v.rows(); ++i)
    for (std::size_t j = 0; j < v.cols(); ++j)
      m(i, j) = static_cast<double>(v(i, j));
  return m;
}

// Sets every bias of the layer to its slice of the full biases (the layer starts them at zero).
template <class T>
void set_biases(std::vector<wl::parameter<T>>& ps, const std::map<std::string, dmat>& full) {
  for (auto& p : ps) {
    if (p.name.find("bias") == std::string::npos) continue;
    const dmat& b = full.at(p.name);
    for (std::size_t c = 0; c < p.value.cols(); ++c)
      p.value(0, c) = static_cast<T>(b(0, p.col0 + c));
  }
}

// Checks every parameter of a rank against its slice of the full tensors (values exactly, the
// gradients, after the sequence-parallel reduction, within tol), its metadata, and that the names
// are the layout's.
template <class T>
void check_parameters(std::vector<wl::parameter<T>>& ps, const std::map<std::string, dmat>& values,
                      const std::map<std::string, dmat>& grads, double tol, const layer_case& lc,
                      int rank, const std::string& where) {
  ASSERT_EQ(ps.size(), values.size()) << where;
  const std::size_t per_kv_replicas =
      lc.kv_heads != 0 && static_cast<std::size_t>(lc.tp) > lc.kv_heads
          ? static_cast<std::size_t>(lc.tp) / lc.kv_heads
          : 1;
  for (auto& p : ps) {
    ASSERT_TRUE(values.count(p.name)) << where << ": unexpected parameter " << p.name;
    const dmat& v = values.at(p.name);
    EXPECT_EQ(p.full_rows, v.rows()) << where << " " << p.name;
    EXPECT_EQ(p.full_cols, v.cols()) << where << " " << p.name;
    EXPECT_EQ(rel_err(p.value, block(v, p.row0, p.value.rows(), p.col0, p.value.cols())), 0.0)
        << where << " " << p.name;
    EXPECT_LT(
        rel_err(p.grad, block(grads.at(p.name), p.row0, p.grad.rows(), p.col0, p.grad.cols())), tol)
        << where << " " << p.name;
    const bool is_bias = p.name.find("bias") != std::string::npos;
    EXPECT_EQ(p.decay, !is_bias) << where << " " << p.name;
    const bool kv = p.name[0] == 'k' || p.name[0] == 'v';
    EXPECT_EQ(p.duplicate,
              kv && per_kv_replicas > 1 && static_cast<std::size_t>(rank) % per_kv_replicas != 0)
        << where << " " << p.name;
  }
}

template <class T, class SP>
void check_layer(const layer_case& lc, bool keep) {
  const shape s = lc.ref_shape();
  const bool fused = lc.kv_heads == 0;
  const std::size_t tokens = 2 * s.seq, hidden = s.hidden();
  const tensors w = model_weights<T>(s, fused);
  const dmat x = rounded<T>(random_dmat(tokens, hidden, 61));
  const dmat dy = rounded<T>(random_dmat(tokens, hidden, 62));
  const forward_pass f = ref_forward(s, w, x, lc.bias);
  const backward_pass g = ref_backward(s, w, x, f, dy);
  const auto values = by_name(s, fused, w, lc.bias);
  tensors twice = g.g;
  for (dmat* m :
       {&twice.wq, &twice.wk, &twice.wv, &twice.wo, &twice.bq, &twice.bk, &twice.bv, &twice.bo})
    *m = scaled(*m, 2.0);
  const auto grads = by_name(s, fused, twice, lc.bias);
  const double tol = tolerance<T>;
  run_ranks(lc.tp, [&](comm_t& c) {
    const std::string where = lc.str() + (SP::enabled ? " SP" : "") + (keep ? "" : " recompute") +
                              " rank " + std::to_string(c.rank()) + " " +
                              (sizeof(T) == 4 ? "float" : "double");
    wl::parallel_attention<T, comm_t, wl::cblas, SP> attn(c, hidden, lc.heads, s.seq, seed,
                                                          tensor_id, lc.options());
    attn.keep_probabilities(keep);
    auto ps = attn.parameters();
    set_biases(ps, values);
    const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(lc.tp) : tokens;
    const std::size_t row0 = SP::enabled ? static_cast<std::size_t>(c.rank()) * local : 0;
    const auto xl = to<T>(block(x, row0, local, 0, hidden));
    const auto dyl = to<T>(block(dy, row0, local, 0, hidden));
    weft::matrix<T> y(local, hidden), dx(local, hidden);
    attn.zero_grad();
    for (int pass = 0; pass < 2; ++pass) {
      attn.forward(xl.view(), y.view());
      EXPECT_LT(rel_err(y, block(f.y, row0, local, 0, hidden)), tol) << where;
      attn.backward(dyl.view(), dx.view());
      EXPECT_LT(rel_err(dx, block(g.dx, row0, local, 0, hidden)), tol) << where;
    }
    ps = attn.parameters();
    wl::reduce_sequence_parallel_grads(c, ps);
    check_parameters(ps, values, grads, tol, lc, c.rank(), where);
  });
}

template <class C>
class attention_layer : public ::testing::Test {};
template <class T, class SP>
struct config {
  using type = T;
  using sp = SP;
};
using configs =
    ::testing::Types<config<float, wl::no_sequence_parallel>,
                     config<double, wl::no_sequence_parallel>, config<float, wl::sequence_parallel>,
                     config<double, wl::sequence_parallel>>;
TYPED_TEST_SUITE(attention_layer, configs);

template <class C>
void sweep(layer_case lc, std::initializer_list<int> tps) {
  for (int tp : tps)
    for (bool bias : {true, false})
      for (bool keep : {true, false}) {
        lc.tp = tp;
        lc.bias = bias;
        check_layer<typename C::type, typename C::sp>(lc, keep);
      }
}

TYPED_TEST(attention_layer, MultiHeadFusedWithRotary) {
  sweep<TypeParam>({.heads = 4, .kv_heads = 0}, {1, 2, 4});
}
TYPED_TEST(attention_layer, MultiHeadFusedWithoutRotary) {
  sweep<TypeParam>({.heads = 4, .kv_heads = 0, .theta = 0}, {1, 2});
}
TYPED_TEST(attention_layer, MultiHeadInTheGroupedLayout) {
  sweep<TypeParam>({.heads = 4, .kv_heads = 4}, {1, 2, 4});
}
TYPED_TEST(attention_layer, KvHeadsSplitOverTheRanks) {
  sweep<TypeParam>({.heads = 8, .kv_heads = 4}, {1, 2, 4});
}
TYPED_TEST(attention_layer, KvHeadsReplicated) {
  sweep<TypeParam>({.heads = 8, .kv_heads = 2}, {2, 4});    // tp 4: each kv head on 2 ranks
  sweep<TypeParam>({.heads = 4, .kv_heads = 1}, {1, 2, 4}); // multi-query: on every rank
  sweep<TypeParam>({.heads = 2, .kv_heads = 1, .d = 8, .theta = 10000.0}, {2});
}
TYPED_TEST(attention_layer, ThreeRanks) {
  sweep<TypeParam>({.heads = 6, .kv_heads = 3}, {3});
  sweep<TypeParam>({.heads = 6, .kv_heads = 1}, {3});
  sweep<TypeParam>({.heads = 6, .kv_heads = 0}, {3});
}

// --- the same model at every TP size ---------------------------------------------------------

// Each TP size's shards, put back where their row0/col0 say: the same full tensors as at TP 1,
// every element held by exactly one shard not marked duplicate (and by the duplicates, equal).
TEST(Attention, SameModelAtEveryTpSize) {
  const layer_case lc{.heads = 8, .kv_heads = 2};
  const shape s = lc.ref_shape();
  std::map<int, std::map<std::string, dmat>> models;
  struct shard {
    std::string name;
    dmat value;
    std::size_t row0, col0, full_rows, full_cols;
    bool duplicate;
  };
  for (int tp : {1, 2, 4}) {
    std::vector<std::vector<shard>> shards(static_cast<std::size_t>(tp));
    run_ranks(tp, [&](comm_t& c) {
      wl::parallel_attention<double, comm_t> attn(c, s.hidden(), lc.heads, s.seq, seed, tensor_id,
                                                  lc.options());
      for (auto& p : attn.parameters()) {
        shards[static_cast<std::size_t>(c.rank())].push_back(
            {p.name, as_dmat(p.value), p.row0, p.col0, p.full_rows, p.full_cols, p.duplicate});
      }
    });
    std::map<std::string, dmat> full;
    std::map<std::string, std::vector<int>>
        owners; // shards not marked duplicate holding each element
    for (const auto& rank : shards) {
      for (const auto& p : rank) {
        auto& f = full.try_emplace(p.name, p.full_rows, p.full_cols).first->second;
        auto& o = owners.try_emplace(p.name, std::vector<int>(p.full_rows * p.full_cols, 0))
                      .first->second;
        for (std::size_t i = 0; i < p.value.rows(); ++i)
          for (std::size_t j = 0; j < p.value.cols(); ++j) {
            if (p.duplicate) { // a later replica: the first one (a lower rank) wrote the element
              EXPECT_EQ(f(p.row0 + i, p.col0 + j), p.value(i, j)) << p.name << " tp " << tp;
            } else {
              f(p.row0 + i, p.col0 + j) = p.value(i, j);
              ++o[(p.row0 + i) * p.full_cols + p.col0 + j];
            }
          }
      }
    }
    // The output projection's bias is replicated on every rank (a row-parallel bias), not a
    // duplicate: the reductions over the group leave it out by `replicated`.
    for (const auto& [name, o] : owners)
      for (int n : o)
        EXPECT_EQ(n, name == "o.bias" ? tp : 1) << name << " tp " << tp;
    models[tp] = full;
  }
  for (int tp : {2, 4}) {
    ASSERT_EQ(models[tp].size(), models[1].size());
    for (const auto& [name, f] : models[1])
      EXPECT_EQ(rel_err(models[tp][name], f), 0.0) << name << " tp " << tp;
  }
  // And what the layer drew is the documented stacking of one tensor.
  const auto want = by_name(s, false, model_weights<double>(s, false), true);
  for (const auto& name : {"q.weight", "k.weight", "v.weight", "o.weight"})
    EXPECT_EQ(rel_err(models[1][name], want.at(name)), 0.0) << name;
}

// --- micro-batches: stash, restore, accumulate -----------------------------------------------

// Two micro-batches forward, both stashed, then backward in turn: each backward uses its own
// activations, and the accumulated gradients are the sum of the two (a replicated kv head's
// reduction counts each micro-batch once).
template <class SP>
void two_micro_batches(bool keep) {
  const layer_case lc{.heads = 8, .kv_heads = 2, .tp = 4};
  const shape s = lc.ref_shape();
  const std::size_t tokens = 2 * s.seq, hidden = s.hidden();
  const tensors w = model_weights<double>(s, false);
  const dmat x1 = random_dmat(tokens, hidden, 71),
             x2 = scaled(random_dmat(tokens, hidden, 72), 1.5);
  const dmat dy1 = random_dmat(tokens, hidden, 73), dy2 = random_dmat(tokens, hidden, 74);
  const forward_pass f1 = ref_forward(s, w, x1, true), f2 = ref_forward(s, w, x2, true);
  const backward_pass g1 = ref_backward(s, w, x1, f1, dy1), g2 = ref_backward(s, w, x2, f2, dy2);
  tensors sum = g1.g;
  const auto add = [](dmat& a, const dmat& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      a.flat()[i] += b.flat()[i];
  };
  for (auto [a, b] :
       {std::pair{&sum.wq, &g2.g.wq}, std::pair{&sum.wk, &g2.g.wk}, std::pair{&sum.wv, &g2.g.wv},
        std::pair{&sum.wo, &g2.g.wo}, std::pair{&sum.bq, &g2.g.bq}, std::pair{&sum.bk, &g2.g.bk},
        std::pair{&sum.bv, &g2.g.bv}, std::pair{&sum.bo, &g2.g.bo}})
    add(*a, *b);
  const auto values = by_name(s, false, w, true);
  const auto grads = by_name(s, false, sum, true);
  run_ranks(lc.tp, [&](comm_t& c) {
    const std::string where = std::string("micro-batches") + (SP::enabled ? " SP" : "") +
                              (keep ? "" : " recompute") + " rank " + std::to_string(c.rank());
    wl::parallel_attention<double, comm_t, wl::cblas, SP> attn(c, hidden, lc.heads, s.seq, seed,
                                                               tensor_id, lc.options());
    attn.keep_probabilities(keep);
    auto ps = attn.parameters();
    set_biases(ps, values);
    const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(lc.tp) : tokens;
    const std::size_t row0 = SP::enabled ? static_cast<std::size_t>(c.rank()) * local : 0;
    const dmat x1l = block(x1, row0, local, 0, hidden), x2l = block(x2, row0, local, 0, hidden);
    const dmat dy1l = block(dy1, row0, local, 0, hidden), dy2l = block(dy2, row0, local, 0, hidden);
    dmat y(local, hidden), dx(local, hidden);
    attn.zero_grad();
    attn.forward(x1l.view(), y.view());
    EXPECT_LT(rel_err(y, block(f1.y, row0, local, 0, hidden)), 1e-12) << where;
    const std::size_t saved = attn.saved_bytes();
    EXPECT_GT(saved, 0u);
    auto a1 = attn.stash();
    EXPECT_EQ(attn.saved_bytes(), 0u) << where;
    attn.forward(x2l.view(), y.view());
    EXPECT_LT(rel_err(y, block(f2.y, row0, local, 0, hidden)), 1e-12) << where;
    auto a2 = attn.stash();
    attn.restore(std::move(a1));
    EXPECT_EQ(attn.saved_bytes(), saved) << where;
    attn.backward(dy1l.view(), dx.view());
    EXPECT_LT(rel_err(dx, block(g1.dx, row0, local, 0, hidden)), 1e-12) << where;
    attn.restore(std::move(a2));
    attn.backward(dy2l.view(), dx.view());
    EXPECT_LT(rel_err(dx, block(g2.dx, row0, local, 0, hidden)), 1e-12) << where;
    ps = attn.parameters();
    wl::reduce_sequence_parallel_grads(c, ps);
    check_parameters(ps, values, grads, 1e-12, lc, c.rank(), where);
    attn.release();
    EXPECT_EQ(attn.saved_bytes(), 0u) << where;
  });
}

TEST(Attention, StashedMicroBatchesAccumulateOnce) {
  for (bool keep : {true, false}) {
    two_micro_batches<wl::no_sequence_parallel>(keep);
    two_micro_batches<wl::sequence_parallel>(keep);
  }
}

// --- a device-like policy, the default options, errors ---------------------------------------

// Every step outside the GEMMs (rotation, the kv heads' copy and sum, the softmax) as a device runs
// it (each_element, visited backwards, heads stacked): bit for bit the host's.
TEST(Attention, ElementOrderDoesNotMatter) {
  const layer_case lc{.heads = 8, .kv_heads = 2, .tp = 4};
  const shape s = lc.ref_shape();
  const std::size_t tokens = 2 * s.seq, hidden = s.hidden();
  const auto x = to<float>(random_dmat(tokens, hidden, 81));
  const auto dy = to<float>(random_dmat(tokens, hidden, 82));
  for (bool keep : {true, false}) {
    run_ranks(lc.tp, [&](comm_t& c) {
      const reversed_elements device_like;
      wl::parallel_attention<float, comm_t> host(c, hidden, lc.heads, s.seq, seed, tensor_id,
                                                 lc.options());
      wl::parallel_attention<float, comm_t, reversed_elements> dev(
          c, hidden, lc.heads, s.seq, seed, tensor_id, lc.options(), device_like);
      host.keep_probabilities(keep);
      dev.keep_probabilities(keep);
      auto hp = host.parameters();
      auto dp = dev.parameters();
      const auto values = by_name(s, false, model_weights<float>(s, false), true);
      set_biases(hp, values);
      set_biases(dp, values);
      weft::matrix<float> y1(tokens, hidden), y2(tokens, hidden), dx1(tokens, hidden),
          dx2(tokens, hidden);
      host.forward(x.view(), y1.view());
      dev.forward(x.view(), y2.view());
      host.backward(dy.view(), dx1.view());
      dev.backward(dy.view(), dx2.view());
      EXPECT_GT(*device_like.steps, 0u);
      const auto same = [&](const std::string& what, auto a, auto b) {
        std::size_t differ = 0;
        for (std::size_t i = 0; i < a.rows(); ++i)
          for (std::size_t j = 0; j < a.cols(); ++j)
            differ += a(i, j) != b(i, j) ? 1 : 0;
        EXPECT_EQ(differ, 0u) << what << " rank " << c.rank() << " keep " << keep;
      };
      same("y", y1.view(), y2.view());
      same("dx", dx1.view(), dx2.view());
      hp = host.parameters();
      dp = dev.parameters();
      ASSERT_EQ(hp.size(), dp.size());
      for (std::size_t i = 0; i < hp.size(); ++i)
        same(hp[i].name, hp[i].grad, dp[i].grad);
    });
  }
}

// The options' defaults are GPT's attention: the original constructor's parameters, outputs and
// gradients, bit for bit.
TEST(Attention, DefaultOptionsAreTheMultiHeadConstructor) {
  const std::size_t hidden = 12, heads = 6, seq = 5, tokens = 10;
  const auto x = to<double>(scaled(random_dmat(tokens, hidden, 91), 30.0));
  const auto dy = to<double>(random_dmat(tokens, hidden, 92));
  run_ranks(2, [&](comm_t& c) {
    wl::parallel_attention<double, comm_t> a(c, hidden, heads, seq, seed, 7);
    wl::parallel_attention<double, comm_t> b(c, hidden, heads, seq, seed, 7,
                                             wl::attention_options{});
    weft::matrix<double> ya(tokens, hidden), yb(tokens, hidden), dxa(tokens, hidden),
        dxb(tokens, hidden);
    a.forward(x.view(), ya.view());
    b.forward(x.view(), yb.view());
    a.backward(dy.view(), dxa.view());
    b.backward(dy.view(), dxb.view());
    EXPECT_EQ(rel_err(yb, as_dmat(ya.view())), 0.0);
    EXPECT_EQ(rel_err(dxb, as_dmat(dxa.view())), 0.0);
    const auto pa = a.parameters(), pb = b.parameters();
    ASSERT_EQ(pa.size(), 4u);
    ASSERT_EQ(pb.size(), 4u);
    for (std::size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i].name, pb[i].name);
      EXPECT_EQ(rel_err(pb[i].value, as_dmat(pa[i].value)), 0.0) << pa[i].name;
      EXPECT_EQ(rel_err(pb[i].grad, as_dmat(pa[i].grad)), 0.0) << pa[i].name;
    }
    EXPECT_EQ(pa[0].name, "qkv.weight");
    EXPECT_EQ(pa[3].name, "out.bias");
  });
}

TEST(Attention, Errors) {
  run_ranks(1, [](comm_t& c) {
    expect_error(
        [&] { wl::parallel_attention<float, comm_t> a(c, 32, 8, 4, seed, 0, {.kv_heads = 3}); },
        "8 query heads do not divide into groups over 3 key/value heads");
    expect_error(
        [&] { wl::parallel_attention<float, comm_t> a(c, 12, 4, 4, seed, 0, {.rope_theta = 1e4}); },
        "head dimension 3 (hidden 12 / 4 heads) is odd");
    expect_error(
        [&] {
          wl::parallel_attention<float, comm_t> a(c, 12, 4, 4, seed, 0,
                                                  {.kv_heads = 2, .rope_theta = 1e4});
        },
        "head dimension 3");
    wl::parallel_attention<float, comm_t> fine(c, 12, 4, 4, seed, 0,
                                               {.kv_heads = 2}); // odd d without rotation
    expect_error([&] { (void)fine.qkv(); }, "no fused QKV projection");
    expect_error([] { (void)wl::rotary_table<float>(4, 5, 1e4); }, "head dimension 5 is odd");
  });
  run_ranks(4, [](comm_t& c) {
    expect_error(
        [&] { wl::parallel_attention<float, comm_t> a(c, 48, 12, 4, seed, 0, {.kv_heads = 6}); },
        "6 key/value heads and a tensor-parallel group of 4");
    expect_error(
        [&] { wl::parallel_attention<float, comm_t> a(c, 24, 6, 4, seed, 0, {.kv_heads = 2}); },
        "6 heads do not divide over a tensor-parallel group of 4");
  });
  run_ranks(3, [](comm_t& c) {
    expect_error(
        [&] { wl::parallel_attention<float, comm_t> a(c, 24, 6, 4, seed, 0, {.kv_heads = 2}); },
        "2 key/value heads and a tensor-parallel group of 3");
  });
}

} // namespace
