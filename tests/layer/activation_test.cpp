// GELU (tanh approximation) and SiLU: forward against the formula evaluated in long double,
// backward against central finite differences of that formula, known values, extreme inputs, and
// shape errors.
#include <weft/layer/activation.hpp>

#include <gtest/gtest.h>

#include <cmath>

#include "layer/layer_support.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;

long double gelu_ref(long double x) {
  const long double pi = 3.141592653589793238462643383279502884L;
  return 0.5L * x * (1.0L + std::tanh(std::sqrt(2.0L / pi) * (x + 0.044715L * x * x * x)));
}

template <class T>
void check(double tol) {
  tl::dmat xd = tl::random_dmat(9, 7, 3, 4.0);
  tl::round_to<T>(xd);
  tl::dmat dyd = tl::random_dmat(9, 7, 4);
  tl::round_to<T>(dyd);
  tl::dmat y_ref(9, 7), dx_ref(9, 7);
  for (std::size_t i = 0; i < xd.size(); ++i) {
    const long double x = xd.flat()[i];
    const long double h = 1e-5L;
    y_ref.flat()[i] = static_cast<double>(gelu_ref(x));
    dx_ref.flat()[i] =
        static_cast<double>(dyd.flat()[i] * (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h));
  }
  const auto x = tl::to<T>(xd);
  const auto dy = tl::to<T>(dyd);
  weft::matrix<T> y(9, 7), dx(9, 7);
  wl::gelu_forward<T>(x, y.view());
  wl::gelu_backward<T>(x, dy, dx.view());
  EXPECT_LT(tl::rel_err(y, y_ref), tol);
  EXPECT_LT(tl::rel_err(dx, dx_ref), tol);
  // In place: dx may be dy.
  auto d2 = dy;
  wl::gelu_backward<T>(x, d2, d2.view());
  EXPECT_LT(tl::rel_err(d2, dx_ref), tol);
}

TEST(Gelu, FloatMatchesFormula) { check<float>(1e-6); }
TEST(Gelu, DoubleMatchesFormula) { check<double>(1e-9); } // bounded by the finite differences

TEST(Gelu, KnownValues) {
  weft::matrix<double> x(1, 3), y(1, 3);
  x(0, 0) = 0.0;
  x(0, 1) = 1.0;
  x(0, 2) = -1.0;
  wl::gelu_forward<double>(x, y.view());
  EXPECT_EQ(y(0, 0), 0.0);
  EXPECT_NEAR(y(0, 1), 0.8411919906082768, 1e-15); // 0.5 (1 + tanh(sqrt(2/pi) 1.044715))
  EXPECT_NEAR(y(0, 2), -0.15880800939172324, 1e-15);
}

TEST(Gelu, ExtremeInputsStayFinite) { // exp(-2u) overflows for large negative x
  for (float v : {-1e4f, -100.0f, -12.0f, 12.0f, 100.0f, 1e4f}) {
    weft::matrix<float> x(1, 1, v), y(1, 1), d(1, 1, 1.0f);
    wl::gelu_forward<float>(x, y.view());
    wl::gelu_backward<float>(x, d, d.view());
    EXPECT_EQ(y(0, 0), v > 0 ? v : 0.0f) << v; // x * 1 or x * 0 at float precision
    EXPECT_EQ(d(0, 0), v > 0 ? 1.0f : 0.0f) << v;
  }
}

TEST(Gelu, ShapeErrors) {
  weft::matrix<float> x(2, 3), y(3, 2);
  tl::expect_error([&] { wl::gelu_forward<float>(x, y.view()); },
                   "gelu_forward: y is 3 x 2, expected 2 x 3");
  tl::expect_error([&] { wl::gelu_backward<float>(x, x, y.view()); }, "gelu_backward: dx");
}

long double silu_ref(long double x) { return x / (1.0L + std::exp(-x)); }

