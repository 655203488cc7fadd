// rms_norm against a serial reference in double (the forward formula and the backward as the
// explicit Jacobian, itself checked by finite differences), with a non-trivial gamma, in float and
// double; under sequence parallelism at TP 1..4 each rank normalises its rows and gamma's
// gradient, partial per rank, sums to the unsplit one after reduce_sequence_parallel_grads. Also
// with its steps run in reverse order, as a device may; two micro-batches stashed and restored.
#include <weft/layer/rms_norm.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <type_traits>
#include <vector>

#include "layer/layer_support.hpp"
#include "layer/reversed_elements.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;

struct rms_ref {
  dmat y, dx, dgamma;
};

// y_j = xhat_j g_j, xhat_j = x_j rstd, rstd = (sum_k x_k^2 / n + eps)^(-1/2);
// d xhat_j / d x_i = rstd d_ij - x_j rstd^3 x_i / n = rstd (d_ij - xhat_i xhat_j / n).
rms_ref reference(const dmat& x, const dmat& dy, const dmat& gamma, double eps) {
  const std::size_t rows = x.rows(), n = x.cols();
  rms_ref r{dmat(rows, n), dmat(rows, n), dmat(1, n)};
  for (std::size_t t = 0; t < rows; ++t) {
    double ms = 0;
    for (std::size_t j = 0; j < n; ++j)
      ms += x(t, j) * x(t, j) / n;
    const double rstd = 1.0 / std::sqrt(ms + eps);
    std::vector<double> xh(n);
    for (std::size_t j = 0; j < n; ++j) {
      xh[j] = x(t, j) * rstd;
      r.y(t, j) = xh[j] * gamma(0, j);
      r.dgamma(0, j) += dy(t, j) * xh[j];
    }
    for (std::size_t i = 0; i < n; ++i) {
      double s = 0;
      for (std::size_t j = 0; j < n; ++j)
        s += dy(t, j) * gamma(0, j) * rstd * ((i == j ? 1.0 : 0.0) - xh[i] * xh[j] / n);
      r.dx(t, i) = s;
    }
  }
  return r;
}

// The loss sum(dy * y): its central differences in x and in gamma against the reference's dx and
// dgamma.
TEST(RmsNormReference, BackwardMatchesFiniteDifferences) {
  const double eps = 1e-5;
  const dmat x = tl::random_dmat(3, 6, 1, 2.0), dy = tl::random_dmat(3, 6, 2),
             g = tl::random_dmat(1, 6, 3);
  const rms_ref r = reference(x, dy, g, eps);
  const auto loss = [&](const dmat& xx, const dmat& gg) {
    const dmat y = reference(xx, dy, gg, eps).y;
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i)
      s += dy.flat()[i] * y.flat()[i];
    return s;
  };
  const double h = 1e-6;
  for (std::size_t t = 0; t < 3; ++t) {
    for (std::size_t i = 0; i < 6; ++i) {
      dmat xp = x, xm = x;
      xp(t, i) += h;
      xm(t, i) -= h;
      EXPECT_NEAR(r.dx(t, i), (loss(xp, g) - loss(xm, g)) / (2 * h), 1e-7);
    }
  }
  for (std::size_t j = 0; j < 6; ++j) {
    dmat gp = g, gm = g;
    gp(0, j) += h;
    gm(0, j) -= h;
    EXPECT_NEAR(r.dgamma(0, j), (loss(x, gp) - loss(x, gm)) / (2 * h), 1e-7);
  }
}

