#pragma once
// Tensor-parallel linear layers (Megatron-style): y = x W^T + b with W stored out x in, tokens as
// rows, and the communication inside the layer.
//
//   column_parallel_linear: W split on the output dimension; rank r holds rows out_range() of W.
//       forward:  x (every token) --identity "f"--> x W_r^T + b_r      (optional all-gather of y)
//       backward: dx = all-reduce_r(dy_r W_r)                           (the "f" backward)
//   row_parallel_linear: W split on the input dimension; rank r holds columns in_range() of W.
//       forward:  y = all-reduce_r(x_r W_r^T) + b  ("g"; the bias once, after the reduction)
//       backward: dx_r = dy W_r                     (identity; dy is the same on every rank)
//
// Under sequence_parallel (policy.hpp) the tokens outside the pair are split over the ranks: the
// column layer all-gathers its input rows first and reduce-scatters dx; the row layer reduce-
// scatters y to the rank's rows and all-gathers dy. A column -> row pair is then
//   all-gather | GEMM | ... | GEMM | reduce-scatter   instead of   GEMM | ... | GEMM | all-reduce.
//
// Both keep a copy of their (gathered) input between forward and backward; a second forward
// overwrites it. Gradients accumulate (+=) until zero_grad(). Weights are initialised by
// init_normal over the full shape (the same model at every TP size), biases to zero.
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/gemm.hpp>
#include <weft/layer/init.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

namespace detail {

template <class T>
[[nodiscard]] WEFT_HOST_DEVICE matrix_view<const T> cview(matrix_view<T> v) noexcept {
  return matrix_view<const T>(v.data(), v.rows(), v.cols(), v.ld());
}
template <class T, class Space>
[[nodiscard]] matrix_view<const T> cview(const matrix<T, Space>& m) noexcept {
  return m.view();
}

/// dst = src (resized to src's shape).
template <class Gemm, class T, class Space>
void assign(const Gemm& g, matrix<T, Space>& dst, matrix_view<const T> src) {
  if (dst.rows() != src.rows() || dst.cols() != src.cols()) resize(g, dst, src.rows(), src.cols());
  copy_view(g, src, dst.view());
}

/// The tokens, given a rank's row count, where rows are split evenly over the TP group.
[[nodiscard]] inline std::size_t check_sequence_split(std::string_view who, std::size_t tokens,
                                                      int tp) {
  const auto p = static_cast<std::size_t>(tp);
  if (tokens % p != 0) {
    throw error(std::string(who) + ": sequence parallelism splits the " + std::to_string(tokens) +
                " tokens over " + std::to_string(tp) + " ranks, and they do not divide");
  }
  return tokens / p;
}

/// full = the rows of every rank's `local`, rank after rank (all-gather along the tokens).
template <class Gemm, class T, class Space, communicator Comm>
void gather_rows(const Gemm& g, Comm& tp, matrix_view<const T> local, matrix<T, Space>& full,
                 matrix<T, Space>& staging) {
  const std::size_t p = static_cast<std::size_t>(tp.size());
  resize(g, full, local.rows() * p, local.cols());
  if (p == 1) {
    copy_view(g, local, full.view());
    return;
  }
  std::span<const T> in;
  if (local.contiguous()) {
    in = std::span<const T>(local.data(), local.size());
  } else {
    assign(g, staging, local);
    in = flat_of(staging);
  }
  all_gather(tp, in, flat_of(full));
}

/// out = this rank's block of rows of the sum over ranks of `full` (contiguous).
template <class Gemm, class T, class Space, communicator Comm>
void reduce_scatter_rows(const Gemm& g, Comm& tp, matrix<T, Space>& full, matrix_view<T> out,
                         matrix<T, Space>& staging) {
  if (tp.size() == 1) {
    copy_view(g, cview(full), out);
    return;
  }
  if (out.contiguous()) {
    reduce_scatter(tp, std::span<const T>(flat_of(full)), std::span<T>(out.data(), out.size()));
  } else {
    resize(g, staging, out.rows(), out.cols());
    reduce_scatter(tp, std::span<const T>(flat_of(full)), flat_of(staging));
    copy_view(g, cview(staging), out);
  }
}

/// out = the sum over ranks of `part` (contiguous; summed in place).
template <class Gemm, class T, class Space, communicator Comm>
void all_reduce_into(const Gemm& g, Comm& tp, matrix<T, Space>& part, matrix_view<T> out) {
  if (tp.size() > 1) all_reduce(tp, flat_of(part));
  copy_view(g, cview(part), out);
}

template <class Gemm, class T, class Space>
void add_row_vector(const Gemm& g, matrix_view<T> y, const matrix<T, Space>& b) {
  for_each_element(g, y.rows(), y.cols(), add_row<T>{y, b.view()});
}

/// db += the column sums of dy (lanes: scratch, row_lanes x dy.cols()).
template <class Gemm, class T, class Space>
void accumulate_column_sums(const Gemm& g, matrix_view<const T> dy, matrix<T, Space>& db,
                            matrix<double, Space>& lanes) {
  reshape(g, lanes, row_lanes, dy.cols());
  sum_rows_by_lanes(g, dy.rows(), dy.cols(), column_sums<T>{dy, db.view(), lanes.view()});
}

/// A weight initialised by init_normal over the full shape, in the policy's memory.
template <class Gemm, class T, class Space>
void init_weight(const Gemm& g, matrix<T, Space>& w, std::size_t fan_in, std::size_t row0,
                 std::size_t col0, std::uint64_t seed, std::uint64_t tensor_id, double stddev) {
  if constexpr (on_device<Gemm>) {
    matrix<T> host(w.rows(), w.cols());
    init_normal(host.view(), fan_in, row0, col0, seed, tensor_id, stddev);
    w.copy_from(host.view(), g.stream());
  } else {
    (void)g;
    init_normal(w.view(), fan_in, row0, col0, seed, tensor_id, stddev);
  }
}

// What column_parallel_linear and row_parallel_linear share: this rank's weight and bias with
// their gradients, and the input kept from forward for backward.
template <class T, class Gemm>
class linear_state {
public:
  using space = space_of<Gemm>;

