// parallel_swiglu_mlp (gate, up -> silu(gate) * up -> down) at TP 1..4, with an ffn size that
// divides by every TP size and one that does not divide by 3 or 4, with and without sequence
// parallelism, float and double, against the unsplit SwiGLU MLP written out in double here (its
// backward checked by finite differences of its forward): output, input gradient, every weight
// gradient, the deterministic init of every weight, and the communication (one all-reduce each
// way; with sequence parallelism one all-gather and one reduce-scatter each way). Also with a
// GEMM policy that runs the element-wise steps backwards, as a device may; two micro-batches
// stashed and restored; shape errors.
#include <weft/comm/traced.hpp>
#include <weft/layer/init.hpp>
#include <weft/layer/swiglu_mlp.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "layer/layer_support.hpp"
#include "layer/reversed_elements.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;
using tl::reversed_elements;
using weft::collective;

constexpr std::size_t tokens = 12, hidden = 6;
constexpr std::uint64_t seed = 5, id = 30;
constexpr double init_std = 0.02, out_init_std = 0.01;
constexpr double scale =
    40; // the weights the test puts in: the init's, scaled so silu sees its curved part

double silu(double v) { return v / (1.0 + std::exp(-v)); }
double silu_grad(double v) {
  const double s = 1.0 / (1.0 + std::exp(-v));
  return s + v * s * (1.0 - s);
}

struct swiglu_case {
  dmat x, dy, wg, wu, wd;
  dmat y, dx, dwg, dwu, dwd;
};

// y = (silu(x wg^T) * (x wu^T)) wd^T and its backward, with plain loops.
swiglu_case reference(dmat x, dmat dy, dmat wg, dmat wu, dmat wd) {
  const std::size_t n = x.rows(), h = x.cols(), f = wg.rows();
  swiglu_case c{x, dy, wg, wu, wd, dmat(n, h), dmat(n, h), dmat(f, h), dmat(f, h), dmat(h, f)};
  for (std::size_t t = 0; t < n; ++t) {
    std::vector<double> g(f), u(f), a(f), da(f), dg(f), du(f);
    for (std::size_t k = 0; k < f; ++k) {
      for (std::size_t i = 0; i < h; ++i) {
        g[k] += x(t, i) * wg(k, i);
        u[k] += x(t, i) * wu(k, i);
      }
      a[k] = silu(g[k]) * u[k];
    }
    for (std::size_t o = 0; o < h; ++o)
      for (std::size_t k = 0; k < f; ++k) {
        c.y(t, o) += a[k] * wd(o, k);
        da[k] += dy(t, o) * wd(o, k);
        c.dwd(o, k) += dy(t, o) * a[k];
      }
    for (std::size_t k = 0; k < f; ++k) {
      dg[k] = da[k] * u[k] * silu_grad(g[k]);
      du[k] = da[k] * silu(g[k]);
      for (std::size_t i = 0; i < h; ++i) {
        c.dx(t, i) += dg[k] * wg(k, i) + du[k] * wu(k, i);
        c.dwg(k, i) += dg[k] * x(t, i);
        c.dwu(k, i) += du[k] * x(t, i);
      }
    }
  }
  return c;
}

dmat init(std::size_t rows, std::size_t cols, std::uint64_t tensor_id, double stddev) {
  dmat w(rows, cols);
  wl::init_normal(w.view(), cols, 0, 0, seed, tensor_id, stddev);
  return w;
}

/// The case the layer is checked on: its own init scaled, inputs and weights rounded to T.
template <class T>
swiglu_case make_case(std::size_t ffn, std::size_t n = tokens, std::uint32_t data_seed = 1) {
  dmat x = tl::random_dmat(n, hidden, data_seed), dy = tl::random_dmat(n, hidden, data_seed + 1);
  dmat wg = tl::scaled(init(ffn, hidden, id, init_std), scale),
       wu = tl::scaled(init(ffn, hidden, id + 1, init_std), scale);
  dmat wd = tl::scaled(init(hidden, ffn, id + 2, out_init_std), 2 * scale);
  for (dmat* m : {&x, &dy, &wg, &wu, &wd})
    tl::round_to<T>(*m);
  return reference(x, dy, wg, wu, wd);
}

