#pragma once
// gemm_strided_batched (gemm.hpp) against reference_gemm block by block, as attention uses it: the
// A_i and B_i side by side in a row of wider matrices (stride: a block's width; ld > cols), the C_i
// stacked one under another (stride: a block's size); every transpose, one and several blocks,
// k = 0, alpha and beta. `up` takes a host matrix to where the policy works, `down` brings it back
// (the identity on the host; a device test copies and waits).
#include <weft/layer/gemm.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <random>
#include <tuple>

namespace weft::test::layer {

template <class T, class G, class Up, class Down>
void check_strided_batched(const G& gemm, Up up, Down down, double tol) {
  using weft::layer::trans;
  std::mt19937 g(13);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  const auto random = [&](std::size_t r, std::size_t c) {
    weft::matrix<T> m(r, c);
    for (auto& x : m.flat())
      x = static_cast<T>(d(g));
    return m;
  };
  for (auto ta : {trans::n, trans::t}) {
    for (auto tb : {trans::n, trans::t}) {
      for (auto [count, m, n, k] :
           {std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>{3, 5, 7, 4},
            {1, 6, 2, 3},
            {4, 1, 1, 1},
            {5, 16, 16, 8},
            {2, 3, 4, 0}}) {
        const std::size_t ar = ta == trans::n ? m : k, ac = ta == trans::n ? k : m;
        const std::size_t br = tb == trans::n ? k : n, bc = tb == trans::n ? n : k;
        const auto wide_a = random(ar, count * ac + 1);
        const auto wide_b = random(br, count * bc + 2);
        const auto c0 = random(count * m, n);
        auto want = c0;
        const T alpha = static_cast<T>(0.75), beta = static_cast<T>(-0.5);
        for (std::size_t i = 0; i < count; ++i) {
          weft::layer::reference_gemm{}(
              ta, tb, alpha, weft::matrix_view<const T>(wide_a.view().cols_from(i * ac, ac)),
              weft::matrix_view<const T>(wide_b.view().cols_from(i * bc, bc)), beta,
              want.view().rows_from(i * m, m));
        }
        auto da = up(wide_a);
        auto db = up(wide_b);
        auto dc = up(c0);
        weft::layer::gemm_strided_batched(gemm, count, weft::layer::gemm_strides{ac, bc, m * n}, ta,
                                          tb, alpha,
                                          weft::matrix_view<const T>(da.view().cols_from(0, ac)),
                                          weft::matrix_view<const T>(db.view().cols_from(0, bc)),
                                          beta, dc.view().rows_from(0, m));
        const auto got = down(dc);
        for (std::size_t i = 0; i < count * m; ++i)
          for (std::size_t j = 0; j < n; ++j)
            ASSERT_NEAR(got(i, j), want(i, j), tol * (1.0 + std::abs(want(i, j))))
                << "count=" << count << " m=" << m << " n=" << n << " k=" << k << " ta=" << int(ta)
                << " tb=" << int(tb) << " at " << i << "," << j;
      }
    }
  }
}

} // namespace weft::test::layer
