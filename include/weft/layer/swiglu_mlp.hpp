#pragma once
// The tensor-parallel SwiGLU MLP of Llama-style blocks:
//   y = down( silu(x gate^T) * (x up^T) )
// gate and up (ffn x hidden, no bias) are split on their output dimension as column-parallel
// linears are, rank r holding the rows ffn_range() of both, so the product pairs the same ffn
// columns on every rank and needs no communication; down (hidden x ffn, no bias) is row-parallel.
// Like parallel_mlp it costs one all-reduce forward and one backward (sequence_parallel: an
// all-gather and a reduce-scatter each way):
//
//   forward:  x --(SP: all-gather)--> g = x gate_r^T, u = x up_r^T --> a = silu(g) u
//             --> down_r --all-reduce (SP: reduce-scatter)--> y
//   backward: dy --(SP: all-gather, in down)--> da --> dg, du
//             --> dx = all-reduce_r(dg gate_r + du up_r)  (SP: reduce-scatter)
//
// gate and up share the one input, so they are held here as one column-parallel pair rather than
// two column_parallel_linear: two of those would each gather the input (and keep a copy of it) and
// each reduce their own dx, two collectives each way where the pair needs one.
//
//   weft::layer::parallel_swiglu_mlp<float, Comm> mlp(tp, 4096, 11008, seed, /*tensor ids*/ 10); //
//   10, 11, 12 mlp.forward(x, y);      // x, y: tokens x hidden (sequence_parallel: this rank's
//   rows) mlp.backward(dy, dx);
//
// Weights are initialised by init_normal over the full shapes (the same model at every TP size):
// gate and up with options::init_std, down with options::out_init_std (models scale a residual
// branch's output projection, e.g. by 1 / sqrt(2 layers)). With a device GEMM policy (cublas on
// the communicator's stream) everything lives in device memory and runs on that stream.
#include <weft/comm/communicator.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/activation.hpp>
#include <weft/layer/linear.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

namespace detail {

/// a = silu(g) * u.
template <class T>
struct swiglu_forward_op {
  matrix_view<const T> g, u;
  matrix_view<T> a;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    a(r, c) = silu(g(r, c)) * u(r, c);
  }
};

/// From da: du = da * silu(g), and dg = da * u * silu'(g) written over da (read first).
template <class T>
struct swiglu_backward_op {
  matrix_view<const T> g, u;
  matrix_view<T> da; // in: the product's gradient; out: gate's output gradient
  matrix_view<T> du;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    const T x = g(r, c);
    const auto [sig, one_sig] = silu_eval(x);
    const T d = da(r, c);
    du(r, c) = d * (x * sig);
    da(r, c) = d * u(r, c) * (sig + x * sig * one_sig);
  }
};

[[nodiscard]] inline std::size_t checked_positive(std::string_view who, std::size_t hidden,
                                                  std::size_t ffn) {
  if (hidden == 0 || ffn == 0) throw error(std::string(who) + ": hidden and ffn must be positive");
  return hidden;
}

} // namespace detail

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel>
class parallel_swiglu_mlp {
  static_assert(gemm_for<Gemm, T>,
                "weft: parallel_swiglu_mlp: Gemm must be a GEMM policy for T (gemm.hpp)");

public:
  using row_type = row_parallel_linear<T, Comm, Gemm, SP>;
  using space = space_of<Gemm>; // where the weights and activations live

  struct options {
    double init_std = 0.02;     // gate and up
    double out_init_std = 0.02; // down
  };

  /// Tensor ids: tensor_id (gate), tensor_id + 1 (up), tensor_id + 2 (down).
  parallel_swiglu_mlp(Comm& tp, std::size_t hidden, std::size_t ffn, std::uint64_t seed,
                      std::uint64_t tensor_id, options opt = {}, Gemm gemm = {})
      : tp_(&tp),
        hidden_(detail::checked_positive("parallel_swiglu_mlp", hidden, ffn)),
        ffn_(ffn),
        opt_(opt),
        range_(split_range(ffn, tp.size(), tp.rank())),
        gemm_(gemm),
        down_(tp, ffn, hidden, seed, tensor_id + 2, {.bias = false, .init_std = opt.out_init_std},
              gemm) {
    detail::check_stream("parallel_swiglu_mlp", gemm_, tp);
    for (auto* m : {&gate_, &up_, &dgate_, &dup_})
      detail::resize(gemm_, *m, range_.size(), hidden);
    detail::init_weight(gemm_, gate_, hidden, range_.begin, 0, seed, tensor_id, opt.init_std);
    detail::init_weight(gemm_, up_, hidden, range_.begin, 0, seed, tensor_id + 1, opt.init_std);
  }

  [[nodiscard]] std::size_t hidden() const noexcept { return hidden_; }
  [[nodiscard]] std::size_t ffn() const noexcept { return ffn_; }
  /// This rank's rows of gate and up, and columns of down.
  [[nodiscard]] range ffn_range() const noexcept { return range_; }
  [[nodiscard]] const options& config() const noexcept { return opt_; }