// The loss sum(dy * y): its central differences in every input and weight against the reference's
// gradients.
TEST(SwigluReference, BackwardMatchesFiniteDifferences) {
  const swiglu_case r =
      reference(tl::random_dmat(3, 4, 1, 2.0), tl::random_dmat(3, 4, 2), tl::random_dmat(5, 4, 3),
                tl::random_dmat(5, 4, 4), tl::random_dmat(4, 5, 5));
  const auto loss = [&](const swiglu_case& c) {
    const dmat y = reference(c.x, r.dy, c.wg, c.wu, c.wd).y;
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i)
      s += r.dy.flat()[i] * y.flat()[i];
    return s;
  };
  const double h = 1e-6;
  const auto check = [&](dmat swiglu_case::*in, dmat swiglu_case::*grad, const char* what) {
    for (std::size_t i = 0; i < (r.*in).size(); ++i) {
      swiglu_case p = r, m = r;
      (p.*in).flat()[i] += h;
      (m.*in).flat()[i] -= h;
      EXPECT_NEAR((r.*grad).flat()[i], (loss(p) - loss(m)) / (2 * h), 1e-7) << what << " " << i;
    }
  };
  check(&swiglu_case::x, &swiglu_case::dx, "x");
  check(&swiglu_case::wg, &swiglu_case::dwg, "gate");
  check(&swiglu_case::wu, &swiglu_case::dwu, "up");
  check(&swiglu_case::wd, &swiglu_case::dwd, "down");
}

template <class C>
class swiglu : public ::testing::Test {};
template <class T, class SP, class G = wl::cblas>
struct config {
  using type = T;
  using sp = SP;
  using gemm = G;
};
using configs =
    ::testing::Types<config<float, wl::no_sequence_parallel>,
                     config<double, wl::no_sequence_parallel>, config<float, wl::sequence_parallel>,
                     config<double, wl::sequence_parallel>,
                     config<float, wl::no_sequence_parallel, reversed_elements>,
                     config<double, wl::sequence_parallel, reversed_elements>>;
TYPED_TEST_SUITE(swiglu, configs);

/// Checks the rank's init against the full init, then puts in the case's weights.
template <class T>
void load_weights(std::vector<wl::parameter<T>>& ps, const swiglu_case& c, wl::range fr,
                  std::size_t ffn) {
  const dmat gate0 = init(ffn, hidden, id, init_std), up0 = init(ffn, hidden, id + 1, init_std);
  const dmat down0 = init(hidden, ffn, id + 2, out_init_std);
  for (std::size_t k = 0; k < fr.size(); ++k) {
    for (std::size_t j = 0; j < hidden; ++j) {
      EXPECT_NEAR(static_cast<double>(ps[0].value(k, j)), gate0(fr.begin + k, j), 1e-8);
      EXPECT_NEAR(static_cast<double>(ps[1].value(k, j)), up0(fr.begin + k, j), 1e-8);
      EXPECT_NEAR(static_cast<double>(ps[2].value(j, k)), down0(j, fr.begin + k), 1e-8);
      ps[0].value(k, j) = static_cast<T>(c.wg(fr.begin + k, j));
      ps[1].value(k, j) = static_cast<T>(c.wu(fr.begin + k, j));
      ps[2].value(j, k) = static_cast<T>(c.wd(j, fr.begin + k));
    }
  }
}