template <class T>
void check_silu(double tol) {
  tl::dmat xd = tl::random_dmat(9, 7, 5, 8.0);
  tl::round_to<T>(xd);
  tl::dmat dyd = tl::random_dmat(9, 7, 6);
  tl::round_to<T>(dyd);
  tl::dmat y_ref(9, 7), dx_ref(9, 7);
  for (std::size_t i = 0; i < xd.size(); ++i) {
    const long double x = xd.flat()[i];
    const long double h = 1e-5L;
    y_ref.flat()[i] = static_cast<double>(silu_ref(x));
    dx_ref.flat()[i] =
        static_cast<double>(dyd.flat()[i] * (silu_ref(x + h) - silu_ref(x - h)) / (2 * h));
  }
  const auto x = tl::to<T>(xd);
  const auto dy = tl::to<T>(dyd);
  weft::matrix<T> y(9, 7), dx(9, 7);
  wl::silu_forward<T>(x, y.view());
  wl::silu_backward<T>(x, dy, dx.view());
  EXPECT_LT(tl::rel_err(y, y_ref), tol);
  EXPECT_LT(tl::rel_err(dx, dx_ref), tol);
  // In place: y may be x, dx may be dy.
  auto y2 = x;
  wl::silu_forward<T>(y2, y2.view());
  EXPECT_LT(tl::rel_err(y2, y_ref), tol);
  auto d2 = dy;
  wl::silu_backward<T>(x, d2, d2.view());
  EXPECT_LT(tl::rel_err(d2, dx_ref), tol);
}

TEST(Silu, FloatMatchesFormula) { check_silu<float>(1e-6); }
TEST(Silu, DoubleMatchesFormula) { check_silu<double>(1e-9); } // bounded by the finite differences

TEST(Silu, KnownValues) {
  weft::matrix<double> x(1, 3), y(1, 3), d(1, 3, 1.0);
  x(0, 0) = 0.0;
  x(0, 1) = 1.0;
  x(0, 2) = -2.0;
  wl::silu_forward<double>(x, y.view());
  wl::silu_backward<double>(x, d, d.view());
  EXPECT_EQ(y(0, 0), 0.0);
  EXPECT_NEAR(y(0, 1), 0.7310585786300049, 1e-15);   // 1 / (1 + e^-1)
  EXPECT_NEAR(y(0, 2), -0.23840584404423511, 1e-15); // -2 / (1 + e^2)
  EXPECT_EQ(d(0, 0), 0.5);
  EXPECT_NEAR(d(0, 1), 0.9276705118714867, 1e-15);   // s (1 + x (1 - s)) at s = sigmoid(1)
  EXPECT_NEAR(d(0, 2), -0.09078424878489548, 1e-15); // at s = sigmoid(-2)
}

TEST(Silu, ExtremeInputsStayFinite) { // exp(-x) overflows for large negative x
  for (float v : {-1e4f, -100.0f, 100.0f, 1e4f}) {
    weft::matrix<float> x(1, 1, v), y(1, 1), d(1, 1, 1.0f);
    wl::silu_forward<float>(x, y.view());
    wl::silu_backward<float>(x, d, d.view());
    EXPECT_EQ(y(0, 0), v > 0 ? v : 0.0f) << v;
    EXPECT_EQ(d(0, 0), v > 0 ? 1.0f : 0.0f) << v;
  }
}

TEST(Silu, ShapeErrors) {
  weft::matrix<float> x(2, 3), y(3, 2);
  tl::expect_error([&] { wl::silu_forward<float>(x, y.view()); },
                   "silu_forward: y is 3 x 2, expected 2 x 3");
  tl::expect_error([&] { wl::silu_backward<float>(x, y, x.view()); }, "silu_backward: dy is 3 x 2");
  tl::expect_error([&] { wl::silu_backward<float>(x, x, y.view()); }, "silu_backward: dx is 3 x 2");
}

} // namespace
