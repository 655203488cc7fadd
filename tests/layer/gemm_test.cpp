// The CBLAS policy against the reference GEMM, every transpose combination, odd shapes, sub-views
// with a leading dimension larger than the row, alpha/beta; and the shape check.
#include <weft/layer/cblas.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace {

using weft::layer::trans;

template <class T>
weft::matrix<T> random_matrix(std::size_t r, std::size_t c, std::mt19937& g) {
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  weft::matrix<T> m(r, c);
  for (auto& x : m.flat()) x = static_cast<T>(d(g));
  return m;
}

template <class T>
void check_all(double tol) {
  std::mt19937 g(7);
  for (auto ta : {trans::n, trans::t}) {
    for (auto tb : {trans::n, trans::t}) {
      for (auto [m, n, k] : {std::tuple{1, 1, 1}, std::tuple{5, 7, 3}, std::tuple{17, 1, 33}, std::tuple{64, 48, 80}}) {
        // Operands embedded in larger matrices, so ld > cols.
        auto big_a = random_matrix<T>(ta == trans::n ? m + 2 : k + 2, ta == trans::n ? k + 3 : m + 3, g);
        auto big_b = random_matrix<T>(tb == trans::n ? k + 1 : n + 1, tb == trans::n ? n + 4 : k + 4, g);
        auto a = big_a.view().rows_from(1, ta == trans::n ? m : k).cols_from(2, ta == trans::n ? k : m);
        auto b = big_b.view().rows_from(1, tb == trans::n ? k : n).cols_from(3, tb == trans::n ? n : k);
        auto c0 = random_matrix<T>(m, n + 2, g);
        auto c1 = c0;
        const T alpha = static_cast<T>(0.75);
        const T beta = static_cast<T>(-0.5);
        weft::layer::reference_gemm{}(ta, tb, alpha, weft::matrix_view<const T>(a), weft::matrix_view<const T>(b),
                                      beta, c0.view().cols_from(1, n));
        weft::layer::cblas{}(ta, tb, alpha, weft::matrix_view<const T>(a), weft::matrix_view<const T>(b), beta,
                             c1.view().cols_from(1, n));
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

TEST(Gemm, BetaZeroIgnoresNaNInOutput) {
  weft::matrix<double> a(2, 2, 1.0), b(2, 2, 1.0), c(2, 2, std::nan(""));
  weft::layer::cblas{}(trans::n, trans::n, 1.0, weft::matrix_view<const double>(a), weft::matrix_view<const double>(b),
                       0.0, c.view());
  for (double x : c.flat()) EXPECT_EQ(x, 2.0);
}

TEST(Gemm, ShapeMismatchIsAnError) {
  weft::matrix<float> a(2, 3), b(4, 5), c(2, 5);
  try {
    weft::layer::cblas{}(trans::n, trans::n, 1.0f, weft::matrix_view<const float>(a), weft::matrix_view<const float>(b),
                         0.0f, c.view());
    FAIL() << "expected weft::error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("do not multiply"), std::string::npos) << e.what();
  }
}

} // namespace
