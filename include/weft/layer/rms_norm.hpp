#pragma once
// RMSNorm over the hidden dimension of each row (token), as Llama normalises:
//   y = x / sqrt(mean(x^2) + eps) * gamma
// with no mean subtraction and no bias; gamma is replicated on every TP rank (initialised to 1)
// and named "weight", as Hugging Face names it. Like layer_norm it needs no communication, and
// under sequence_parallel gamma's gradient is a partial sum over the rank's rows
// (parameter::sequence_partial) that reduce_sequence_parallel_grads completes.
//
//   weft::layer::rms_norm<float> norm(4096, 1e-6);
//   norm.forward(x, y);       // x, y: rows x hidden (y may be x)
//   norm.backward(dy, dx);    // dx may be dy; gamma's gradient +=
//
// The statistic is accumulated in double. backward, with xhat = x * rstd and g = dy * gamma:
//   dx = rstd * (g - xhat * mean(g * xhat)),   dgamma = sum over rows of dy * xhat.
//
// Exec says where it runs (exec.hpp), and the sums are taken as layer_norm's are: a row's by
// row_lanes lanes over its columns, then the lanes in order; gamma's gradient by lanes over the
// rows. So the result does not depend on how a device schedules the work.
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/layer_norm.hpp>
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

// The forward's stages (exec.hpp, for_each_row_in_stages), row r:
//   1. (r, l): lanes(r, l) = sum of x(r, c)^2 over lane l's columns
//   2. (r, 0): rstd (layer_norm.hpp's lane_rstd: the mean square plays the variance)
//   3. (r, c): xhat, y (y may be x: each element is read before it is written)
template <class T>
struct rms_norm_lane_squares {
  matrix_view<const T> x;
  matrix_view<double> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t l) const {
    double s = 0.0;
    for (std::size_t c = l; c < x.cols(); c += row_lanes) {
      const double v = static_cast<double>(x(r, c));
      s += v * v;
    }
    lanes(r, l) = s;
  }
};

template <class T>
struct rms_norm_normalise {
  matrix_view<const T> x;
  matrix_view<T> y;
  matrix_view<const T> gamma;
  matrix_view<const double> rstd;
  matrix_view<double> xhat;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    const double xh = static_cast<double>(x(r, c)) * rstd(r, 0);
    xhat(r, c) = xh;
    y(r, c) = static_cast<T>(xh * static_cast<double>(gamma(0, c)));
  }
};

/// gamma's gradient by lanes over the rows (exec.hpp, sum_rows_by_lanes), in double:
/// dgamma(0, c) += sum_r dy xhat; lanes row_lanes x hidden.
template <class T>
struct rms_norm_param_grads {
  matrix_view<const T> dy;
  matrix_view<const double> xhat;
  matrix_view<T> dgamma;
  matrix_view<double> lanes;
  WEFT_HOST_DEVICE void lane(std::size_t l, std::size_t c) const {
    double s = 0.0;
    for (std::size_t r = l; r < dy.rows(); r += row_lanes)
      s += static_cast<double>(dy(r, c)) * xhat(r, c);
    lanes(l, c) = s;
  }
  WEFT_HOST_DEVICE void add(std::size_t r, std::size_t c) const {
    lanes(r % row_lanes, c) += static_cast<double>(dy(r, c)) * xhat(r, c);
  }
  WEFT_HOST_DEVICE void combine(std::size_t c) const {
    double s = 0.0;
    for (std::size_t l = 0; l < row_lanes; ++l)
      s += lanes(l, c);
    dgamma(0, c) += static_cast<T>(s);
  }
};

// dx's stages, row r: 1. (r, l): lanes(r, l) = the sum of g * xhat over lane l's columns, g = dy *
// gamma; 2. (r, 0): its mean (layer_norm.hpp's lane_means); 3. (r, c): dx (dx may be dy).
template <class T>
struct rms_norm_lane_grads {
  matrix_view<const T> dy;
  matrix_view<const T> gamma;
  matrix_view<const double> xhat;
  matrix_view<double> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t l) const {
    double s = 0.0;
    for (std::size_t c = l; c < dy.cols(); c += row_lanes) {
      s += static_cast<double>(dy(r, c)) * static_cast<double>(gamma(0, c)) * xhat(r, c);
    }
    lanes(r, l) = s;
  }
};

template <class T>
struct rms_norm_dx {
  matrix_view<const T> dy;
  matrix_view<T> dx;
  matrix_view<const T> gamma;
  matrix_view<const double> xhat;
  matrix_view<const double> rstd;
  matrix_view<const double> mean_gx; // rows x 1: mean(g * xhat)
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    const double g = static_cast<double>(dy(r, c)) * static_cast<double>(gamma(0, c));
    dx(r, c) = static_cast<T>(rstd(r, 0) * (g - xhat(r, c) * mean_gx(r, 0)));
  }
};

} // namespace detail

