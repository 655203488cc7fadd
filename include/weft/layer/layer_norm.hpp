#pragma once
// LayerNorm over the hidden dimension of each row (token): y = (x - mean) / sqrt(var + eps) * gamma
// + beta, with gamma and beta replicated on every TP rank (initialised to 1 and 0). It needs no
// communication: every rank normalises the rows it has, which are all the tokens, or, under
// sequence_parallel, its share of them. In that case each rank's gamma/beta gradients sum over
// its rows only (parameter::sequence_partial), and reduce_sequence_parallel_grads completes them.
//
// Row statistics are accumulated in double. backward, with xhat the normalised input and
// g = dy * gamma:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
#include <weft/core/error.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

template <class T, class SP = no_sequence_parallel>
class layer_norm {
public:
  explicit layer_norm(std::size_t hidden, double eps = 1e-5)
      : hidden_(hidden), eps_(eps), gamma_(1, hidden, T{1}), beta_(1, hidden), dgamma_(1, hidden), dbeta_(1, hidden) {
    if (hidden == 0) throw error("layer_norm: hidden must be positive");
    if (!(eps > 0.0)) throw error("layer_norm: eps must be positive");
  }

  [[nodiscard]] std::size_t hidden() const noexcept { return hidden_; }

  /// x, y: rows x hidden (y may be x).
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    static constexpr std::string_view who = "layer_norm::forward";
    if (x.cols() != hidden_) ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), hidden_);
    expect_shape(who, "y", y, x.rows(), hidden_);
    const std::size_t rows = x.rows();
    xhat_.resize(rows, hidden_);
    rstd_.assign(rows, 0.0);
    const auto n = static_cast<double>(hidden_);
    for (std::size_t r = 0; r < rows; ++r) {
      double mean = 0.0;
      for (std::size_t c = 0; c < hidden_; ++c) mean += static_cast<double>(x(r, c));
      mean /= n;
      double var = 0.0;
      for (std::size_t c = 0; c < hidden_; ++c) {
        const double d = static_cast<double>(x(r, c)) - mean;
        var += d * d;
      }
      var /= n;
      const double rstd = 1.0 / std::sqrt(var + eps_);
      rstd_[r] = rstd;
      for (std::size_t c = 0; c < hidden_; ++c) {
        const double xh = (static_cast<double>(x(r, c)) - mean) * rstd;
        xhat_(r, c) = xh;
        y(r, c) = static_cast<T>(xh * static_cast<double>(gamma_(0, c)) + static_cast<double>(beta_(0, c)));
      }
    }
    forwarded_ = true;
  }

  /// dy, dx: rows x hidden (dx may be dy). Gradients of gamma and beta +=.
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    static constexpr std::string_view who = "layer_norm::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t rows = xhat_.rows();
    expect_shape(who, "dy", dy, rows, hidden_);
    expect_shape(who, "dx", dx, rows, hidden_);
    const auto n = static_cast<double>(hidden_);
    g_.resize(hidden_);
    for (std::size_t r = 0; r < rows; ++r) {
      double mean_g = 0.0;
      double mean_gx = 0.0;
      for (std::size_t c = 0; c < hidden_; ++c) {
        const double d = static_cast<double>(dy(r, c));
        dgamma_(0, c) += static_cast<T>(d * xhat_(r, c));
        dbeta_(0, c) += dy(r, c);
        const double g = d * static_cast<double>(gamma_(0, c));
        g_[c] = g;
        mean_g += g;
        mean_gx += g * xhat_(r, c);
      }
      mean_g /= n;
      mean_gx /= n;
      for (std::size_t c = 0; c < hidden_; ++c) {
        dx(r, c) = static_cast<T>(rstd_[r] * (g_[c] - mean_g - xhat_(r, c) * mean_gx));
      }
    }
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    return {{"gamma", gamma_.view(), dgamma_.view(), true, SP::enabled, 0, 0, 1, hidden_},
            {"beta", beta_.view(), dbeta_.view(), true, SP::enabled, 0, 0, 1, hidden_}};
  }
  void zero_grad() {
    dgamma_.fill(T{});
    dbeta_.fill(T{});
  }

  /// Bytes kept from forward for backward; release() frees them (see linear.hpp).
  [[nodiscard]] std::size_t saved_bytes() const noexcept { return (xhat_.size() + rstd_.size()) * sizeof(double); }
  void release() {
    xhat_ = {};
    rstd_ = {};
    forwarded_ = false;
  }

  /// What backward needs from forward, moved out and back (see linear.hpp).
  struct activations {
    matrix<double> xhat;
    std::vector<double> rstd;
    bool forwarded = false;
  };
  [[nodiscard]] activations stash() {
    return {std::exchange(xhat_, {}), std::exchange(rstd_, {}), std::exchange(forwarded_, false)};
  }
  void restore(activations a) {
    xhat_ = std::move(a.xhat);
    rstd_ = std::move(a.rstd);
    forwarded_ = a.forwarded;
  }

  [[nodiscard]] matrix_view<T> gamma() noexcept { return gamma_.view(); }
  [[nodiscard]] matrix_view<T> beta() noexcept { return beta_.view(); }

private:
  std::size_t hidden_;
  double eps_;
  matrix<T> gamma_, beta_, dgamma_, dbeta_;
  matrix<double> xhat_;        // the normalised input, kept for backward
  std::vector<double> rstd_;   // 1 / sqrt(var + eps) per row
  std::vector<double> g_;
  bool forwarded_ = false;
};

} // namespace weft::layer