TYPED_TEST(swiglu, MatchesSerial) {
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  using G = typename TypeParam::gemm;
  const double tol = tl::tolerance<T>;
  for (std::size_t ffn : {12u, 10u}) {
    const swiglu_case ref = make_case<T>(ffn);
    for (int tp = 1; tp <= 4; ++tp) {
      tl::run_ranks(tp, [&](weft::local::communicator& c) {
        weft::traced<weft::local::communicator> comm(std::move(c), "tp");
        const G gemm;
        using mlp_type = wl::parallel_swiglu_mlp<T, decltype(comm), G, SP>;
        mlp_type m(comm, hidden, ffn, seed, id, typename mlp_type::options{init_std, out_init_std},
                   gemm);
        const wl::range fr = m.ffn_range();
        EXPECT_EQ(fr, wl::split_range(ffn, tp, comm.rank()));
        const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
        const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(comm.rank()) : 0;
        const std::string where = "ffn=" + std::to_string(ffn) + " tp=" + std::to_string(tp) +
                                  " rank " + std::to_string(comm.rank());
        auto ps = m.parameters();
        ASSERT_EQ(ps.size(), 3u);
        const std::vector<std::string> names = {"gate.weight", "up.weight", "down.weight"};
        for (std::size_t i = 0; i < 3; ++i) {
          EXPECT_EQ(ps[i].name, names[i]);
          EXPECT_FALSE(ps[i].replicated || ps[i].sequence_partial || ps[i].duplicate) << names[i];
          EXPECT_TRUE(ps[i].decay) << names[i];
          const bool down = i == 2;
          EXPECT_EQ(ps[i].row0, down ? 0 : fr.begin);
          EXPECT_EQ(ps[i].col0, down ? fr.begin : 0);
          EXPECT_EQ(ps[i].full_rows, down ? hidden : ffn);
          EXPECT_EQ(ps[i].full_cols, down ? ffn : hidden);
        }
        load_weights(ps, ref, fr, ffn);
        weft::matrix<T> yl(local, hidden), dxl(local, hidden);
        m.forward(tl::to<T>(tl::block(ref.x, row0, local, 0, hidden)), yl.view());
        const auto fwd = comm.ops();
        comm.clear();
        m.backward(tl::to<T>(tl::block(ref.dy, row0, local, 0, hidden)), dxl.view());
        const auto bwd = comm.ops();
        if constexpr (std::is_same_v<G, reversed_elements>) {
          // Every element-wise step went through the policy. Forward: the input's copy (SP: a copy
          // only at TP 1, else the all-gather), the product, down's input copy, the copy out of its
          // reduction (SP: at TP 1 only); backward: down's dy gather (SP: a copy at TP 1 only), the
          // product's gradients, dx's copy out of its reduction (SP: at TP 1 only).
          const std::size_t want = !SP::enabled ? 6 : tp == 1 ? 7 : 3;
          EXPECT_EQ(*gemm.steps, want) << where;
        }
        EXPECT_LT(tl::rel_err(yl, tl::block(ref.y, row0, local, 0, hidden)), tol) << where;
        EXPECT_LT(tl::rel_err(dxl, tl::block(ref.dx, row0, local, 0, hidden)), tol) << where;
        EXPECT_LT(tl::rel_err(ps[0].grad, tl::block(ref.dwg, fr.begin, fr.size(), 0, hidden)), tol)
            << where;
        EXPECT_LT(tl::rel_err(ps[1].grad, tl::block(ref.dwu, fr.begin, fr.size(), 0, hidden)), tol)
            << where;
        EXPECT_LT(tl::rel_err(ps[2].grad, tl::block(ref.dwd, 0, hidden, fr.begin, fr.size())), tol)
            << where;
        if (tp == 1) {
          EXPECT_TRUE(fwd.empty() && bwd.empty()) << where;
        } else if (SP::enabled) {
          for (const auto* ops : {&fwd, &bwd}) {
            ASSERT_EQ(ops->size(), 2u) << where;
            EXPECT_EQ((*ops)[0].kind, collective::all_gather) << where;
            EXPECT_EQ((*ops)[1].kind, collective::reduce_scatter) << where;
            EXPECT_EQ((*ops)[0].count + (*ops)[1].count, 2 * local * hidden) << where;
          }
        } else {
          const std::vector<weft::traced_op> one = {
              {collective::all_reduce, tokens * hidden, weft::dtype_of<T>, "tp"}};
          EXPECT_EQ(fwd, one) << where;
          EXPECT_EQ(bwd, one) << where;
        }
        m.zero_grad();
        for (const auto& p : ps)
          EXPECT_EQ(p.grad(0, 0), T{0}) << p.name;
      });
    }
  }
}