template <class T, class SP = no_sequence_parallel, class Exec = host_policy>
class rms_norm {
public:
  using space = space_of<Exec>;

  explicit rms_norm(std::size_t hidden, double eps = 1e-5, Exec exec = {})
      : hidden_(hidden), eps_(eps), exec_(std::move(exec)) {
    if (hidden == 0) throw error("rms_norm: hidden must be positive");
    if (!(eps > 0.0)) throw error("rms_norm: eps must be positive");
    for (auto* m : {&gamma_, &dgamma_})
      detail::resize(exec_, *m, 1, hidden);
    detail::for_each_element(exec_, 1, hidden, detail::fill_element<T>{gamma_.view(), T{1}});
  }

  [[nodiscard]] std::size_t hidden() const noexcept { return hidden_; }
  [[nodiscard]] double eps() const noexcept { return eps_; }

  /// x, y: rows x hidden (y may be x).
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    static constexpr std::string_view who = "rms_norm::forward";
    if (x.cols() != hidden_)
      ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), hidden_);
    expect_shape(who, "y", y, x.rows(), hidden_);
    const std::size_t rows = x.rows();
    detail::resize(exec_, xhat_, rows, hidden_);
    detail::resize(exec_, rstd_, rows, 1);
    scratch_.reserve(exec_, rows, 1); // backward's shape too, so calls never reshape
    const auto lanes = scratch_.lanes.view();
    using detail::row_lanes;
    detail::for_each_row_in_stages(
        exec_, rows, detail::row_stage{row_lanes, detail::rms_norm_lane_squares<T>{x, lanes}},
        detail::row_stage{
            1, detail::lane_rstd{lanes, rstd_.view(), static_cast<double>(hidden_), eps_}},
        detail::row_stage{hidden_, detail::rms_norm_normalise<T>{x, y, gamma_.view(), rstd_.view(),
                                                                 xhat_.view()}});
    forwarded_ = true;
  }

  /// dy, dx: rows x hidden (dx may be dy). gamma's gradient +=.
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    static constexpr std::string_view who = "rms_norm::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t rows = xhat_.rows();
    expect_shape(who, "dy", dy, rows, hidden_);
    expect_shape(who, "dx", dx, rows, hidden_);
    // gamma's gradient first: dx may overwrite dy.
    detail::reshape(exec_, param_lanes_, detail::row_lanes, hidden_);
    detail::sum_rows_by_lanes(
        exec_, rows, hidden_,
        detail::rms_norm_param_grads<T>{dy, xhat_.view(), dgamma_.view(), param_lanes_.view()});
    scratch_.reserve(exec_, rows, 1);
    const auto lanes = scratch_.lanes.view();
    const auto mean_gx = scratch_.results.view();
    using detail::row_lanes;
    detail::for_each_row_in_stages(
        exec_, rows,
        detail::row_stage{row_lanes,
                          detail::rms_norm_lane_grads<T>{dy, gamma_.view(), xhat_.view(), lanes}},
        detail::row_stage{1, detail::lane_means{lanes, mean_gx, static_cast<double>(hidden_)}},
        detail::row_stage{hidden_, detail::rms_norm_dx<T>{dy, dx, gamma_.view(), xhat_.view(),
                                                          rstd_.view(), mean_gx}});
  }

  /// "weight": 1 x hidden, replicated, not decayed.
  [[nodiscard]] std::vector<parameter<T>> parameters() {
    return {{"weight", gamma_.view(), dgamma_.view(), true, SP::enabled, 0, 0, 1, hidden_, false,
             false, home_of(gamma_), home_of(dgamma_)}};
  }
  void zero_grad() { detail::zero(exec_, dgamma_); }

  /// Bytes kept from forward for backward; release() frees them (see linear.hpp).
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return (xhat_.size() + rstd_.size()) * sizeof(double);
  }
  void release() {
    xhat_ = {};
    rstd_ = {};
    scratch_.release();
    param_lanes_ = {};
    forwarded_ = false;
  }

  /// What backward needs from forward, moved out and back (see linear.hpp).
  struct activations {
    matrix<double, space> xhat;
    matrix<double, space> rstd;
    bool forwarded = false;
    [[nodiscard]] std::size_t bytes() const noexcept {
      return (xhat.size() + rstd.size()) * sizeof(double);
    }
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

private:
  std::size_t hidden_;
  double eps_;
  Exec exec_;
  matrix<T, space> gamma_, dgamma_;
  matrix<double, space> xhat_;                 // x * rstd, kept for backward
  matrix<double, space> rstd_;                 // 1 / sqrt(mean(x^2) + eps), rows x 1
  detail::row_scratch<double, space> scratch_; // the row sums' lanes, mean(g * xhat)
  matrix<double, space> param_lanes_;          // gamma's gradient's lanes
  bool forwarded_ = false;
};

} // namespace weft::layer