  void zero_grad() {
    zero(gemm_, dw_);
    zero(gemm_, db_);
  }

  /// Bytes kept from forward for backward (the input copy); release() frees them, after which
  /// backward needs a new forward (full recompute).
  [[nodiscard]] std::size_t saved_bytes() const noexcept { return x_.size() * sizeof(T); }
  void release() {
    x_ = {};
    forwarded_ = false;
  }

  /// What backward needs from forward, moved out (the layer is left as after release()) and
  /// back: a pipeline keeps one per microbatch in flight.
  struct activations {
    matrix<T, space> x;
    bool forwarded = false;
    [[nodiscard]] std::size_t bytes() const noexcept { return x.size() * sizeof(T); }
  };
  [[nodiscard]] activations stash() {
    return {std::exchange(x_, {}), std::exchange(forwarded_, false)};
  }
  void restore(activations a) {
    x_ = std::move(a.x);
    forwarded_ = a.forwarded;
  }

  /// This rank's shard of the weight and of the bias (empty without bias); shapes in the class.
  /// In the GEMM policy's memory (device memory for cublas).
  [[nodiscard]] matrix_view<T> weight() noexcept { return w_.view(); }
  [[nodiscard]] matrix_view<T> bias() noexcept { return b_.view(); }

protected:
  linear_state(Gemm gemm, std::size_t rows, std::size_t cols, bool bias, std::size_t bias_cols)
      : gemm_(std::move(gemm)) {
    resize(gemm_, w_, rows, cols);
    resize(gemm_, dw_, rows, cols);
    resize(gemm_, b_, bias ? 1 : 0, bias_cols);
    resize(gemm_, db_, bias ? 1 : 0, bias_cols);
  }

  template <class Comm>
  void check_stream(std::string_view who, const Comm& tp) const {
    detail::check_stream(who, gemm_, tp);
  }

  Gemm gemm_;
  matrix<T, space> w_, dw_, b_, db_;
  matrix<double, space> db_lanes_; // the bias gradient's partial sums (sum_rows_by_lanes)
  matrix<T, space>
      x_; // the input (column-parallel under sequence parallelism: gathered), kept for backward
  bool forwarded_ = false;
};

} // namespace detail

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel>
class column_parallel_linear : public detail::linear_state<T, Gemm> {
  static_assert(gemm_for<Gemm, T>,
                "weft: column_parallel_linear: Gemm must be a GEMM policy for T (gemm.hpp)");
  using state = detail::linear_state<T, Gemm>;
  using state::b_, state::db_, state::db_lanes_, state::dw_, state::forwarded_, state::gemm_,
      state::w_, state::x_;
  using space = typename state::space;

public:
  // This rank's shard: weight out_local x in, bias 1 x out_local.
  struct options {
    bool bias = true;
    bool gather_output = false;
    double init_std = 0.02;
  };

  column_parallel_linear(Comm& tp, std::size_t in, std::size_t out, std::uint64_t seed,
                         std::uint64_t tensor_id, options opt = {}, Gemm gemm = {})
      : state(std::move(gemm), split_range(out, tp.size(), tp.rank()).size(), in, opt.bias,
              split_range(out, tp.size(), tp.rank()).size()),
        tp_(&tp),
        in_(in),
        out_(out),
        opt_(opt),
        range_(split_range(out, tp.size(), tp.rank())) {
    if (in == 0 || out == 0) throw error("column_parallel_linear: in and out must be positive");
    this->check_stream("column_parallel_linear", tp);
    detail::init_weight(gemm_, w_, in, range_.begin, 0, seed, tensor_id, opt.init_std);
  }

