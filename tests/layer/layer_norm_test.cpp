// layer_norm against a serial reference in double (the forward formula and the backward as the
// explicit Jacobian, itself checked by finite differences), with non-trivial gamma and beta, in
// float and double; under sequence parallelism at TP 1..4 each rank normalises its rows and the
// gamma/beta gradients, partial per rank, sum to the unsplit ones after
// reduce_sequence_parallel_grads. Also with its steps run in reverse order, as a device may.
#include <weft/layer/layer_norm.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <type_traits>

#include "layer/layer_support.hpp"
#include "layer/reversed_elements.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;

constexpr double eps = 1e-5;

struct ln_ref {
  dmat y, dx, dgamma, dbeta;
};

// y_j = xhat_j g_j + b_j, xhat_j = (x_j - mean) rstd;
// d xhat_j / d x_i = rstd (d_ij - 1/n - xhat_i xhat_j / n).
ln_ref reference(const dmat& x, const dmat& dy, const dmat& gamma, const dmat& beta) {
  const std::size_t rows = x.rows(), n = x.cols();
  ln_ref r{dmat(rows, n), dmat(rows, n), dmat(1, n), dmat(1, n)};
  for (std::size_t t = 0; t < rows; ++t) {
    double mean = 0, var = 0;
    for (std::size_t j = 0; j < n; ++j)
      mean += x(t, j) / n;
    for (std::size_t j = 0; j < n; ++j)
      var += (x(t, j) - mean) * (x(t, j) - mean) / n;
    const double rstd = 1.0 / std::sqrt(var + eps);
    std::vector<double> xh(n);
    for (std::size_t j = 0; j < n; ++j) {
      xh[j] = (x(t, j) - mean) * rstd;
      r.y(t, j) = xh[j] * gamma(0, j) + beta(0, j);
      r.dgamma(0, j) += dy(t, j) * xh[j];
      r.dbeta(0, j) += dy(t, j);
    }
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const double jac = rstd * ((i == j ? 1.0 : 0.0) - 1.0 / n - xh[i] * xh[j] / n);
        s += dy(t, j) * gamma(0, j) * jac;
      }
      r.dx(t, i) = s;
    }
  }
  return r;
}

TEST(LayerNormReference, JacobianMatchesFiniteDifferences) {
  const dmat x = tl::random_dmat(3, 6, 1, 2.0), dy = tl::random_dmat(3, 6, 2);
  const dmat g = tl::random_dmat(1, 6, 3), b = tl::random_dmat(1, 6, 4);
  const ln_ref r = reference(x, dy, g, b);
  const double h = 1e-6;
  for (std::size_t t = 0; t < 3; ++t) {
    for (std::size_t i = 0; i < 6; ++i) {
      dmat xp = x, xm = x;
      xp(t, i) += h;
      xm(t, i) -= h;
      const dmat yp = reference(xp, dy, g, b).y, ym = reference(xm, dy, g, b).y;
      double fd = 0;
      for (std::size_t j = 0; j < 6; ++j)
        fd += dy(t, j) * (yp(t, j) - ym(t, j)) / (2 * h);
      EXPECT_NEAR(r.dx(t, i), fd, 1e-7);
    }
  }
}

