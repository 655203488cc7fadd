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
// parameters, the kept xhat and rstd, and the views passed in and out are device memory. A row's
// sums are taken by row_lanes lanes, each over every row_lanes-th column, then the lanes in order
// (a thread per row and lane on a device, so a warp reads a row's consecutive elements); the gamma
// and beta gradients likewise by lanes over the rows. So the result does not depend on how the
// device schedules them, and the host adds the same terms in the same order (equal to rounding on a
// device, whose compiler fuses multiply-adds: exec.hpp, row_lanes).
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

// The forward's stages (exec.hpp, for_each_row_in_stages), row r, with lanes = a row_scratch's:
//   1. (r, l): lanes(r, l) = sum of x(r, c) over lane l's columns      2. (r, 0): mean
//   3. (r, l): lanes(r, l) = sum of (x(r, c) - mean)^2                  4. (r, 0): rstd
//   5. (r, c): xhat, y (y may be x: each element is read before it is written)
template <class T>
struct layer_norm_lane_sums {
  matrix_view<const T> x;
  matrix_view<double> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t l) const {
    double s = 0.0;
    for (std::size_t c = l; c < x.cols(); c += row_lanes)
      s += static_cast<double>(x(r, c));
    lanes(r, l) = s;
  }
};

template <class T>
struct layer_norm_lane_squares {
  matrix_view<const T> x;
  matrix_view<const double> mean;
  matrix_view<double> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t l) const {
    const double m = mean(r, 0);
    double s = 0.0;
    for (std::size_t c = l; c < x.cols(); c += row_lanes) {
      const double d = static_cast<double>(x(r, c)) - m;
      s += d * d;
    }
    lanes(r, l) = s;
  }
};

/// out(r, w) = lane_total(r, w) / n for each of out's columns w.
struct lane_means {
  matrix_view<const double> lanes;
  matrix_view<double> out;
  double n;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t) const {
    for (std::size_t w = 0; w < out.cols(); ++w)
      out(r, w) = lane_total(lanes, r, w) / n;
  }
};

/// rstd(r, 0) = 1 / sqrt(variance + eps), the variance lane_total(r, 0) / n.
struct lane_rstd {
  matrix_view<const double> lanes;
  matrix_view<double> rstd;
  double n;
  double eps;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t) const {
    rstd(r, 0) = 1.0 / std::sqrt(lane_total(lanes, r) / n + eps);
  }
};

template <class T>
struct layer_norm_normalise {
  matrix_view<const T> x;
  matrix_view<T> y;
  matrix_view<const T> gamma, beta;
  matrix_view<const double> mean, rstd;
  matrix_view<double> xhat;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    const double xh = (static_cast<double>(x(r, c)) - mean(r, 0)) * rstd(r, 0);
    xhat(r, c) = xh;
    y(r, c) =
        static_cast<T>(xh * static_cast<double>(gamma(0, c)) + static_cast<double>(beta(0, c)));
  }
};

/// The parameter gradients by lanes over the rows (exec.hpp, sum_rows_by_lanes), in double:
/// dgamma(0, c) += sum_r dy xhat, dbeta(0, c) += sum_r dy; lanes row_lanes x 2 hidden.
template <class T>
struct layer_norm_param_grads {
  matrix_view<const T> dy;
  matrix_view<const double> xhat;
  matrix_view<T> dgamma, dbeta;
  matrix_view<double> lanes;
  WEFT_HOST_DEVICE void lane(std::size_t l, std::size_t c) const {
    double sg = 0.0;
    double sb = 0.0;
    for (std::size_t r = l; r < dy.rows(); r += row_lanes) {
      const double d = static_cast<double>(dy(r, c));
      sg += d * xhat(r, c);
      sb += d;
    }
    lanes(l, c) = sg;
    lanes(l, dy.cols() + c) = sb;
  }
  WEFT_HOST_DEVICE void add(std::size_t r, std::size_t c) const {
    const double d = static_cast<double>(dy(r, c));
    lanes(r % row_lanes, c) += d * xhat(r, c);
    lanes(r % row_lanes, dy.cols() + c) += d;
  }
  WEFT_HOST_DEVICE void combine(std::size_t c) const {
    double sg = 0.0;
    double sb = 0.0;
    for (std::size_t l = 0; l < row_lanes; ++l) {
      sg += lanes(l, c);
      sb += lanes(l, dy.cols() + c);
    }
    dgamma(0, c) += static_cast<T>(sg);
    dbeta(0, c) += static_cast<T>(sb);
  }
};

// dx's stages, row r: 1. (r, l): lanes(r, l) and lanes(r, row_lanes + l) = the sums of
// g = dy * gamma and g * xhat over lane l's columns; 2. (r, 0): their means; 3. (r, c): dx
// (dx may be dy).
template <class T>
struct layer_norm_lane_grads {
  matrix_view<const T> dy;
  matrix_view<const T> gamma;
  matrix_view<const double> xhat;
  matrix_view<double> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t l) const {
    double sg = 0.0;
    double sgx = 0.0;
    for (std::size_t c = l; c < dy.cols(); c += row_lanes) {
      const double g = static_cast<double>(dy(r, c)) * static_cast<double>(gamma(0, c));
      sg += g;
      sgx += g * xhat(r, c);
    }
    lanes(r, l) = sg;
    lanes(r, row_lanes + l) = sgx;
  }
};

