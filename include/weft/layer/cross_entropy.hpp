#pragma once
// Cross-entropy over a vocabulary split by columns across the TP group (the logits of a column-
// parallel LM head: rank r holds columns split_range(vocab, tp, r) of every token's row), without
// ever gathering the logits. Per token t, with m_t the row's maximum:
//   loss_t = log(sum_v exp(l_tv - m_t)) - (l_t,target - m_t)
// which takes an all-reduce of the local maxima (op::max), then one all-reduce that sums two
// vectors packed together: the target logits (each is held by exactly one rank; the others give
// 0) and the local sums of exp(l - m). The mean over tokens is returned. backward needs no
// communication: d(mean loss)/dl_tv = (softmax_tv - [v == target_t]) / tokens, on local columns.
//
// Computed in T, at least float (so fp32 for float, fp64 for double), in a fixed order: the same
// loss at every TP size, including a vocabulary that does not divide by it (the uneven columns
// are split_range's, which the column-parallel layer producing the logits uses too).
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/layer/init.hpp>
#include <weft/layer/matrix.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace weft::layer {

template <class T, communicator Comm>
class vocab_parallel_cross_entropy {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "weft: vocab_parallel_cross_entropy computes in float or double: use T = float or double");

public:
  vocab_parallel_cross_entropy(Comm& tp, std::size_t vocab)
      : tp_(&tp), vocab_(vocab), range_(split_range(vocab, tp.size(), tp.rank())) {
    if (vocab == 0) throw error("vocab_parallel_cross_entropy: vocab must be positive");
  }

  [[nodiscard]] range vocab_range() const noexcept { return range_; }

  /// logits: tokens x vocab_range().size(); targets: tokens ids in [0, vocab). Returns the mean loss.
  double forward(matrix_view<const T> logits, std::span<const std::int32_t> targets) {
    static constexpr std::string_view who = "vocab_parallel_cross_entropy::forward";
    const std::size_t tokens = targets.size();
    if (tokens == 0) throw error(std::string(who) + ": no tokens");
    expect_shape(who, "logits", logits, tokens, range_.size());
    for (std::size_t t = 0; t < tokens; ++t) {
      if (targets[t] < 0 || static_cast<std::size_t>(targets[t]) >= vocab_) {
        throw error(std::string(who) + ": token " + std::to_string(t) + " has target " + std::to_string(targets[t]) +
                    ", outside the vocabulary [0, " + std::to_string(vocab_) + ")");
      }
    }
    const std::size_t cols = range_.size();
    // 1. The row maxima.
    std::vector<T> row_max(tokens, std::numeric_limits<T>::lowest());
    for (std::size_t t = 0; t < tokens; ++t)
      for (std::size_t c = 0; c < cols; ++c) row_max[t] = std::max(row_max[t], logits(t, c));
    if (tp_->size() > 1) all_reduce(*tp_, std::span<T>(row_max), op::max{});
    // 2. Target logits (shifted) and sums of exponentials, packed into one all-reduce.
    std::vector<T> sums(2 * tokens, T{});
    probs_.resize(tokens, cols);
    for (std::size_t t = 0; t < tokens; ++t) {
      const auto target = static_cast<std::size_t>(targets[t]);
      if (target >= range_.begin && target < range_.end) sums[t] = logits(t, target - range_.begin) - row_max[t];
      T s{};
      for (std::size_t c = 0; c < cols; ++c) {
        const T e = std::exp(logits(t, c) - row_max[t]);
        probs_(t, c) = e;
        s += e;
      }
      sums[tokens + t] = s;
    }
    if (tp_->size() > 1) all_reduce(*tp_, std::span<T>(sums));
    double total = 0.0;
    for (std::size_t t = 0; t < tokens; ++t) {
      const T sum_exp = sums[tokens + t];
      total += static_cast<double>(std::log(sum_exp) - sums[t]);
      for (std::size_t c = 0; c < cols; ++c) probs_(t, c) /= sum_exp;
    }
    targets_.assign(targets.begin(), targets.end());
    return total / static_cast<double>(tokens);
  }

  /// dlogits: tokens x vocab_range().size(), overwritten with d(mean loss)/d(logits).
  void backward(matrix_view<T> dlogits) {
    static constexpr std::string_view who = "vocab_parallel_cross_entropy::backward";
    if (targets_.empty()) throw error(std::string(who) + ": called before forward");
    const std::size_t tokens = targets_.size();
    expect_shape(who, "dlogits", dlogits, tokens, range_.size());
    const T inv = T{1} / static_cast<T>(tokens);
    for (std::size_t t = 0; t < tokens; ++t) {
      const auto target = static_cast<std::size_t>(targets_[t]);
      for (std::size_t c = 0; c < range_.size(); ++c) {
        const T onehot = range_.begin + c == target ? T{1} : T{0};
        dlogits(t, c) = (probs_(t, c) - onehot) * inv;
      }
    }
  }

private:
  Comm* tp_;
  std::size_t vocab_;
  range range_;
  matrix<T> probs_;  // the softmax on local columns, kept for backward
  std::vector<std::int32_t> targets_;
};

} // namespace weft::layer
