// The device path of the layers: weft::layer::cublas (row-major through the column-major call)
// against reference_gemm on the host, every transpose combination, odd shapes, operands embedded
// in larger matrices (ld > cols), alpha/beta, k = 0, a one-row view; and matrix<T, device_space>
// round trips. Skipped, with the reason, where there is no GPU.
#include <weft/layer/cuda/cublas.cuh>
#include <weft/layer/cuda/matrix.cuh>
#include <weft/layer/gemm.hpp>

#include "support/cuda.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

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
  std::mt19937 g(11);
  weft::cuda::stream s;
  const weft::layer::cublas gemm(s.get());
  for (auto ta : {trans::n, trans::t}) {
    for (auto tb : {trans::n, trans::t}) {
      for (auto [m, n, k] : {std::tuple{1, 1, 1}, std::tuple{5, 7, 3}, std::tuple{17, 1, 33}, std::tuple{64, 48, 80},
                             std::tuple{3, 4, 0}}) {
        const std::size_t ar = ta == trans::n ? m : k, ac = ta == trans::n ? k : m;
        const std::size_t br = tb == trans::n ? k : n, bc = tb == trans::n ? n : k;
        // On the device, each operand sits inside a larger matrix, so its ld > cols.
        auto big_a = random_matrix<T>(ar + 2, ac + 3, g);
        auto big_b = random_matrix<T>(br + 1, bc + 4, g);
        auto big_c = random_matrix<T>(m, n + 2, g);
        auto want = big_c;
        const T alpha = static_cast<T>(0.75), beta = static_cast<T>(-0.5);
        const auto a = big_a.view().rows_from(1, ar).cols_from(2, ac);
        const auto b = big_b.view().rows_from(1, br).cols_from(3, bc);
        weft::layer::reference_gemm{}(ta, tb, alpha, weft::matrix_view<const T>(a), weft::matrix_view<const T>(b), beta,
                                      want.view().cols_from(1, n));
        auto da = weft::to_device(big_a.view());
        auto db = weft::to_device(big_b.view());
        auto dc = weft::to_device(big_c.view());
        const auto dav = da.view().rows_from(1, ar).cols_from(2, ac);
        const auto dbv = db.view().rows_from(1, br).cols_from(3, bc);
        gemm(ta, tb, alpha, weft::matrix_view<const T>(dav), weft::matrix_view<const T>(dbv), beta,
             dc.view().cols_from(1, n));
        s.synchronize();
        const auto got = weft::to_host(dc);
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n + 2; ++j)
            ASSERT_NEAR(got(i, j), want(i, j), tol * (1.0 + std::abs(want(i, j))))
                << "m=" << m << " n=" << n << " k=" << k << " ta=" << int(ta) << " tb=" << int(tb) << " at " << i
                << "," << j;
      }
    }
  }
}

TEST(LayerCuda, CublasMatchesReferenceFloat) {
  WEFT_REQUIRE_DEVICE();
  check_all<float>(1e-5);
}

TEST(LayerCuda, CublasMatchesReferenceDouble) {
  WEFT_REQUIRE_DEVICE();
  check_all<double>(1e-13);
}

TEST(LayerCuda, BetaZeroIgnoresNaN) {
  WEFT_REQUIRE_DEVICE();
  weft::matrix<double> a(2, 3, 1.0), b(3, 2, 1.0), c(2, 2, std::nan(""));
  auto da = weft::to_device(a.view()), db = weft::to_device(b.view()), dc = weft::to_device(c.view());
  weft::layer::cublas gemm;
  gemm(trans::n, trans::n, 1.0, da.cview(), db.cview(), 0.0, dc.view());
  for (double x : weft::to_host(dc).flat()) EXPECT_EQ(x, 3.0);
}

TEST(LayerCuda, DeviceMatrixRoundTrip) {
  WEFT_REQUIRE_DEVICE();
  std::mt19937 g(3);
  auto big = random_matrix<float>(6, 9, g);
  const auto sub = big.view().rows_from(1, 4).cols_from(2, 5);  // ld 9 > cols 5
  auto d = weft::to_device(sub);
  EXPECT_EQ(d.rows(), 4u);
  EXPECT_EQ(d.cols(), 5u);
  weft::matrix<float> back(8, 7, -1.0f);
  d.copy_to(back.view().rows_from(2, 4).cols_from(1, 5));
  for (std::size_t r = 0; r < 8; ++r)
    for (std::size_t c = 0; c < 7; ++c) {
      const bool inside = r >= 2 && r < 6 && c >= 1 && c < 6;
      EXPECT_EQ(back(r, c), inside ? sub(r - 2, c - 1) : -1.0f) << r << "," << c;
    }
  weft::device_matrix<float> z(3, 2);
  for (float x : weft::to_host(z).flat()) EXPECT_EQ(x, 0.0f);
  weft::matrix<float> wrong(2, 2);
  EXPECT_THROW(d.copy_to(wrong.view()), weft::error);
}

TEST(LayerCuda, ShapeMismatchIsAnError) {
  WEFT_REQUIRE_DEVICE();
  weft::device_matrix<float> a(2, 3), b(4, 5), c(2, 5);
  weft::layer::cublas gemm;
  try {
    gemm(trans::n, trans::n, 1.0f, a.cview(), b.cview(), 0.0f, c.view());
    FAIL() << "expected weft::error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("do not multiply"), std::string::npos) << e.what();
  }
}

} // namespace
