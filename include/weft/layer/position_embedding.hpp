#pragma once
// Learned absolute position embeddings (GPT-2's wpe): a seq x hidden table whose row p is added
// to every token at position p of its sequence,
//   y(i, :) += table((first_row + i) % seq, :)
// where the rows of y are token rows of a microbatch, sequence after sequence, and first_row is
// where this rank's rows start among them (0, or under sequence_parallel rank * rows). The table
// is replicated whole on every TP rank (as Megatron keeps it on the first stage), so there is no
// communication; under sequence_parallel its gradient is a partial sum over the rank's rows
// (parameter::sequence_partial) that reduce_sequence_parallel_grads completes.
//
//   weft::layer::position_embedding<float> wpe(1024, 768, seed, /*tensor id*/ 1);
//   wpe.forward(h.view(), 0);   // h: the token embeddings, tokens x hidden; += the positions' rows
//   wpe.backward(dh);           // the table's gradient rows += dh's rows
//
// Exec says where the table and y live (exec.hpp). backward adds each table element's rows in
// token order (one thread per element of the table on a device, no atomics), so positions that
// repeat over the sequences of a microbatch sum the same way on the host and on a device.
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/init.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

namespace detail {

/// y(i, c) += w((offset + i) % w.rows(), c).
template <class T>
struct position_add {
  matrix_view<T> y;
  matrix_view<const T> w;
  std::size_t offset; // first_row % seq
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t c) const {
    y(i, c) += w((offset + i) % w.rows(), c);
  }
};

/// The table's gradient, one row i of dy at a time: dw((offset + i) % seq, c) += dy(i, c) (the
/// host's loop, row after row for the cache).
template <class T>
struct position_grad_column {
  matrix_view<const T> dy;
  matrix_view<T> dw;
  std::size_t offset;
  WEFT_HOST_DEVICE void step(std::size_t i, std::size_t c) const {
    dw((offset + i) % dw.rows(), c) += dy(i, c);
  }
};

/// Element (p, c) of the table's gradient: dw(p, c) += dy(i, c) for the rows i at position p
/// ((offset + i) % seq == p), in order: the additions position_grad_column makes to that element,
/// in the same order, so the same bits. Called as (p, c) for every element of the table (a device
/// thread each; offset < seq).
template <class T>
struct position_grad_element {
  matrix_view<const T> dy;
  matrix_view<T> dw;
  std::size_t offset;
  WEFT_HOST_DEVICE void operator()(std::size_t p, std::size_t c) const {
    const std::size_t seq = dw.rows();
    T s = dw(p, c);
    for (std::size_t i = (p + seq - offset) % seq; i < dy.rows(); i += seq)
      s += dy(i, c);
    dw(p, c) = s;
  }
};

} // namespace detail

template <class T, class SP = no_sequence_parallel, class Exec = host_policy>
class position_embedding {
public:
  using space = space_of<Exec>;

  /// decay: whether weight decay applies to the table (Megatron decays embeddings).
  position_embedding(std::size_t seq, std::size_t hidden, std::uint64_t seed,
                     std::uint64_t tensor_id, double init_std = 0.02, Exec exec = {},
                     bool decay = true)
      : seq_(seq), hidden_(hidden), decay_(decay), exec_(std::move(exec)) {
    if (seq == 0 || hidden == 0) throw error("position_embedding: seq and hidden must be positive");
    detail::resize(exec_, w_, seq, hidden);
    detail::resize(exec_, dw_, seq, hidden);
    detail::init_weight(exec_, w_, hidden, 0, 0, seed, tensor_id, init_std);
  }

  [[nodiscard]] std::size_t seq() const noexcept { return seq_; }
  [[nodiscard]] std::size_t hidden() const noexcept { return hidden_; }

  /// y: rows x hidden, the token rows [first_row, first_row + rows) of the microbatch; += in place.
  void forward(matrix_view<T> y, std::size_t first_row) {
    static constexpr std::string_view who = "position_embedding::forward";
    if (y.cols() != hidden_)
      ::weft::detail::shape_error(who, "y", y.rows(), y.cols(), y.rows(), hidden_);
    offset_ = first_row % seq_;
    rows_ = y.rows();
    detail::for_each_element(exec_, y.rows(), hidden_,
                             detail::position_add<T>{y, w_.view(), offset_});
    forwarded_ = true;
  }

  /// dy: like forward's y. The table's gradient rows += dy's rows.
  void backward(matrix_view<const T> dy) {
    static constexpr std::string_view who = "position_embedding::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    expect_shape(who, "dy", dy, rows_, hidden_);
    if constexpr (detail::element_policy<Exec, detail::position_grad_element<T>>) {
      detail::for_each_element(exec_, seq_, hidden_,
                               detail::position_grad_element<T>{dy, dw_.view(), offset_});
    } else { // row by row, for the cache; the same sums in the same order
      static_assert(!on_device<Exec>,
                    "weft: a device policy must define each_element(policy, rows, cols, f)");
      const detail::position_grad_column<T> grad{dy, dw_.view(), offset_};
      for (std::size_t i = 0; i < rows_; ++i)
        for (std::size_t c = 0; c < hidden_; ++c)
          grad.step(i, c);
    }
  }

  /// "weight": seq x hidden, replicated.
  [[nodiscard]] std::vector<parameter<T>> parameters() {
    return {{"weight", w_.view(), dw_.view(), true, SP::enabled, 0, 0, seq_, hidden_, decay_, false,
             home_of(w_), home_of(dw_)}};
  }
  void zero_grad() { detail::zero(exec_, dw_); }

  /// Backward needs only where the rows were (no tensor): nothing to free.
  [[nodiscard]] std::size_t saved_bytes() const noexcept { return 0; }
  void release() { forwarded_ = false; }

  /// What backward needs from forward, moved out and back (see linear.hpp).
  struct activations {
    std::size_t offset = 0; // first_row % seq
    std::size_t rows = 0;
    bool forwarded = false;
    [[nodiscard]] static constexpr std::size_t bytes() noexcept {
      return 0;
    } // where the rows were, no tensor
  };
  [[nodiscard]] activations stash() { return {offset_, rows_, std::exchange(forwarded_, false)}; }
  void restore(activations a) {
    offset_ = a.offset;
    rows_ = a.rows;
    forwarded_ = a.forwarded;
  }

  /// The table, seq x hidden, in Exec's memory.
  [[nodiscard]] matrix_view<T> weight() noexcept { return w_.view(); }

private:
  std::size_t seq_;
  std::size_t hidden_;
  bool decay_;
  Exec exec_;
  matrix<T, space> w_, dw_;
  std::size_t offset_ = 0; // the forward's first_row % seq, kept for backward
  std::size_t rows_ = 0;
  bool forwarded_ = false;
};

} // namespace weft::layer