  [[nodiscard]] range out_range() const noexcept { return range_; }
  [[nodiscard]] std::size_t out_local() const noexcept { return range_.size(); }
  [[nodiscard]] std::size_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return out_; }
  [[nodiscard]] const options& config() const noexcept { return opt_; }
  [[nodiscard]] Comm& comm() const noexcept { return *tp_; }

  /// x: tokens x in (sequence_parallel: this rank's tokens / tp rows). y: tokens x out_local(), or
  /// tokens x out with gather_output.
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    static constexpr std::string_view who = "column_parallel_linear::forward";
    if (x.cols() != in_) ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), in_);
    // Every shape is checked before anything kept for backward changes.
    const std::size_t tokens =
        SP::enabled ? x.rows() * static_cast<std::size_t>(tp_->size()) : x.rows();
    expect_shape(who, "y", y, tokens, opt_.gather_output ? out_ : range_.size());
    forwarded_ = false;
    if constexpr (SP::enabled) {
      detail::gather_rows(gemm_, *tp_, x, x_, staging_);
    } else {
      detail::assign(gemm_, x_, x);
    }
    forwarded_ = true;
    if (!opt_.gather_output) {
      matmul_forward(y);
      return;
    }
    // Gather the output columns: every rank's block padded to the largest, then unpacked.
    const std::size_t widest = split_range(out_, tp_->size(), 0).size();
    detail::resize(gemm_, part_, tokens, widest);
    matmul_forward(part_.view().cols_from(0, range_.size()));
    if (tp_->size() == 1) {
      detail::copy_view(gemm_, detail::cview(part_), y);
      return;
    }
    detail::resize(gemm_, gathered_, tokens * static_cast<std::size_t>(tp_->size()), widest);
    all_gather(*tp_, std::span<const T>(detail::flat_of(part_)), detail::flat_of(gathered_));
    for (int r = 0; r < tp_->size(); ++r) {
      const range rr = split_range(out_, tp_->size(), r);
      const auto block = gathered_.view().rows_from(static_cast<std::size_t>(r) * tokens, tokens);
      detail::copy_view(gemm_, detail::cview(block.cols_from(0, rr.size())),
                        y.cols_from(rr.begin, rr.size()));
    }
  }

  /// dy: like y. dx: like x (all-reduced over the group; sequence_parallel: reduce-scattered).
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    static constexpr std::string_view who = "column_parallel_linear::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t tokens = x_.rows();
    expect_shape(who, "dy", dy, tokens, opt_.gather_output ? out_ : range_.size());
    const std::size_t rows_out =
        SP::enabled ? tokens / static_cast<std::size_t>(tp_->size()) : tokens;
    expect_shape(who, "dx", dx, rows_out, in_);
    const matrix_view<const T> g =
        opt_.gather_output ? dy.cols_from(range_.begin, range_.size()) : dy;
    // dW += dy^T x, db += column sums of dy.
    gemm_(trans::t, trans::n, T{1}, g, detail::cview(x_), T{1}, dw_.view());
    if (opt_.bias) detail::accumulate_column_sums(gemm_, g, db_, db_lanes_);
    // dx = (sum over ranks) dy_r W_r.
    detail::resize(gemm_, dx_, tokens, in_);
    gemm_(trans::n, trans::n, T{1}, g, detail::cview(w_), T{0}, dx_.view());
    if constexpr (SP::enabled) {
      detail::reduce_scatter_rows(gemm_, *tp_, dx_, dx, staging_);
    } else {
      detail::all_reduce_into(gemm_, *tp_, dx_, dx);
    }
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    ps.push_back({"weight", w_.view(), dw_.view(), false, false, range_.begin, 0, out_, in_, true,
                  false, home_of(w_), home_of(dw_)});
    if (opt_.bias) {
      ps.push_back({"bias", b_.view(), db_.view(), false, false, 0, range_.begin, 1, out_, false,
                    false, home_of(b_), home_of(db_)});
    }
    return ps;
  }