template <class T, class SP, class Exec = wl::host_policy>
void check(int tp, std::size_t hidden = 10, std::size_t tokens = 12, double eps = 1e-5) {
  dmat x = tl::random_dmat(tokens, hidden, 5, 3.0), dy = tl::random_dmat(tokens, hidden, 6);
  dmat g = tl::random_dmat(1, hidden, 7);
  for (dmat* m : {&x, &dy, &g})
    tl::round_to<T>(*m);
  const rms_ref ref = reference(x, dy, g, eps);
  const double tol = tl::tolerance<T>;
  tl::run_ranks(tp, [&](weft::local::communicator& comm) {
    const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
    const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(comm.rank()) : 0;
    const Exec exec;
    wl::rms_norm<T, SP, Exec> norm(hidden, eps, exec);
    for (std::size_t j = 0; j < hidden; ++j) {
      EXPECT_EQ(norm.gamma()(0, j), T{1});
      norm.gamma()(0, j) = static_cast<T>(g(0, j));
    }
    // In place: y over x, dx over dy.
    auto y = tl::to<T>(tl::block(x, row0, local, 0, hidden));
    auto dx = tl::to<T>(tl::block(dy, row0, local, 0, hidden));
    norm.forward(y, y.view());
    EXPECT_EQ(norm.saved_bytes(), (local * hidden + local) * sizeof(double));
    norm.backward(dx, dx.view());
    const std::string where = "tp=" + std::to_string(tp) + " rank " + std::to_string(comm.rank());
    EXPECT_LT(tl::rel_err(y, tl::block(ref.y, row0, local, 0, hidden)), tol) << where;
    EXPECT_LT(tl::rel_err(dx, tl::block(ref.dx, row0, local, 0, hidden)), tol) << where;
    auto ps = norm.parameters();
    ASSERT_EQ(ps.size(), 1u);
    EXPECT_EQ(ps[0].name, "weight");
    EXPECT_TRUE(ps[0].replicated);
    EXPECT_EQ(ps[0].sequence_partial, SP::enabled);
    EXPECT_FALSE(ps[0].decay);
    EXPECT_FALSE(ps[0].duplicate);
    EXPECT_EQ(ps[0].row0 + ps[0].col0, 0u);
    EXPECT_EQ(ps[0].full_rows, 1u);
    EXPECT_EQ(ps[0].full_cols, hidden);
    wl::reduce_sequence_parallel_grads(comm, std::span<wl::parameter<T>>(ps));
    EXPECT_LT(tl::rel_err(ps[0].grad, ref.dgamma), tol) << where;
    if constexpr (!std::is_same_v<Exec, wl::host_policy>) {
      EXPECT_EQ(
          *exec.steps,
          9u); // gamma's fill, the forward's 3 row stages, the gradient's 2, dx's 3 row stages
    }
    norm.zero_grad();
    EXPECT_EQ(ps[0].grad(0, 0), T{0});
  });
}

TEST(RmsNorm, MatchesReference) {
  check<float, wl::no_sequence_parallel>(1);
  check<double, wl::no_sequence_parallel>(1);
  check<double, wl::no_sequence_parallel>(1, 10, 12, 1e-6);
  check<float, wl::no_sequence_parallel>(2); // replicated: every rank holds every token
}

// With the element-wise steps run backwards, as a device may run them.
TEST(RmsNorm, DoesNotDependOnTheOrderOfItsSteps) {
  check<double, wl::no_sequence_parallel, tl::reversed_elements>(1);
  check<float, wl::sequence_parallel, tl::reversed_elements>(3);
}

// Rows wider and more rows than the lanes the sums are taken by (exec.hpp's row_lanes).
TEST(RmsNorm, MoreThanTheLanes) {
  check<float, wl::no_sequence_parallel>(1, 70, 75);
  check<double, wl::sequence_parallel>(3, 70, 75); // 25 rows a rank
  check<double, wl::no_sequence_parallel, tl::reversed_elements>(1, 70, 75);
}

TEST(RmsNorm, SequenceParallelGradsSumOverRanks) {
  for (int tp = 1; tp <= 4; ++tp) {
    check<float, wl::sequence_parallel>(tp);
    check<double, wl::sequence_parallel>(tp);
  }
}