template <class T, class SP, class Exec = wl::host_policy>
void check(int tp, std::size_t hidden = 10, std::size_t tokens = 12) {
  dmat x = tl::random_dmat(tokens, hidden, 5, 3.0), dy = tl::random_dmat(tokens, hidden, 6);
  dmat g = tl::random_dmat(1, hidden, 7), b = tl::random_dmat(1, hidden, 8);
  for (dmat* m : {&x, &dy, &g, &b})
    tl::round_to<T>(*m);
  const ln_ref ref = reference(x, dy, g, b);
  const double tol = tl::tolerance<T>;
  tl::run_ranks(tp, [&](weft::local::communicator& comm) {
    const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
    const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(comm.rank()) : 0;
    const Exec exec;
    wl::layer_norm<T, SP, Exec> ln(hidden, eps, exec);
    for (std::size_t j = 0; j < hidden; ++j) {
      EXPECT_EQ(ln.gamma()(0, j), T{1});
      EXPECT_EQ(ln.beta()(0, j), T{0});
      ln.gamma()(0, j) = static_cast<T>(g(0, j));
      ln.beta()(0, j) = static_cast<T>(b(0, j));
    }
    weft::matrix<T> y(local, hidden), dx(local, hidden);
    ln.forward(tl::to<T>(tl::block(x, row0, local, 0, hidden)), y.view());
    ln.backward(tl::to<T>(tl::block(dy, row0, local, 0, hidden)), dx.view());
    EXPECT_LT(tl::rel_err(y, tl::block(ref.y, row0, local, 0, hidden)), tol);
    EXPECT_LT(tl::rel_err(dx, tl::block(ref.dx, row0, local, 0, hidden)), tol);
    auto ps = ln.parameters();
    ASSERT_EQ(ps.size(), 2u);
    EXPECT_TRUE(ps[0].replicated && ps[1].replicated);
    EXPECT_EQ(ps[0].sequence_partial, SP::enabled);
    wl::reduce_sequence_parallel_grads(comm, std::span<wl::parameter<T>>(ps));
    EXPECT_LT(tl::rel_err(ps[0].grad, ref.dgamma), tol) << "tp=" << tp;
    EXPECT_LT(tl::rel_err(ps[1].grad, ref.dbeta), tol) << "tp=" << tp;
    if constexpr (!std::is_same_v<Exec, wl::host_policy>) {
      EXPECT_EQ(
          *exec.steps,
          11u); // gamma's fill, the forward's 5 row stages, the gradients' 2, dx's 3 row stages
    }
    ln.zero_grad();
    EXPECT_EQ(ps[0].grad(0, 0), T{0});
  });
}

TEST(LayerNorm, MatchesReference) {
  check<float, wl::no_sequence_parallel>(1);
  check<double, wl::no_sequence_parallel>(1);
  check<float, wl::no_sequence_parallel>(2); // replicated: every rank holds every token
}

// With the element-wise steps run backwards, as a device may run them (one thread per row or
// column).
TEST(LayerNorm, DoesNotDependOnTheOrderOfItsSteps) {
  check<double, wl::no_sequence_parallel, tl::reversed_elements>(1);
  check<float, wl::sequence_parallel, tl::reversed_elements>(3);
}

// Rows wider and more rows than the lanes the sums are taken by (exec.hpp's row_lanes): every
// lane sums several columns (the statistics) or rows (the gamma and beta gradients), unevenly.
TEST(LayerNorm, MoreThanTheLanes) {
  check<float, wl::no_sequence_parallel>(1, 70);
  check<double, wl::sequence_parallel>(2, 70);
  check<double, wl::no_sequence_parallel, tl::reversed_elements>(1, 70);
  check<float, wl::no_sequence_parallel>(1, 70, 75);
  check<double, wl::sequence_parallel>(3, 70, 75); // 25 rows a rank
  check<double, wl::sequence_parallel>(2, 40, 72); // 36 rows a rank
  check<double, wl::no_sequence_parallel, tl::reversed_elements>(1, 70, 75);
}

TEST(LayerNorm, SequenceParallelGradsSumOverRanks) {
  for (int tp = 1; tp <= 4; ++tp) {
    check<float, wl::sequence_parallel>(tp);
    check<double, wl::sequence_parallel>(tp);
  }
}

TEST(LayerNorm, Errors) {
  wl::layer_norm<float> ln(4);
  weft::matrix<float> x(2, 4), bad(2, 5);
  tl::expect_error([&] { ln.backward(x, x.view()); }, "before forward");
  tl::expect_error([&] { ln.forward(bad, x.view()); }, "layer_norm::forward: x is 2 x 5");
  tl::expect_error([&] { ln.forward(x, bad.view()); }, "y is 2 x 5, expected 2 x 4");
  tl::expect_error([] { wl::layer_norm<double> z(0); }, "hidden must be positive");
}

} // namespace
