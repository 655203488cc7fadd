#pragma once
// Helpers for the layer tests: random matrices, a norm-wise relative error against a double
// reference, slices, and the layers' tolerances (float 1e-5, double 1e-12). The references
// themselves are written out in each test, in double, with plain loops.
#include <weft/comm/transport/local.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/matrix.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>

namespace weft::test::layer {

using dmat = weft::matrix<double>;

template <class T>
constexpr double tolerance = std::is_same_v<T, float> ? 1e-5 : 1e-12;

inline dmat random_dmat(std::size_t r, std::size_t c, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(-scale, scale);
  dmat m(r, c);
  for (auto& x : m.flat())
    x = d(g);
  return m;
}

/// Rounds a double matrix to T (the inputs the layer under test gets; the reference uses the
/// rounded values too, so that float inputs are exact in both).
template <class T>
weft::matrix<T> to(const weft::matrix_view<const double> m) {
  weft::matrix<T> out(m.rows(), m.cols());
  for (std::size_t r = 0; r < m.rows(); ++r)
    for (std::size_t c = 0; c < m.cols(); ++c)
      out(r, c) = static_cast<T>(m(r, c));
  return out;
}
template <class T>
weft::matrix<T> to(const dmat& m) {
  return to<T>(m.view());
}

/// Rounds every element to T and back, in place.
template <class T>
void round_to(dmat& m) {
  for (auto& x : m.flat())
    x = static_cast<double>(static_cast<T>(x));
}

/// A rows x cols matrix, optionally embedded in a larger one (one row above and below, two
/// columns left, one right, holding a sentinel) so that its view has ld > cols: layers must
/// take strided views and leave the memory around them alone.
template <class T>
class embedded {
public:
  embedded(std::size_t rows, std::size_t cols, bool pad)
      : rows_(rows),
        cols_(cols),
        pad_(pad),
        big_(rows + (pad ? 2 : 0), cols + (pad ? 3 : 0), pad ? sentinel : T{}) {
    if (pad) view_fill(T{});
  }
  embedded(const weft::matrix<T>& m, bool pad) : embedded(m.rows(), m.cols(), pad) {
    for (std::size_t r = 0; r < rows_; ++r)
      for (std::size_t c = 0; c < cols_; ++c)
        view()(r, c) = m(r, c);
  }
  [[nodiscard]] weft::matrix_view<T> view() {
    return pad_ ? big_.view().rows_from(1, rows_).cols_from(2, cols_) : big_.view();
  }
  [[nodiscard]] weft::matrix_view<const T> cview() {
    const auto v = view();
    return {v.data(), v.rows(), v.cols(), v.ld()};
  }
  /// Whether the memory around the view still holds the sentinel.
  [[nodiscard]] bool border_intact() const {
    if (!pad_) return true;
    for (std::size_t r = 0; r < big_.rows(); ++r)
      for (std::size_t c = 0; c < big_.cols(); ++c) {
        const bool inside = r >= 1 && r <= rows_ && c >= 2 && c < 2 + cols_;
        if (!inside && big_(r, c) != sentinel) return false;
      }
    return true;
  }

private:
  static constexpr T sentinel = T(-7.25);
  void view_fill(T v) {
    auto w = view();
    for (std::size_t r = 0; r < rows_; ++r)
      for (std::size_t c = 0; c < cols_; ++c)
        w(r, c) = v;
  }
  std::size_t rows_, cols_;
  bool pad_;
  weft::matrix<T> big_;
};

/// The block [r0, r0 + nr) x [c0, c0 + nc) of m, as its own matrix.
inline dmat block(const dmat& m, std::size_t r0, std::size_t nr, std::size_t c0, std::size_t nc) {
  dmat out(nr, nc);
  for (std::size_t r = 0; r < nr; ++r)
    for (std::size_t c = 0; c < nc; ++c)
      out(r, c) = m(r0 + r, c0 + c);
  return out;
}

/// The largest relative error any comparison saw, per element type, printed when the program
/// ends (the figures quoted in the README).
template <class T>
std::atomic<double>& worst_error() {
  static std::atomic<double> w{0.0};
  return w;
}
inline void note_error(std::atomic<double>& w, double e) {
  double cur = w.load();
  while (e > cur && !w.compare_exchange_weak(cur, e)) {
  }
}
class worst_error_report : public ::testing::Environment {
public:
  void TearDown() override {
    std::printf(
        "[ layer    ] largest relative error vs the serial reference: float %.3g, double %.3g\n",
        worst_error<float>().load(), worst_error<double>().load());
  }
};
inline ::testing::Environment* const worst_error_env =
    ::testing::AddGlobalTestEnvironment(new worst_error_report);

/// max |got - want| / max |want| (norm-wise: the elements near zero do not blow it up).
template <class T>
double rel_err(weft::matrix_view<const T> got, weft::matrix_view<const double> want) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    ADD_FAILURE() << "shape " << got.rows() << "x" << got.cols() << " vs " << want.rows() << "x"
                  << want.cols();
    return 1e300;
  }
  double diff = 0.0;
  double scale = 0.0;
  for (std::size_t r = 0; r < got.rows(); ++r) {
    for (std::size_t c = 0; c < got.cols(); ++c) {
      const double g = static_cast<double>(got(r, c));
      if (!std::isfinite(g)) return 1e300;
      diff = std::max(diff, std::abs(g - want(r, c)));
      scale = std::max(scale, std::abs(want(r, c)));
    }
  }
  const double e = scale == 0.0 ? diff : diff / scale;
  note_error(worst_error<std::remove_const_t<T>>(), e);
  return e;
}
template <class T>
double rel_err(weft::matrix_view<T> got, const dmat& want) {
  return rel_err(weft::matrix_view<const T>(got.data(), got.rows(), got.cols(), got.ld()),
                 want.view());
}
template <class T>
double rel_err(const weft::matrix<T>& got, const dmat& want) {
  return rel_err(got.view(), want.view());
}