// Two micro-batches forward, each stashed; restored and run backward in the other order: each dx is
// its own micro-batch's and every weight gradient the sum of both.
template <class T, class SP>
void check_stash(int tp) {
  const std::size_t ffn = 10;
  const swiglu_case r1 = make_case<T>(ffn, tokens, 11), r2 = make_case<T>(ffn, tokens, 21);
  const double tol = tl::tolerance<T>;
  const auto sum = [](dmat a, const dmat& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      a.flat()[i] += b.flat()[i];
    return a;
  };
  tl::run_ranks(tp, [&](weft::local::communicator& comm) {
    using mlp_type = wl::parallel_swiglu_mlp<T, weft::local::communicator, wl::cblas, SP>;
    mlp_type m(comm, hidden, ffn, seed, id, typename mlp_type::options{init_std, out_init_std});
    const wl::range fr = m.ffn_range();
    const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
    const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(comm.rank()) : 0;
    auto ps = m.parameters();
    load_weights(ps, r1, fr, ffn);
    weft::matrix<T> y1(local, hidden), y2(local, hidden), dx1(local, hidden), dx2(local, hidden);
    m.forward(tl::to<T>(tl::block(r1.x, row0, local, 0, hidden)), y1.view());
    EXPECT_GT(m.saved_bytes(), 0u);
    auto a1 = m.stash();
    tl::expect_error(
        [&] { m.backward(tl::to<T>(tl::block(r1.dy, row0, local, 0, hidden)), dx1.view()); },
        "parallel_swiglu_mlp::backward: called before forward");
    m.forward(tl::to<T>(tl::block(r2.x, row0, local, 0, hidden)), y2.view());
    auto a2 = m.stash();
    m.restore(std::move(a2));
    m.backward(tl::to<T>(tl::block(r2.dy, row0, local, 0, hidden)), dx2.view());
    m.restore(std::move(a1));
    m.backward(tl::to<T>(tl::block(r1.dy, row0, local, 0, hidden)), dx1.view());
    const std::string where = "tp=" + std::to_string(tp) + " rank " + std::to_string(comm.rank());
    EXPECT_LT(tl::rel_err(y1, tl::block(r1.y, row0, local, 0, hidden)), tol) << where;
    EXPECT_LT(tl::rel_err(y2, tl::block(r2.y, row0, local, 0, hidden)), tol) << where;
    EXPECT_LT(tl::rel_err(dx1, tl::block(r1.dx, row0, local, 0, hidden)), tol) << where;
    EXPECT_LT(tl::rel_err(dx2, tl::block(r2.dx, row0, local, 0, hidden)), tol) << where;
    EXPECT_LT(
        tl::rel_err(ps[0].grad, tl::block(sum(r1.dwg, r2.dwg), fr.begin, fr.size(), 0, hidden)),
        tol)
        << where;
    EXPECT_LT(
        tl::rel_err(ps[1].grad, tl::block(sum(r1.dwu, r2.dwu), fr.begin, fr.size(), 0, hidden)),
        tol)
        << where;
    EXPECT_LT(
        tl::rel_err(ps[2].grad, tl::block(sum(r1.dwd, r2.dwd), 0, hidden, fr.begin, fr.size())),
        tol)
        << where;
    m.release();
    EXPECT_EQ(m.saved_bytes(), 0u);
  });
}

TEST(ParallelSwigluMlp, StashRestoreRoundTrip) {
  check_stash<float, wl::no_sequence_parallel>(1);
  check_stash<double, wl::no_sequence_parallel>(3);
  check_stash<double, wl::sequence_parallel>(2);
}

TEST(ParallelSwigluMlp, Errors) {
  tl::run_ranks(1, [](weft::local::communicator& c) {
    wl::parallel_swiglu_mlp<float, weft::local::communicator> m(c, 4, 8, 1, 1);
    weft::matrix<float> x(3, 4), bad(3, 5), short_rows(2, 4);
    tl::expect_error([&] { m.backward(x, x.view()); },
                     "parallel_swiglu_mlp::backward: called before forward");
    tl::expect_error([&] { m.forward(bad, x.view()); }, "parallel_swiglu_mlp::forward: x is 3 x 5");
    tl::expect_error([&] { m.forward(x, bad.view()); },
                     "parallel_swiglu_mlp::forward: y is 3 x 5, expected 3 x 4");
    m.forward(x, x.view());
    tl::expect_error([&] { m.backward(short_rows, x.view()); },
                     "parallel_swiglu_mlp::backward: dy is 2 x 4, expected 3 x 4");
    tl::expect_error([&] { m.backward(x, bad.view()); },
                     "parallel_swiglu_mlp::backward: dx is 3 x 5, expected 3 x 4");
    tl::expect_error(
        [&] { wl::parallel_swiglu_mlp<float, weft::local::communicator> z(c, 0, 8, 1, 1); },
        "parallel_swiglu_mlp: hidden and ffn must be positive");
    tl::expect_error(
        [&] { wl::parallel_swiglu_mlp<float, weft::local::communicator> z(c, 4, 0, 1, 1); },
        "parallel_swiglu_mlp: hidden and ffn must be positive");
  });
}

} // namespace
