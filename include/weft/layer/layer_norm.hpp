#pragma once
// LayerNorm over the hidden dimension of each row (token): y = (x - mean) / sqrt(var + eps) * gamma
// + beta, with gamma and beta replicated on every TP rank (initialised to 1 and 0). It needs no
// communication: every rank normalises the rows it has, which are all the tokens, or, under
// sequence_parallel, its share of them. In that case each rank's gamma/beta gradients sum over
// its rows only (parameter::sequence_partial), and reduce_sequence_parallel_grads completes them.
//
// Row statistics are accumulated in double. backward, with xhat the normalised input and
// g = dy * gamma:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
//
// Exec says where it runs (exec.hpp): the host by default; with a device policy (cublas) the
// parameters, the kept xhat and rstd, and the views passed in and out are device memory, one
// thread per row (statistics, dx) or per column (the gamma and beta gradients, summed over the
// rows in order), so the result does not depend on how the device schedules them.
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/exec.hpp>
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

namespace detail {

/// One row: its mean and rstd (kept), xhat (kept) and y. Called as (row, 0).
template <class T>
struct layer_norm_forward_row {
  matrix_view<const T> x;
  matrix_view<T> y;
  matrix_view<const T> gamma, beta;
  matrix_view<double> xhat;  // rows x hidden
  matrix_view<double> rstd;  // rows x 1
  double eps;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t) const {
    const std::size_t hidden = x.cols();
    const auto n = static_cast<double>(hidden);
    double mean = 0.0;
    for (std::size_t c = 0; c < hidden; ++c) mean += static_cast<double>(x(r, c));
    mean /= n;
    double var = 0.0;
    for (std::size_t c = 0; c < hidden; ++c) {
      const double d = static_cast<double>(x(r, c)) - mean;
      var += d * d;
    }
    var /= n;
    const double rs = 1.0 / std::sqrt(var + eps);
    rstd(r, 0) = rs;
    for (std::size_t c = 0; c < hidden; ++c) {
      const double xh = (static_cast<double>(x(r, c)) - mean) * rs;
      xhat(r, c) = xh;
      y(r, c) = static_cast<T>(xh * static_cast<double>(gamma(0, c)) + static_cast<double>(beta(0, c)));
    }
  }
};

/// One column c of the parameter gradients: dgamma += sum_r dy xhat, dbeta += sum_r dy, rows in
/// order. Called as (0, c).
template <class T>
struct layer_norm_param_grads {
  matrix_view<const T> dy;
  matrix_view<const double> xhat;
  matrix_view<T> dgamma, dbeta;
  WEFT_HOST_DEVICE void operator()(std::size_t, std::size_t c) const {
    for (std::size_t r = 0; r < dy.rows(); ++r) step(r, c);
  }
  WEFT_HOST_DEVICE void step(std::size_t r, std::size_t c) const {
    const double d = static_cast<double>(dy(r, c));
    dgamma(0, c) += static_cast<T>(d * xhat(r, c));
    dbeta(0, c) += dy(r, c);
  }
};

/// One row of dx (dx may be dy: the row's dy is read in full before its dx is written). Called as (row, 0).
template <class T>
struct layer_norm_backward_row {
  matrix_view<const T> dy;
  matrix_view<T> dx;
  matrix_view<const T> gamma;
  matrix_view<const double> xhat;
  matrix_view<const double> rstd;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t) const {
    const std::size_t hidden = dy.cols();
    const auto n = static_cast<double>(hidden);
    double mean_g = 0.0;
    double mean_gx = 0.0;
    for (std::size_t c = 0; c < hidden; ++c) {
      const double g = static_cast<double>(dy(r, c)) * static_cast<double>(gamma(0, c));
      mean_g += g;
      mean_gx += g * xhat(r, c);
    }
    mean_g /= n;
    mean_gx /= n;
    for (std::size_t c = 0; c < hidden; ++c) {
      const double g = static_cast<double>(dy(r, c)) * static_cast<double>(gamma(0, c));
      dx(r, c) = static_cast<T>(rstd(r, 0) * (g - mean_g - xhat(r, c) * mean_gx));
    }
  }
};

} // namespace detail

template <class T, class SP = no_sequence_parallel, class Exec = host_policy>
class layer_norm {
public:
  using space = space_of<Exec>;

  explicit layer_norm(std::size_t hidden, double eps = 1e-5, Exec exec = {}) : hidden_(hidden), eps_(eps), exec_(std::move(exec)) {
    if (hidden == 0) throw error("layer_norm: hidden must be positive");
    if (!(eps > 0.0)) throw error("layer_norm: eps must be positive");
    for (auto* m : {&gamma_, &beta_, &dgamma_, &dbeta_}) detail::resize(exec_, *m, 1, hidden);
    detail::for_each_element(exec_, 1, hidden, detail::fill_element<T>{gamma_.view(), T{1}});
  }

  [[nodiscard]] std::size_t hidden() const noexcept { return hidden_; }

  /// x, y: rows x hidden (y may be x).
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    static constexpr std::string_view who = "layer_norm::forward";
    if (x.cols() != hidden_) ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), hidden_);
    expect_shape(who, "y", y, x.rows(), hidden_);
    const std::size_t rows = x.rows();
    detail::resize(exec_, xhat_, rows, hidden_);
    detail::resize(exec_, rstd_, rows, 1);
    detail::for_each_element(exec_, rows, 1,
                             detail::layer_norm_forward_row<T>{x, y, gamma_.view(), beta_.view(), xhat_.view(),
                                                               rstd_.view(), eps_});
    forwarded_ = true;
  }

  /// dy, dx: rows x hidden (dx may be dy). Gradients of gamma and beta +=.
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    static constexpr std::string_view who = "layer_norm::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t rows = xhat_.rows();
    expect_shape(who, "dy", dy, rows, hidden_);
    expect_shape(who, "dx", dx, rows, hidden_);
    // The parameter gradients first: dx may overwrite dy.
    const detail::layer_norm_param_grads<T> grads{dy, xhat_.view(), dgamma_.view(), dbeta_.view()};
    if constexpr (detail::element_policy<Exec, detail::layer_norm_param_grads<T>>) {
      detail::for_each_element(exec_, 1, hidden_, grads);
    } else {  // row by row, for the cache; the same sums in the same order
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < hidden_; ++c) grads.step(r, c);
    }
    detail::for_each_element(exec_, rows, 1,
                             detail::layer_norm_backward_row<T>{dy, dx, gamma_.view(), xhat_.view(), rstd_.view()});
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    return {{"gamma", gamma_.view(), dgamma_.view(), true, SP::enabled, 0, 0, 1, hidden_},
            {"beta", beta_.view(), dbeta_.view(), true, SP::enabled, 0, 0, 1, hidden_}};
  }
  void zero_grad() {
    detail::zero(exec_, dgamma_);
    detail::zero(exec_, dbeta_);
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
    matrix<double, space> xhat;
    matrix<double, space> rstd;
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

  /// In Exec's memory.
  [[nodiscard]] matrix_view<T> gamma() noexcept { return gamma_.view(); }
  [[nodiscard]] matrix_view<T> beta() noexcept { return beta_.view(); }

private:
  std::size_t hidden_;
  double eps_;
  Exec exec_;
  matrix<T, space> gamma_, beta_, dgamma_, dbeta_;
  matrix<double, space> xhat_;  // the normalised input, kept for backward
  matrix<double, space> rstd_;  // 1 / sqrt(var + eps), rows x 1
  bool forwarded_ = false;
};

} // namespace weft::layer
