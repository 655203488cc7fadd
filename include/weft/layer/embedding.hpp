#pragma once
// The vocabulary-parallel embedding: the vocab x hidden table split by rows (split_range of the
// vocabulary over the TP group). Each rank looks up the ids in its own range and writes zeros for
// the rest; the sum over the group (an all-reduce, or under sequence_parallel a reduce-scatter to
// the rank's tokens) then holds every token's row. backward scatters dy (sequence_parallel:
// all-gathered first) into the gradient rows of the ids in the local range.
//
//   weft::layer::vocab_parallel_embedding<float, Comm> emb(tp, 50257, 1024, seed, /*tensor id*/ 0);
//   emb.forward(ids, y);     // ids: every token; y: tokens x hidden (SP: tokens / tp rows)
#include <weft/layer/init.hpp>
#include <weft/layer/linear.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

template <class T, communicator Comm, class SP = no_sequence_parallel>
class vocab_parallel_embedding {
public:
  vocab_parallel_embedding(Comm& tp, std::size_t vocab, std::size_t hidden, std::uint64_t seed, std::uint64_t tensor_id,
                           double init_std = 0.02)
      : tp_(&tp), vocab_(vocab), hidden_(hidden), range_(split_range(vocab, tp.size(), tp.rank())),
        w_(range_.size(), hidden), dw_(range_.size(), hidden) {
    if (vocab == 0 || hidden == 0) throw error("vocab_parallel_embedding: vocab and hidden must be positive");
    init_normal(w_.view(), hidden, range_.begin, 0, seed, tensor_id, init_std);
  }

  [[nodiscard]] range vocab_range() const noexcept { return range_; }
  [[nodiscard]] std::size_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] std::size_t hidden() const noexcept { return hidden_; }

  /// ids: every token's id, in [0, vocab). y: tokens x hidden (sequence_parallel: tokens / tp rows).
  void forward(std::span<const std::int32_t> ids, matrix_view<T> y) {
    static constexpr std::string_view who = "vocab_parallel_embedding::forward";
    const std::size_t tokens = ids.size();
    const std::size_t rows_out = SP::enabled ? detail::check_sequence_split(who, tokens, tp_->size()) : tokens;
    expect_shape(who, "y", y, rows_out, hidden_);
    for (std::size_t t = 0; t < tokens; ++t) {
      if (ids[t] < 0 || static_cast<std::size_t>(ids[t]) >= vocab_) {
        throw error(std::string(who) + ": token " + std::to_string(t) + " has id " + std::to_string(ids[t]) +
                    ", outside the vocabulary [0, " + std::to_string(vocab_) + ")");
      }
    }
    ids_.assign(ids.begin(), ids.end());
    part_.resize(tokens, hidden_);  // zero-filled: ids outside the local range contribute zeros
    for (std::size_t t = 0; t < tokens; ++t) {
      const auto id = static_cast<std::size_t>(ids[t]);
      if (id < range_.begin || id >= range_.end) continue;
      for (std::size_t c = 0; c < hidden_; ++c) part_(t, c) = w_(id - range_.begin, c);
    }
    if constexpr (SP::enabled) {
      detail::reduce_scatter_rows(*tp_, part_, y, staging_);
    } else {
      detail::all_reduce_into(*tp_, part_, y);
    }
    forwarded_ = true;
  }

  /// dy: like y. The table's gradient rows += dy rows of the tokens with local ids.
  void backward(matrix_view<const T> dy) {
    static constexpr std::string_view who = "vocab_parallel_embedding::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t tokens = ids_.size();
    expect_shape(who, "dy", dy, SP::enabled ? tokens / static_cast<std::size_t>(tp_->size()) : tokens, hidden_);
    matrix_view<const T> g = dy;
    if constexpr (SP::enabled) {
      detail::gather_rows(*tp_, dy, dy_, staging_);
      g = detail::cview(dy_);
    }
    for (std::size_t t = 0; t < tokens; ++t) {
      const auto id = static_cast<std::size_t>(ids_[t]);
      if (id < range_.begin || id >= range_.end) continue;
      for (std::size_t c = 0; c < hidden_; ++c) dw_(id - range_.begin, c) += g(t, c);
    }
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    return {{"weight", w_.view(), dw_.view(), false, false, range_.begin, 0, vocab_, hidden_}};
  }
  void zero_grad() { dw_.fill(T{}); }

  /// What backward needs from forward (the ids), moved out and back (see linear.hpp).
  struct activations {
    std::vector<std::int32_t> ids;
    bool forwarded = false;
  };
  [[nodiscard]] activations stash() { return {std::exchange(ids_, {}), std::exchange(forwarded_, false)}; }
  void restore(activations a) {
    ids_ = std::move(a.ids);
    forwarded_ = a.forwarded;
  }

  /// This rank's rows of the table: vocab_range().size() x hidden.
  [[nodiscard]] matrix_view<T> weight() noexcept { return w_.view(); }

private:
  Comm* tp_;
  std::size_t vocab_;
  std::size_t hidden_;
  range range_;
  matrix<T> w_, dw_;
  std::vector<std::int32_t> ids_;
  matrix<T> part_;  // this rank's lookups, zeros elsewhere, before the reduction
  matrix<T> dy_;    // sequence_parallel: the gathered dy
  matrix<T> staging_;
  bool forwarded_ = false;
};

} // namespace weft::layer
