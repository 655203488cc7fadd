// The CBLAS policy against the reference GEMM, every transpose combination, odd shapes, sub-views
// with a leading dimension larger than the row, alpha/beta, one-row operands with a leading
// dimension below the row; and the shape check.
#include <weft/layer/cblas.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "layer/strided_batched_check.hpp"

namespace {

using weft::layer::trans;

template <class T>
weft::matrix<T> random_matrix(std::size_t r, std::size_t c, std::mt19937& g) {
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  weft::matrix<T> m(r, c);
  for (auto& x : m.flat())
    x = static_cast<T>(d(g));
  return m;
}

template <class T>
void check_all(double tol) {
  std::mt19937 g(7);
  for (auto ta : {trans::n, trans::t}) {
    for (auto tb : {trans::n, trans::t}) {
      for (auto [m, n, k] : {std::tuple{1, 1, 1}, std::tuple{5, 7, 3}, std::tuple{17, 1, 33},
                             std::tuple{64, 48, 80}}) {
        // Operands embedded in larger matrices, so ld > cols.
        auto big_a =
            random_matrix<T>(ta == trans::n ? m + 2 : k + 2, ta == trans::n ? k + 3 : m + 3, g);
        auto big_b =
            random_matrix<T>(tb == trans::n ? k + 1 : n + 1, tb == trans::n ? n + 4 : k + 4, g);
        auto a =
            big_a.view().rows_from(1, ta == trans::n ? m : k).cols_from(2, ta == trans::n ? k : m);
        auto b =
            big_b.view().rows_from(1, tb == trans::n ? k : n).cols_from(3, tb == trans::n ? n : k);
        auto c0 = random_matrix<T>(m, n + 2, g);
        auto c1 = c0;
        const T alpha = static_cast<T>(0.75);
        const T beta = static_cast<T>(-0.5);
        weft::layer::reference_gemm{}(ta, tb, alpha, weft::matrix_view<const T>(a),
                                      weft::matrix_view<const T>(b), beta,
                                      c0.view().cols_from(1, n));
        weft::layer::cblas{}(ta, tb, alpha, weft::matrix_view<const T>(a),
                             weft::matrix_view<const T>(b), beta, c1.view().cols_from(1, n));
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < n + 2; ++j) {
            ASSERT_NEAR(c0(i, j), c1(i, j), tol * (1.0 + std::abs(c0(i, j))))
                << "m=" << m << " n=" << n << " k=" << k << " ta=" << int(ta) << " tb=" << int(tb);
          }
        }
      }
    }
  }
}

TEST(Gemm, CblasMatchesReferenceFloat) { check_all<float>(1e-5); }
TEST(Gemm, CblasMatchesReferenceDouble) { check_all<double>(1e-13); }

// cblas has no batched call: gemm_strided_batched runs the strided views one after another.
TEST(Gemm, StridedBatchedMatchesEachBlock) {
  const auto same = [](const auto& m) -> const auto& { return m; };
  weft::test::layer::check_strided_batched<float>(weft::layer::cblas{}, same, same, 1e-5);
  weft::test::layer::check_strided_batched<double>(weft::layer::cblas{}, same, same, 1e-13);
}

// y (1 x n) = x W^T and z (m x 1) = A x^T with x and y single rows whose ld (0) is below their
// width, as a lone row may carry; BLAS checks ld >= cols, so the policy widens it. Against sums
// written out here.
TEST(Gemm, OneRowOperandsWithLdBelowTheirWidth) {
  std::mt19937 g(9);
  constexpr std::size_t m = 3, n = 7, k = 5;
  const auto x = random_matrix<double>(1, k, g);
  const auto w = random_matrix<double>(n, k, g);
  const auto a = random_matrix<double>(m, k, g);
  const weft::matrix_view<const double> x_row(x.data(), 1, k, 0);
  weft::matrix<double> y(1, n, std::nan(""));
  weft::layer::cblas{}(trans::n, trans::t, 1.0, x_row, weft::matrix_view<const double>(w.view()),
                       0.0, weft::matrix_view<double>(y.data(), 1, n, 0));
  for (std::size_t j = 0; j < n; ++j) {
    double want = 0;
    for (std::size_t c = 0; c < k; ++c)
      want += x(0, c) * w(j, c);
    EXPECT_NEAR(y(0, j), want, 1e-14) << j;
  }
  weft::matrix<double> z(m, 1, std::nan(""));
  weft::layer::cblas{}(trans::n, trans::t, 1.0, weft::matrix_view<const double>(a.view()), x_row,
                       0.0, z.view());
  for (std::size_t i = 0; i < m; ++i) {
    double want = 0;
    for (std::size_t c = 0; c < k; ++c)
      want += a(i, c) * x(0, c);
    EXPECT_NEAR(z(i, 0), want, 1e-14) << i;
  }
}

TEST(Gemm, BetaZeroIgnoresNaNInOutput) {
  weft::matrix<double> a(2, 2, 1.0), b(2, 2, 1.0), c(2, 2, std::nan(""));
  weft::layer::cblas{}(trans::n, trans::n, 1.0, weft::matrix_view<const double>(a),
                       weft::matrix_view<const double>(b), 0.0, c.view());
  for (double x : c.flat())
    EXPECT_EQ(x, 2.0);
}

TEST(Gemm, ShapeMismatchIsAnError) {
  weft::matrix<float> a(2, 3), b(4, 5), c(2, 5);
  try {
    weft::layer::cblas{}(trans::n, trans::n, 1.0f, weft::matrix_view<const float>(a),
                         weft::matrix_view<const float>(b), 0.0f, c.view());
    FAIL() << "expected weft::error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("do not multiply"), std::string::npos) << e.what();
  }
}

} // namespace
