#pragma once
// The GEMM the layers call, as a policy object: C = alpha * op(A) * op(B) + beta * C on row-major
// views, op(X) = X or its transpose. Layers take the policy as a template parameter and hold an
// instance (a device policy carries a cuBLAS handle and a stream; the host ones are empty):
//
//   weft::layer::cblas gemm;                                    // <weft/layer/cblas.hpp>
//   gemm(trans::n, trans::t, 1.0f, x, w, 0.0f, y);              // y = x w^T
//
// reference_gemm is the textbook triple loop, for testing the others and nothing else.
#include <weft/core/error.hpp>
#include <weft/layer/matrix.hpp>

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>

namespace weft::layer {

enum class trans : bool { n, t };

namespace detail {

struct gemm_shape {
  std::size_t m = 0;
  std::size_t n = 0;
  std::size_t k = 0;
};

/// Checks that op(A) is m x k, op(B) is k x n and C is m x n; returns m, n, k.
template <class T>
gemm_shape check_gemm(std::string_view who, trans ta, trans tb, matrix_view<const T> a,
                      matrix_view<const T> b, matrix_view<T> c) {
  const std::size_t m = ta == trans::n ? a.rows() : a.cols();
  const std::size_t k = ta == trans::n ? a.cols() : a.rows();
  const std::size_t kb = tb == trans::n ? b.rows() : b.cols();
  const std::size_t n = tb == trans::n ? b.cols() : b.rows();
  if (k != kb || c.rows() != m || c.cols() != n) {
    throw error(std::string(who) + ": op(A) is " + std::to_string(m) + " x " + std::to_string(k) +
                ", op(B) is " + std::to_string(kb) + " x " + std::to_string(n) + " and C is " +
                std::to_string(c.rows()) + " x " + std::to_string(c.cols()) +
                ": the shapes do not multiply");
  }
  return {m, n, k};
}

} // namespace detail

/// A GEMM policy for element type T.
template <class G, class T>
concept gemm_for = requires(const G& g, matrix_view<const T> a, matrix_view<const T> b,
                            matrix_view<T> c, T s) {
  g(trans::n, trans::t, s, a, b, s, c);
};

/// How far apart, in elements, the operands of consecutive GEMMs of a strided batch sit.
struct gemm_strides {
  std::size_t a = 0;
  std::size_t b = 0;
  std::size_t c = 0;
};

/// `count` GEMMs of one shape: the i-th is gemm(ta, tb, alpha, A_i, B_i, beta, C_i) with X_i the
/// view x moved i * strides.x elements (the C_i must not overlap). A policy with a member
/// strided_batched(count, strides, ta, tb, alpha, a, b, beta, c) runs them in one call (cuBLAS:
/// one launch instead of count); any other runs them in order.
template <class G, class T>
void gemm_strided_batched(const G& g, std::size_t count, gemm_strides s, trans ta, trans tb,
                          T alpha, matrix_view<const T> a, matrix_view<const T> b, T beta,
                          matrix_view<T> c) {
  if constexpr (requires { g.strided_batched(count, s, ta, tb, alpha, a, b, beta, c); }) {
    g.strided_batched(count, s, ta, tb, alpha, a, b, beta, c);
  } else {
    for (std::size_t i = 0; i < count; ++i)
      g(ta, tb, alpha, a.shifted(i * s.a), b.shifted(i * s.b), beta, c.shifted(i * s.c));
  }
}

/// The definition, in three loops (accumulating in T). Slow; tests only.
struct reference_gemm {
  template <std::floating_point T>
  void operator()(trans ta, trans tb, T alpha, matrix_view<const T> a, matrix_view<const T> b,
                  T beta, matrix_view<T> c) const {
    const auto [m, n, k] = detail::check_gemm("reference_gemm", ta, tb, a, b, c);
    for (std::size_t i = 0; i < m; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        T acc{};
        for (std::size_t p = 0; p < k; ++p) {
          const T x = ta == trans::n ? a(i, p) : a(p, i);
          const T y = tb == trans::n ? b(p, j) : b(j, p);
          acc += x * y;
        }
        c(i, j) = alpha * acc + (beta == T{} ? T{} : beta * c(i, j));
      }
    }
  }
};

} // namespace weft::layer