private:
  void matmul_forward(matrix_view<T> y) {
    gemm_(trans::n, trans::t, T{1}, detail::cview(x_), detail::cview(w_), T{0}, y);
    if (opt_.bias) detail::add_row_vector(gemm_, y, b_);
  }

  Comm* tp_;
  std::size_t in_;
  std::size_t out_;
  options opt_;
  range range_;
  matrix<T, space> dx_;       // dx before its reduction
  matrix<T, space> part_;     // gather_output: this rank's columns, padded
  matrix<T, space> gathered_; // gather_output: every rank's
  matrix<T, space> staging_;
};

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel>
class row_parallel_linear : public detail::linear_state<T, Gemm> {
  static_assert(gemm_for<Gemm, T>,
                "weft: row_parallel_linear: Gemm must be a GEMM policy for T (gemm.hpp)");
  using state = detail::linear_state<T, Gemm>;
  using state::b_, state::db_, state::db_lanes_, state::dw_, state::forwarded_, state::gemm_,
      state::w_, state::x_;
  using space = typename state::space;

public:
  // This rank's shard: weight out x in_local, bias 1 x out (replicated).
  struct options {
    bool bias = true;
    double init_std = 0.02;
  };

  row_parallel_linear(Comm& tp, std::size_t in, std::size_t out, std::uint64_t seed,
                      std::uint64_t tensor_id, options opt = {}, Gemm gemm = {})
      : state(std::move(gemm), out, split_range(in, tp.size(), tp.rank()).size(), opt.bias, out),
        tp_(&tp),
        in_(in),
        out_(out),
        opt_(opt),
        range_(split_range(in, tp.size(), tp.rank())) {
    if (in == 0 || out == 0) throw error("row_parallel_linear: in and out must be positive");
    this->check_stream("row_parallel_linear", tp);
    detail::init_weight(gemm_, w_, in, 0, range_.begin, seed, tensor_id, opt.init_std);
  }

  [[nodiscard]] range in_range() const noexcept { return range_; }
  [[nodiscard]] std::size_t in_local() const noexcept { return range_.size(); }
  [[nodiscard]] std::size_t in_features() const noexcept { return in_; }
  [[nodiscard]] std::size_t out_features() const noexcept { return out_; }
  [[nodiscard]] const options& config() const noexcept { return opt_; }
  [[nodiscard]] Comm& comm() const noexcept { return *tp_; }

  /// x: tokens x in_local(). y: tokens x out, summed over the group (sequence_parallel: this
  /// rank's tokens / tp rows of it); the bias is added after the reduction.
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    static constexpr std::string_view who = "row_parallel_linear::forward";
    if (x.cols() != range_.size())
      ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), range_.size());
    const std::size_t tokens = x.rows();
    const std::size_t rows_out =
        SP::enabled ? detail::check_sequence_split(who, tokens, tp_->size()) : tokens;
    expect_shape(who, "y", y, rows_out, out_);
    forwarded_ = false;
    detail::assign(gemm_, x_, x);
    detail::resize(gemm_, part_, tokens, out_);
    gemm_(trans::n, trans::t, T{1}, detail::cview(x_), detail::cview(w_), T{0}, part_.view());
    if constexpr (SP::enabled) {
      detail::reduce_scatter_rows(gemm_, *tp_, part_, y, staging_);
    } else {
      detail::all_reduce_into(gemm_, *tp_, part_, y);
    }
    if (opt_.bias) detail::add_row_vector(gemm_, y, b_);
    forwarded_ = true;
  }

  /// dy: like y (sequence_parallel: this rank's rows, all-gathered here). dx: tokens x in_local().
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    static constexpr std::string_view who = "row_parallel_linear::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t tokens = x_.rows();
    const std::size_t rows_in =
        SP::enabled ? tokens / static_cast<std::size_t>(tp_->size()) : tokens;
    expect_shape(who, "dy", dy, rows_in, out_);
    expect_shape(who, "dx", dx, tokens, range_.size());
    if (opt_.bias)
      detail::accumulate_column_sums(gemm_, dy, db_, db_lanes_); // SP: this rank's rows only
    matrix_view<const T> g = dy;
    if constexpr (SP::enabled) {
      detail::gather_rows(gemm_, *tp_, dy, dy_, staging_);
      g = detail::cview(dy_);
    }
    gemm_(trans::t, trans::n, T{1}, g, detail::cview(x_), T{1}, dw_.view());
    gemm_(trans::n, trans::n, T{1}, g, detail::cview(w_), T{0}, dx);
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    ps.push_back({"weight", w_.view(), dw_.view(), false, false, 0, range_.begin, out_, in_, true,
                  false, home_of(w_), home_of(dw_)});
    if (opt_.bias) {
      ps.push_back({"bias", b_.view(), db_.view(), true, SP::enabled, 0, 0, 1, out_, false, false,
                    home_of(b_), home_of(db_)});
    }
    return ps;
  }

private:
  Comm* tp_;
  std::size_t in_;
  std::size_t out_;
  options opt_;
  range range_;
  matrix<T, space> part_; // x W^T before its reduction
  matrix<T, space> dy_;   // sequence_parallel: the gathered dy
  matrix<T, space> staging_;
};

} // namespace weft::layer