// Two micro-batches forward, each stashed; restored and run backward in the other order: each dx
// is its own micro-batch's and gamma's gradient the sum of both.
template <class T>
void check_stash() {
  const std::size_t hidden = 9, rows = 5;
  const double eps = 1e-5;
  dmat x1 = tl::random_dmat(rows, hidden, 11, 2.0), x2 = tl::random_dmat(rows, hidden, 12, 2.0);
  dmat dy1 = tl::random_dmat(rows, hidden, 13), dy2 = tl::random_dmat(rows, hidden, 14);
  dmat g = tl::random_dmat(1, hidden, 15);
  for (dmat* m : {&x1, &x2, &dy1, &dy2, &g})
    tl::round_to<T>(*m);
  const rms_ref r1 = reference(x1, dy1, g, eps), r2 = reference(x2, dy2, g, eps);
  dmat dgamma(1, hidden);
  for (std::size_t j = 0; j < hidden; ++j)
    dgamma(0, j) = r1.dgamma(0, j) + r2.dgamma(0, j);

  wl::rms_norm<T> norm(hidden, eps);
  for (std::size_t j = 0; j < hidden; ++j)
    norm.gamma()(0, j) = static_cast<T>(g(0, j));
  weft::matrix<T> y1(rows, hidden), y2(rows, hidden), dx1(rows, hidden), dx2(rows, hidden);
  norm.forward(tl::to<T>(x1), y1.view());
  auto a1 = norm.stash();
  EXPECT_EQ(norm.saved_bytes(), 0u);
  tl::expect_error([&] { norm.backward(tl::to<T>(dy1), dx1.view()); },
                   "rms_norm::backward: called before forward");
  norm.forward(tl::to<T>(x2), y2.view());
  auto a2 = norm.stash();
  norm.restore(std::move(a2));
  norm.backward(tl::to<T>(dy2), dx2.view());
  norm.restore(std::move(a1));
  norm.backward(tl::to<T>(dy1), dx1.view());
  const double tol = tl::tolerance<T>;
  EXPECT_LT(tl::rel_err(y1, r1.y), tol);
  EXPECT_LT(tl::rel_err(y2, r2.y), tol);
  EXPECT_LT(tl::rel_err(dx1, r1.dx), tol);
  EXPECT_LT(tl::rel_err(dx2, r2.dx), tol);
  EXPECT_LT(tl::rel_err(norm.parameters()[0].grad, dgamma), tol);
  norm.release();
  EXPECT_EQ(norm.saved_bytes(), 0u);
  tl::expect_error([&] { norm.backward(tl::to<T>(dy1), dx1.view()); }, "called before forward");
}

TEST(RmsNorm, StashRestoreRoundTrip) {
  check_stash<float>();
  check_stash<double>();
}

TEST(RmsNorm, Errors) {
  wl::rms_norm<float> norm(4);
  weft::matrix<float> x(2, 4), bad(2, 5), short_rows(3, 4);
  tl::expect_error([&] { norm.backward(x, x.view()); }, "before forward");
  tl::expect_error([&] { norm.forward(bad, x.view()); }, "rms_norm::forward: x is 2 x 5");
  tl::expect_error([&] { norm.forward(x, bad.view()); },
                   "rms_norm::forward: y is 2 x 5, expected 2 x 4");
  norm.forward(x, x.view());
  tl::expect_error([&] { norm.backward(short_rows, x.view()); },
                   "rms_norm::backward: dy is 3 x 4, expected 2 x 4");
  tl::expect_error([&] { norm.backward(x, bad.view()); },
                   "rms_norm::backward: dx is 2 x 5, expected 2 x 4");
  tl::expect_error([] { wl::rms_norm<double> z(0); }, "rms_norm: hidden must be positive");
  tl::expect_error([] { wl::rms_norm<double> z(4, 0.0); }, "rms_norm: eps must be positive");
}

} // namespace
