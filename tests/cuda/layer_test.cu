// The device path of the layers: weft::layer::cublas (row-major through the column-major call)
// against reference_gemm on the host, every transpose combination, odd shapes, operands embedded
// in larger matrices (ld > cols), alpha/beta, k = 0 (with beta 0 over NaN too), one-row views
// with ld 0; and matrix<T, device_space> round trips; layer_norm on the device (one thread per
// row or column) against the formulas in double. Skipped, with the reason, where there is no GPU.
#include <weft/layer/cuda/cublas.cuh>
#include <weft/layer/cuda/matrix.cuh>
#include <weft/layer/gemm.hpp>
#include <weft/layer/layer_norm.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "layer/strided_batched_check.hpp"
#include "support/cuda.cuh"

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
  std::mt19937 g(11);
  weft::cuda::stream s;
  const weft::layer::cublas gemm(s.get());
  for (auto ta : {trans::n, trans::t}) {
    for (auto tb : {trans::n, trans::t}) {
      for (auto [m, n, k] : {std::tuple{1, 1, 1}, std::tuple{5, 7, 3}, std::tuple{17, 1, 33},
                             std::tuple{64, 48, 80}, std::tuple{3, 4, 0}}) {
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
        weft::layer::reference_gemm{}(ta, tb, alpha, weft::matrix_view<const T>(a),
                                      weft::matrix_view<const T>(b), beta,
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
                << "m=" << m << " n=" << n << " k=" << k << " ta=" << int(ta) << " tb=" << int(tb)
                << " at " << i << "," << j;
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

// cublasSgemmStridedBatched / Dgemm... through the row-major mapping, one launch for all blocks.
TEST(LayerCuda, CublasStridedBatchedMatchesEachBlock) {
  WEFT_REQUIRE_DEVICE();
  weft::cuda::stream s;
  const weft::layer::cublas gemm(s.get());
  const auto up = [](const auto& m) { return weft::to_device(m.view()); };
  const auto down = [&](const auto& m) {
    s.synchronize();
    return weft::to_host(m);
  };
  weft::test::layer::check_strided_batched<float>(gemm, up, down, 1e-5);
  weft::test::layer::check_strided_batched<double>(gemm, up, down, 1e-13);
}

TEST(LayerCuda, BetaZeroIgnoresNaN) {
  WEFT_REQUIRE_DEVICE();
  weft::matrix<double> a(2, 3, 1.0), b(3, 2, 1.0), c(2, 2, std::nan(""));
  auto da = weft::to_device(a.view()), db = weft::to_device(b.view()),
       dc = weft::to_device(c.view());
  weft::layer::cublas gemm;
  gemm(trans::n, trans::n, 1.0, da.cview(), db.cview(), 0.0, dc.view());
  for (double x : weft::to_host(dc).flat())
    EXPECT_EQ(x, 3.0);
}

// k = 0 with beta = 0 makes C zeros, NaN and all, and leaves the columns beside the view alone;
// one-row operands whose ld (0) is below their width: the two branches check_all does not reach.
TEST(LayerCuda, CublasEdgeViews) {
  WEFT_REQUIRE_DEVICE();
  std::mt19937 g(9);
  weft::cuda::stream s;
  const weft::layer::cublas gemm(s.get());
  const double nan = std::nan("");
  {
    weft::matrix<double> a(3, 1, 1.0), b(1, 4, 1.0), c(3, 6, nan);
    auto da = weft::to_device(a.view()), db = weft::to_device(b.view()),
         dc = weft::to_device(c.view());
    gemm(trans::n, trans::n, 1.0, weft::matrix_view<const double>(da.view().cols_from(0, 0)),
         weft::matrix_view<const double>(db.view().rows_from(0, 0)), 0.0,
         dc.view().cols_from(1, 4));
    s.synchronize();
    const auto got = weft::to_host(dc);
    for (std::size_t i = 0; i < 3; ++i) {
      for (std::size_t j = 0; j < 6; ++j) {
        if (j >= 1 && j < 5) {
          EXPECT_EQ(got(i, j), 0.0) << i << "," << j;
        } else {
          EXPECT_TRUE(std::isnan(got(i, j)))
              << i << "," << j << ": a column beside the view was written";
        }
      }
    }
  }
  {
    constexpr std::size_t m = 3, n = 7, k = 5;
    const auto x = random_matrix<double>(1, k, g);
    const auto w = random_matrix<double>(n, k, g);
    const auto a = random_matrix<double>(m, k, g);
    auto dx = weft::to_device(x.view()), dw = weft::to_device(w.view()),
         da = weft::to_device(a.view());
    auto dy = weft::to_device(weft::matrix<double>(1, n, nan).view());
    auto dz = weft::to_device(weft::matrix<double>(m, 1, nan).view());
    const weft::matrix_view<const double> x_row(dx.data(), 1, k, 0);
    gemm(trans::n, trans::t, 1.0, x_row, dw.cview(), 0.0,
         weft::matrix_view<double>(dy.data(), 1, n, 0));
    gemm(trans::n, trans::t, 1.0, da.cview(), x_row, 0.0, dz.view());
    s.synchronize();
    const auto y = weft::to_host(dy);
    const auto z = weft::to_host(dz);
    for (std::size_t j = 0; j < n; ++j) {
      double want = 0;
      for (std::size_t c = 0; c < k; ++c)
        want += x(0, c) * w(j, c);
      EXPECT_NEAR(y(0, j), want, 1e-13) << j;
    }
    for (std::size_t i = 0; i < m; ++i) {
      double want = 0;
      for (std::size_t c = 0; c < k; ++c)
        want += a(i, c) * x(0, c);
      EXPECT_NEAR(z(i, 0), want, 1e-13) << i;
    }
  }
}

TEST(LayerCuda, DeviceMatrixRoundTrip) {
  WEFT_REQUIRE_DEVICE();
  std::mt19937 g(3);
  auto big = random_matrix<float>(6, 9, g);
  const auto sub = big.view().rows_from(1, 4).cols_from(2, 5); // ld 9 > cols 5
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
  for (float x : weft::to_host(z).flat())
    EXPECT_EQ(x, 0.0f);
  weft::matrix<float> wrong(2, 2);
  EXPECT_THROW(d.copy_to(wrong.view()), weft::error);
}

// On a stream a matrix takes stream-ordered memory: zero-filled on growth, kept when it shrinks,
// reallocated (zeroed again) when it grows past it, and freed on the stream while work queued
// there may still be running.
TEST(LayerCuda, MatrixOnAStreamGrowsZeroedAndKeepsItsBlockWhenShrinking) {
  WEFT_REQUIRE_DEVICE();
  weft::cuda::stream s;
  std::mt19937 g(7);
  const auto host = random_matrix<float>(5, 6, g);
  {
    auto d = weft::to_device(host.view(), s.get());
    const auto back = weft::to_host(d, s.get());
    EXPECT_TRUE(std::ranges::equal(back.flat(), host.flat()));
    const float* block = d.data();
    d.resize(2, 3, s.get());
    EXPECT_EQ(d.data(), block) << "shrinking keeps the block";
    for (float x : weft::to_host(d, s.get()).flat())
      EXPECT_EQ(x, 0.0f);
    d.resize(40, 50, s.get());
    EXPECT_EQ(d.rows(), 40u);
    for (float x : weft::to_host(d, s.get()).flat())
      EXPECT_EQ(x, 0.0f);
    weft::device_matrix<float> busy(256, 256, s.get());
    WEFT_CUDA_TRY(cudaMemsetAsync(busy.data(), 0, 256 * 256 * sizeof(float), s.get()));
  } // both freed behind the memset, on s
  weft::device_matrix<float> again(256, 256, s.get());
  for (float x : weft::to_host(again, s.get()).flat())
    ASSERT_EQ(x, 0.0f);
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

// LayerNorm on the device: y = xhat gamma + beta, dx = rstd (g - mean(g) - xhat mean(g xhat)) with
// g = dy gamma, dgamma = sum dy xhat, dbeta = sum dy, written out in double here; dx in place of
// dy.
template <class T>
void check_layer_norm(double tol) {
  const std::size_t rows = 37, hidden = 70;
  const double eps = 1e-5;
  std::mt19937 g(5);
  auto x = random_matrix<T>(rows, hidden, g), dy = random_matrix<T>(rows, hidden, g);
  auto gamma = random_matrix<T>(1, hidden, g), beta = random_matrix<T>(1, hidden, g);
  std::vector<double> y_ref(rows * hidden), dx_ref(rows * hidden), dgamma_ref(hidden),
      dbeta_ref(hidden);
  for (std::size_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::size_t c = 0; c < hidden; ++c)
      mean += double(x(r, c)) / hidden;
    for (std::size_t c = 0; c < hidden; ++c)
      var += (double(x(r, c)) - mean) * (double(x(r, c)) - mean) / hidden;
    const double rstd = 1 / std::sqrt(var + eps);
    double mg = 0, mgx = 0;
    for (std::size_t c = 0; c < hidden; ++c) {
      const double xh = (double(x(r, c)) - mean) * rstd,
                   gg = double(dy(r, c)) * double(gamma(0, c));
      y_ref[r * hidden + c] = xh * double(gamma(0, c)) + double(beta(0, c));
      dgamma_ref[c] += double(dy(r, c)) * xh;
      dbeta_ref[c] += double(dy(r, c));
      mg += gg / hidden;
      mgx += gg * xh / hidden;
    }
    for (std::size_t c = 0; c < hidden; ++c) {
      const double xh = (double(x(r, c)) - mean) * rstd,
                   gg = double(dy(r, c)) * double(gamma(0, c));
      dx_ref[r * hidden + c] = rstd * (gg - mg - xh * mgx);
    }
  }
  weft::cuda::stream s;
  const weft::layer::cublas exec(s.get());
  weft::layer::layer_norm<T, weft::layer::no_sequence_parallel, weft::layer::cublas> ln(hidden, eps,
                                                                                        exec);
  T gamma0{};
  s.synchronize();
  WEFT_CUDA_TRY(cudaMemcpy(&gamma0, ln.gamma().data(), sizeof(T), cudaMemcpyDeviceToHost));
  EXPECT_EQ(gamma0, T{1}); // initialised on the device
  auto ps = ln.parameters();
  auto dx = weft::to_device(x.view(), s.get()), dd = weft::to_device(dy.view(), s.get());
  weft::device_matrix<T> y(rows, hidden, s.get());
  WEFT_CUDA_TRY(cudaMemcpyAsync(ps[0].value.data(), gamma.data(), hidden * sizeof(T),
                                cudaMemcpyHostToDevice, s.get()));
  WEFT_CUDA_TRY(cudaMemcpyAsync(ps[1].value.data(), beta.data(), hidden * sizeof(T),
                                cudaMemcpyHostToDevice, s.get()));
  ln.forward(dx.cview(), y.view());
  ln.backward(dd.cview(), dd.view()); // dx in place of dy
  s.synchronize();
  const auto yh = weft::to_host(y, s.get()), dxh = weft::to_host(dd, s.get());
  weft::matrix<T> dgamma(1, hidden), dbeta(1, hidden);
  WEFT_CUDA_TRY(
      cudaMemcpy(dgamma.data(), ps[0].grad.data(), hidden * sizeof(T), cudaMemcpyDeviceToHost));
  WEFT_CUDA_TRY(
      cudaMemcpy(dbeta.data(), ps[1].grad.data(), hidden * sizeof(T), cudaMemcpyDeviceToHost));
  const auto check = [&](const char* what, const T* got, const std::vector<double>& want) {
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::abs(double(got[i]) - want[i]));
      scale = std::max(scale, std::abs(want[i]));
    }
    EXPECT_LT(diff / scale, tol) << what;
  };
  check("y", yh.data(), y_ref);
  check("dx", dxh.data(), dx_ref);
  check("dgamma", dgamma.data(), dgamma_ref);
  check("dbeta", dbeta.data(), dbeta_ref);
  ln.zero_grad();
  s.synchronize();
  WEFT_CUDA_TRY(
      cudaMemcpy(dgamma.data(), ps[0].grad.data(), hidden * sizeof(T), cudaMemcpyDeviceToHost));
  for (T v : dgamma.flat())
    EXPECT_EQ(v, T{});
}

TEST(LayerCuda, LayerNormMatchesFormulaFloat) {
  WEFT_REQUIRE_DEVICE();
  check_layer_norm<float>(1e-5);
}

TEST(LayerCuda, LayerNormMatchesFormulaDouble) {
  WEFT_REQUIRE_DEVICE();
  check_layer_norm<double>(1e-12);
}

} // namespace