template <class T>
struct layer_norm_dx {
  matrix_view<const T> dy;
  matrix_view<T> dx;
  matrix_view<const T> gamma;
  matrix_view<const double> xhat;
  matrix_view<const double> rstd;
  matrix_view<const double> means; // rows x 2: mean(g), mean(g * xhat)
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    const double g = static_cast<double>(dy(r, c)) * static_cast<double>(gamma(0, c));
    dx(r, c) = static_cast<T>(rstd(r, 0) * (g - means(r, 0) - xhat(r, c) * means(r, 1)));
  }
};

} // namespace detail

template <class T, class SP = no_sequence_parallel, class Exec = host_policy>
class layer_norm {
public:
  using space = space_of<Exec>;

  explicit layer_norm(std::size_t hidden, double eps = 1e-5, Exec exec = {})
      : hidden_(hidden), eps_(eps), exec_(std::move(exec)) {
    if (hidden == 0) throw error("layer_norm: hidden must be positive");
    if (!(eps > 0.0)) throw error("layer_norm: eps must be positive");
    for (auto* m : {&gamma_, &beta_, &dgamma_, &dbeta_})
      detail::resize(exec_, *m, 1, hidden);
    detail::for_each_element(exec_, 1, hidden, detail::fill_element<T>{gamma_.view(), T{1}});
  }

  [[nodiscard]] std::size_t hidden() const noexcept { return hidden_; }

  /// x, y: rows x hidden (y may be x).
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    static constexpr std::string_view who = "layer_norm::forward";
    if (x.cols() != hidden_)
      ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), hidden_);
    expect_shape(who, "y", y, x.rows(), hidden_);
    const std::size_t rows = x.rows();
    detail::resize(exec_, xhat_, rows, hidden_);
    detail::resize(exec_, rstd_, rows, 1);
    scratch_.reserve(exec_, rows,
                     2); // the backward's shape (it uses two ways), so calls never reshape
    const auto lanes = scratch_.lanes.view();
    const auto mean = scratch_.results.view(); // column 0
    const auto n = static_cast<double>(hidden_);
    using detail::row_lanes;
    detail::for_each_row_in_stages(
        exec_, rows, detail::row_stage{row_lanes, detail::layer_norm_lane_sums<T>{x, lanes}},
        detail::row_stage{1, detail::lane_means{lanes, mean, n}},
        detail::row_stage{row_lanes, detail::layer_norm_lane_squares<T>{x, mean, lanes}},
        detail::row_stage{1, detail::lane_rstd{lanes, rstd_.view(), n, eps_}},
        detail::row_stage{hidden_,
                          detail::layer_norm_normalise<T>{x, y, gamma_.view(), beta_.view(), mean,
                                                          rstd_.view(), xhat_.view()}});
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
    detail::reshape(exec_, param_lanes_, detail::row_lanes, 2 * hidden_);
    detail::sum_rows_by_lanes(
        exec_, rows, hidden_,
        detail::layer_norm_param_grads<T>{dy, xhat_.view(), dgamma_.view(), dbeta_.view(),
                                          param_lanes_.view()});
    scratch_.reserve(exec_, rows, 2);
    const auto lanes = scratch_.lanes.view();
    const auto means = scratch_.results.view();
    using detail::row_lanes;
    detail::for_each_row_in_stages(
        exec_, rows,
        detail::row_stage{row_lanes,
                          detail::layer_norm_lane_grads<T>{dy, gamma_.view(), xhat_.view(), lanes}},
        detail::row_stage{1, detail::lane_means{lanes, means, static_cast<double>(hidden_)}},
        detail::row_stage{hidden_, detail::layer_norm_dx<T>{dy, dx, gamma_.view(), xhat_.view(),
                                                            rstd_.view(), means}});
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    return {{"gamma", gamma_.view(), dgamma_.view(), true, SP::enabled, 0, 0, 1, hidden_, false,
             false, home_of(gamma_), home_of(dgamma_)},
            {"beta", beta_.view(), dbeta_.view(), true, SP::enabled, 0, 0, 1, hidden_, false, false,
             home_of(beta_), home_of(dbeta_)}};
  }
  void zero_grad() {
    detail::zero(exec_, dgamma_);
    detail::zero(exec_, dbeta_);
  }

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
  [[nodiscard]] matrix_view<T> beta() noexcept { return beta_.view(); }

private:
  std::size_t hidden_;
  double eps_;
  Exec exec_;
  matrix<T, space> gamma_, beta_, dgamma_, dbeta_;
  matrix<double, space> xhat_;                 // the normalised input, kept for backward
  matrix<double, space> rstd_;                 // 1 / sqrt(var + eps), rows x 1
  detail::row_scratch<double, space> scratch_; // the row sums' lanes, the means
  matrix<double, space> param_lanes_;          // the gamma and beta gradients' lanes
  bool forwarded_ = false;
};

} // namespace weft::layer