  /// x, y: tokens x hidden (sequence_parallel: this rank's tokens / tp rows).
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    static constexpr std::string_view who = "parallel_swiglu_mlp::forward";
    if (x.cols() != hidden_)
      ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), hidden_);
    expect_shape(who, "y", y, x.rows(), hidden_); // before anything kept for backward changes
    const std::size_t tokens =
        SP::enabled ? x.rows() * static_cast<std::size_t>(tp_->size()) : x.rows();
    forwarded_ = false;
    if constexpr (SP::enabled) {
      detail::gather_rows(gemm_, *tp_, x, x_, staging_);
    } else {
      detail::assign(gemm_, x_, x);
    }
    for (auto* m : {&g_, &u_, &a_})
      detail::resize(gemm_, *m, tokens, range_.size());
    gemm_(trans::n, trans::t, T{1}, detail::cview(x_), detail::cview(gate_), T{0}, g_.view());
    gemm_(trans::n, trans::t, T{1}, detail::cview(x_), detail::cview(up_), T{0}, u_.view());
    detail::for_each_element(gemm_, tokens, range_.size(),
                             detail::swiglu_forward_op<T>{g_.view(), u_.view(), a_.view()});
    down_.forward(detail::cview(a_), y);
    forwarded_ = true;
  }

  /// dy, dx: like y and x. Every weight's gradient +=.
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    static constexpr std::string_view who = "parallel_swiglu_mlp::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t tokens = x_.rows();
    const std::size_t rows = SP::enabled ? tokens / static_cast<std::size_t>(tp_->size()) : tokens;
    expect_shape(who, "dy", dy, rows, hidden_);
    expect_shape(who, "dx", dx, rows, hidden_);
    detail::resize(gemm_, da_, tokens, range_.size());
    detail::reshape(gemm_, a_, tokens,
                    range_.size()); // scratch now (down kept its copy): up's gradient
    down_.backward(dy, da_.view());
    detail::for_each_element(
        gemm_, tokens, range_.size(),
        detail::swiglu_backward_op<T>{g_.view(), u_.view(), da_.view(), a_.view()});
    const auto dg = detail::cview(da_);
    const auto du = detail::cview(a_);
    gemm_(trans::t, trans::n, T{1}, dg, detail::cview(x_), T{1}, dgate_.view());
    gemm_(trans::t, trans::n, T{1}, du, detail::cview(x_), T{1}, dup_.view());
    // dx = the sum over ranks of dg gate_r + du up_r: both terms before the one reduction.
    detail::resize(gemm_, dx_, tokens, hidden_);
    gemm_(trans::n, trans::n, T{1}, dg, detail::cview(gate_), T{0}, dx_.view());
    gemm_(trans::n, trans::n, T{1}, du, detail::cview(up_), T{1}, dx_.view());
    if constexpr (SP::enabled) {
      detail::reduce_scatter_rows(gemm_, *tp_, dx_, dx, staging_);
    } else {
      detail::all_reduce_into(gemm_, *tp_, dx_, dx);
    }
  }

  /// gate.weight, up.weight, down.weight.
  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    ps.push_back({"gate.weight", gate_.view(), dgate_.view(), false, false, range_.begin, 0, ffn_,
                  hidden_, true, false, home_of(gate_), home_of(dgate_)});
    ps.push_back({"up.weight", up_.view(), dup_.view(), false, false, range_.begin, 0, ffn_,
                  hidden_, true, false, home_of(up_), home_of(dup_)});
    for (auto& p : down_.parameters()) {
      p.name = "down." + p.name;
      ps.push_back(std::move(p));
    }
    return ps;
  }
  void zero_grad() {
    detail::zero(gemm_, dgate_);
    detail::zero(gemm_, dup_);
    down_.zero_grad();
  }

  /// Bytes held from forward for backward (the input, gate's and up's outputs, down's input,
  /// scratch); release() frees them.
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return down_.saved_bytes() +
           (x_.size() + g_.size() + u_.size() + a_.size() + da_.size()) * sizeof(T);
  }
  void release() {
    down_.release();
    for (auto* m : {&x_, &g_, &u_, &a_, &da_, &dx_, &staging_})
      *m = {};
    forwarded_ = false;
  }

  /// What backward needs from forward, moved out and back (see linear.hpp).
  struct activations {
    matrix<T, space> x; // sequence_parallel: gathered
    matrix<T, space> g;
    matrix<T, space> u;
    typename row_type::activations down;
    bool forwarded = false;
    [[nodiscard]] std::size_t bytes() const noexcept {
      return (x.size() + g.size() + u.size()) * sizeof(T) + down.bytes();
    }
  };
  [[nodiscard]] activations stash() {
    return {std::exchange(x_, {}), std::exchange(g_, {}), std::exchange(u_, {}), down_.stash(),
            std::exchange(forwarded_, false)};
  }
  void restore(activations a) {
    x_ = std::move(a.x);
    g_ = std::move(a.g);
    u_ = std::move(a.u);
    down_.restore(std::move(a.down));
    forwarded_ = a.forwarded;
  }

  /// This rank's rows of gate and up: ffn_range().size() x hidden, in the GEMM policy's memory.
  [[nodiscard]] matrix_view<T> gate_weight() noexcept { return gate_.view(); }
  [[nodiscard]] matrix_view<T> up_weight() noexcept { return up_.view(); }
  [[nodiscard]] row_type& down() noexcept { return down_; }

private:
  Comm* tp_;
  std::size_t hidden_;
  std::size_t ffn_;
  options opt_;
  range range_;
  Gemm gemm_;
  row_type down_;
  matrix<T, space> gate_, up_, dgate_, dup_; // this rank's rows, and their gradients
  matrix<T, space> x_;       // the input (sequence_parallel: gathered), kept for backward
  matrix<T, space> g_, u_;   // gate's and up's outputs, kept for backward
  matrix<T, space> a_;       // silu(g) * u; in backward, up's output gradient
  matrix<T, space> da_;      // down's input gradient, then gate's output gradient
  matrix<T, space> dx_;      // dx before its reduction
  matrix<T, space> staging_; // for non-contiguous views passed to a collective
  bool forwarded_ = false;
};

} // namespace weft::layer
