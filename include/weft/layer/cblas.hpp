#pragma once
// The host GEMM policy: CBLAS (OpenBLAS from the system packages). Link weft::blas.
//
// Each rank is one thread (weft::local) or one process (weft::mpi), and a machine's cores are
// already shared among the ranks, so BLAS must not start threads of its own: with OpenBLAS the
// first use sets its thread count to 1 (weft::blas defines WEFT_OPENBLAS). Other BLAS builds
// should be single-threaded or told so by their environment (e.g. OMP_NUM_THREADS=1).
#include <weft/layer/gemm.hpp>

#include <cblas.h>

#include <climits>
#include <concepts>
#include <string>

namespace weft::layer {

namespace detail {

inline void blas_single_thread_once() {
#if defined(WEFT_OPENBLAS)
  static const bool once = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)once;
#endif
}

inline int blas_int(std::size_t v, const char* what) {
  if (v > static_cast<std::size_t>(INT_MAX)) {
    throw error(std::string("cblas: ") + what + " = " + std::to_string(v) +
                " exceeds the BLAS integer range");
  }
  return static_cast<int>(v);
}

} // namespace detail

struct cblas {
  template <class T>
  requires std::same_as<T, float> || std::same_as<T, double>
  void operator()(trans ta, trans tb, T alpha, matrix_view<const T> a, matrix_view<const T> b,
                  T beta, matrix_view<T> c) const {
    const auto [m, n, k] = detail::check_gemm("cblas", ta, tb, a, b, c);
    if (m == 0 || n == 0) return;
    if (k == 0) { // BLAS leaves C alone when k == 0 only if beta == 1; make it the definition
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j)
          c(i, j) = beta == T{} ? T{} : beta * c(i, j);
      return;
    }
    detail::blas_single_thread_once();
    const auto op_a = ta == trans::n ? CblasNoTrans : CblasTrans;
    const auto op_b = tb == trans::n ? CblasNoTrans : CblasTrans;
    // A row-major view with one row may have ld < cols; BLAS wants ld >= the row length.
    const int lda = detail::blas_int(a.rows() <= 1 ? std::max(a.ld(), a.cols()) : a.ld(), "lda");
    const int ldb = detail::blas_int(b.rows() <= 1 ? std::max(b.ld(), b.cols()) : b.ld(), "ldb");
    const int ldc = detail::blas_int(c.rows() <= 1 ? std::max(c.ld(), c.cols()) : c.ld(), "ldc");
    const int mi = detail::blas_int(m, "m");
    const int ni = detail::blas_int(n, "n");
    const int ki = detail::blas_int(k, "k");
    if constexpr (std::same_as<T, float>) {
      cblas_sgemm(CblasRowMajor, op_a, op_b, mi, ni, ki, alpha, a.data(), lda, b.data(), ldb, beta,
                  c.data(), ldc);
    } else {
      cblas_dgemm(CblasRowMajor, op_a, op_b, mi, ni, ki, alpha, a.data(), lda, b.data(), ldb, beta,
                  c.data(), ldc);
    }
  }
};

} // namespace weft::layer