/// Runs f(comm) on tp ranks of weft::local, with a short watchdog so that a bug fails, not hangs.
template <class F>
void run_ranks(int tp, F&& f) {
  weft::local::options opt;
  opt.timeout = std::chrono::seconds(60);
  weft::local::run(tp, std::forward<F>(f), opt);
}

/// Expects f() to throw weft::error whose message contains `needle`.
template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected weft::error containing \"" << needle << "\"";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// --- plain double references ------------------------------------------------------------

/// y = x w^T (+ b): x tokens x in, w out x in, b 1 x out (or empty).
inline dmat ref_linear(const dmat& x, const dmat& w, const dmat* b) {
  dmat y(x.rows(), w.rows());
  for (std::size_t t = 0; t < x.rows(); ++t)
    for (std::size_t o = 0; o < w.rows(); ++o) {
      double s = b != nullptr ? (*b)(0, o) : 0.0;
      for (std::size_t i = 0; i < x.cols(); ++i)
        s += x(t, i) * w(o, i);
      y(t, o) = s;
    }
  return y;
}
/// dx = dy w.
inline dmat ref_linear_dx(const dmat& dy, const dmat& w) {
  dmat dx(dy.rows(), w.cols());
  for (std::size_t t = 0; t < dy.rows(); ++t)
    for (std::size_t i = 0; i < w.cols(); ++i) {
      double s = 0.0;
      for (std::size_t o = 0; o < w.rows(); ++o)
        s += dy(t, o) * w(o, i);
      dx(t, i) = s;
    }
  return dx;
}
/// dw = dy^T x.
inline dmat ref_linear_dw(const dmat& dy, const dmat& x) {
  dmat dw(dy.cols(), x.cols());
  for (std::size_t o = 0; o < dy.cols(); ++o)
    for (std::size_t i = 0; i < x.cols(); ++i) {
      double s = 0.0;
      for (std::size_t t = 0; t < dy.rows(); ++t)
        s += dy(t, o) * x(t, i);
      dw(o, i) = s;
    }
  return dw;
}
/// Column sums of dy over rows [r0, r0 + n).
inline dmat ref_colsum(const dmat& dy, std::size_t r0, std::size_t n) {
  dmat s(1, dy.cols());
  for (std::size_t t = r0; t < r0 + n; ++t)
    for (std::size_t c = 0; c < dy.cols(); ++c)
      s(0, c) += dy(t, c);
  return s;
}
inline dmat scaled(dmat m, double k) {
  for (auto& x : m.flat())
    x *= k;
  return m;
}

} // namespace weft::test::layer
