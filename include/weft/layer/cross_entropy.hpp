#pragma once
// Cross-entropy over a vocabulary split by columns across the TP group (the logits of a column-
// parallel LM head: rank r holds columns split_range(vocab, tp, r) of every token's row), without
// ever gathering the logits. Per token t, with m_t the row's maximum:
//   loss_t = log(sum_v exp(l_tv - m_t)) - (l_t,target - m_t)
// which takes an all-reduce of the local maxima (op::max), then one all-reduce that sums two
// vectors packed together: the target logits (each is held by exactly one rank; the others give
// 0) and the local sums of exp(l - m). backward needs no communication:
// d(loss)/dl_tv = (softmax_tv - [v == target_t]) / divisor, on local columns.
//
// A token whose target is ignore_index (-100, PyTorch's default) does not count: its loss and its
// gradient are 0. forward returns the sum of the counted tokens' losses divided by `divisor`,
// which defaults to the number of counted tokens (the mean). A trainer that splits a batch into
// microbatches and replicas passes the whole batch's count as the divisor, so that the sums
// over microbatches and replicas are the mean over the batch: a mean per microbatch, averaged,
// weighs tokens unequally when the microbatches count different numbers of tokens.
//
// Computed in T, at least float (so fp32 for float, fp64 for double), in a fixed order: the same
// loss at every TP size, including a vocabulary that does not divide by it (the uneven columns
// are split_range's, which the column-parallel layer producing the logits uses too).
//
// Exec says where the logits live (exec.hpp): the host by default; with a device policy (cublas
// on the communicator's stream) the logits, the kept softmax and dlogits are device memory, the
// row statistics a thread per row and lane (exec.hpp's row stages: the lanes combined in a fixed
// order, the host's sums), the rest one per element; the targets (a host span, checked there) are
// copied to the device, and the tokens' losses are added there (exec.hpp's sum_over: one block, in
// an order fixed by the token count, so to rounding the host's in-order sum), only the total
// coming back to the host.
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/layer/exec.hpp>
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

namespace detail {

// The row statistics in stages (exec.hpp, for_each_row_in_stages), token t, with
// lanes = a row_scratch's:
//   1. (t, l): lanes(t, l) = the largest of lane l's logits (lowest if it has none)
//   2. (t, 0): row_max(t, 0) = the largest of the lanes
//   (the all-reduce of the maxima over the group)
//   3. (t, l): probs(t, c) = exp(logit - maximum) on lane l's columns; lanes(t, l) = their sum
//   4. (t, 0): sums(0, t) = the target logit minus the maximum where this rank holds the target
//      (else 0); sums(1, t) = the sum of the lanes, in order
template <class T>
struct lane_exponentials {
  matrix_view<const T> logits;
  matrix_view<const T> row_max;
  matrix_view<T> probs;
  matrix_view<T> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t t, std::size_t l) const {
    const T top = row_max(t, 0);
    T s{};
    for (std::size_t c = l; c < logits.cols(); c += row_lanes) {
      const T e = std::exp(logits(t, c) - top);
      probs(t, c) = e;
      s += e;
    }
    lanes(t, l) = s;
  }
};

template <class T>
struct shifted_target_and_sum {
  matrix_view<const T> logits;
  const std::int32_t* targets;
  matrix_view<const T> row_max;
  matrix_view<const T> lanes;
  matrix_view<T> sums; // 2 x tokens
  std::size_t begin;
  WEFT_HOST_DEVICE void operator()(std::size_t t, std::size_t) const {
    const auto target =
        static_cast<std::size_t>(targets[t]); // an ignored target (< 0) wraps past every column
    sums(0, t) = target >= begin && target - begin < logits.cols()
                     ? logits(t, target - begin) - row_max(t, 0)
                     : T{};
    sums(1, t) = lane_total(lanes, t);
  }
};

/// Token t's loss in double, log(sum of exponentials) - (shifted target logit), from the reduced
/// sums (2 x tokens); 0 for an ignored token.
template <class T>
struct token_loss {
  matrix_view<const T> sums;
  const std::int32_t* targets;
  std::int32_t ignore_index;
  WEFT_HOST_DEVICE double operator()(std::size_t t) const {
    if (targets[t] == ignore_index) return 0.0;
    return static_cast<double>(std::log(sums(1, t)) - sums(0, t));
  }
};

template <class T>
struct normalise_row {
  matrix_view<T> probs;
  matrix_view<const T> sums;
  WEFT_HOST_DEVICE void operator()(std::size_t t, std::size_t c) const {
    probs(t, c) /= sums(1, t);
  }
};

/// d(loss)/d(logit) = (softmax - [column == target]) / divisor; 0 for an ignored token.
template <class T>
struct cross_entropy_gradient {
  matrix_view<const T> probs;
  const std::int32_t* targets;
  matrix_view<T> dlogits;
  std::size_t begin;
  T inv;
  std::int32_t ignore_index;
  WEFT_HOST_DEVICE void operator()(std::size_t t, std::size_t c) const {
    if (targets[t] == ignore_index) {
      dlogits(t, c) = T{};
      return;
    }
    const T onehot = begin + c == static_cast<std::size_t>(targets[t]) ? T{1} : T{0};
    dlogits(t, c) = (probs(t, c) - onehot) * inv;
  }
};

} // namespace detail

template <class T, communicator Comm, class Exec = host_policy>
class vocab_parallel_cross_entropy {
  static_assert(
      std::is_same_v<T, float> || std::is_same_v<T, double>,
      "weft: vocab_parallel_cross_entropy computes in float or double: use T = float or double");

public:
  using space = space_of<Exec>;

  /// PyTorch's default: a target of -100 does not count.
  static constexpr std::int32_t default_ignore_index = -100;

  vocab_parallel_cross_entropy(Comm& tp, std::size_t vocab, Exec exec = {},
                               std::int32_t ignore_index = default_ignore_index)
      : tp_(&tp),
        vocab_(vocab),
        range_(split_range(vocab, tp.size(), tp.rank())),
        exec_(std::move(exec)),
        ignore_index_(ignore_index) {
    if (vocab == 0) throw error("vocab_parallel_cross_entropy: vocab must be positive");
    if (ignore_index >= 0 && static_cast<std::size_t>(ignore_index) < vocab) {
      throw error("vocab_parallel_cross_entropy: ignore_index " + std::to_string(ignore_index) +
                  " is a token of the vocabulary [0, " + std::to_string(vocab) +
                  "): use a negative one");
    }
    detail::check_stream("vocab_parallel_cross_entropy", exec_, tp);
  }

  [[nodiscard]] range vocab_range() const noexcept { return range_; }
  [[nodiscard]] std::int32_t ignore_index() const noexcept { return ignore_index_; }

  /// The targets that count (not ignore_index).
  [[nodiscard]] static std::size_t counted(
      std::span<const std::int32_t> targets,
      std::int32_t ignore_index = default_ignore_index) noexcept {
    return static_cast<std::size_t>(std::count_if(
        targets.begin(), targets.end(), [&](std::int32_t t) { return t != ignore_index; }));
  }

  /// logits: tokens x vocab_range().size(); targets: tokens ids in [0, vocab) or ignore_index.
  /// Returns the counted tokens' summed loss over `divisor` (0: over their number, the mean; a
  /// batch with no counted token has loss 0), with a device policy once the stream has computed it.
  double forward(matrix_view<const T> logits, std::span<const std::int32_t> targets,
                 double divisor = 0) {
    static constexpr std::string_view who = "vocab_parallel_cross_entropy::forward";
    const std::size_t tokens = targets.size();
    if (tokens == 0) throw error(std::string(who) + ": no tokens");
    if (!(divisor >= 0))
      throw error(std::string(who) + ": divisor " + std::to_string(divisor) + " is negative");
    expect_shape(who, "logits", logits, tokens, range_.size());
    for (std::size_t t = 0; t < tokens; ++t) {
      if (targets[t] == ignore_index_) continue;
      if (targets[t] < 0 || static_cast<std::size_t>(targets[t]) >= vocab_) {
        throw error(std::string(who) + ": token " + std::to_string(t) + " has target " +
                    std::to_string(targets[t]) + ", outside the vocabulary [0, " +
                    std::to_string(vocab_) + ") and not the ignore_index " +
                    std::to_string(ignore_index_));
      }
    }
    const std::size_t count = counted(targets, ignore_index_);
    divisor_ = divisor > 0 ? divisor : static_cast<double>(std::max<std::size_t>(count, 1));
    targets_.assign(targets.begin(), targets.end());
    const std::int32_t* target_data = targets_.data();
    if constexpr (on_device<Exec>) {
      device_targets_.copy_from(matrix_view<const std::int32_t>(targets_.data(), 1, tokens),
                                exec_.stream());
      target_data = device_targets_.data();
    }
    const std::size_t cols = range_.size();
    // 1. The row maxima (the scratch's results, tokens x 1).
    scratch_.reserve(exec_, tokens, 1);
    const auto lanes = scratch_.lanes.view();
    const auto row_max = scratch_.results.view();
    using detail::row_lanes;
    using detail::row_stage;
    detail::for_each_row_in_stages(
        exec_, tokens,
        row_stage{row_lanes,
                  detail::lane_maxima<T>{logits, lanes, std::numeric_limits<T>::lowest()}},
        row_stage{1, detail::lane_maximum<T>{lanes, row_max}});
    if (tp_->size() > 1) all_reduce(*tp_, detail::flat_of(scratch_.results), op::max{});
    // 2. Target logits (shifted) and sums of exponentials, packed into one all-reduce.
    detail::resize(exec_, sums_, 2, tokens);
    detail::resize(exec_, probs_, tokens, cols);
    detail::for_each_row_in_stages(
        exec_, tokens,
        row_stage{row_lanes, detail::lane_exponentials<T>{logits, row_max, probs_.view(), lanes}},
        row_stage{1, detail::shifted_target_and_sum<T>{logits, target_data, row_max, lanes,
                                                       sums_.view(), range_.begin}});
    if (tp_->size() > 1) all_reduce(*tp_, detail::flat_of(sums_));
    detail::for_each_element(exec_, tokens, cols,
                             detail::normalise_row<T>{probs_.view(), sums_.view()});
    // 3. The counted tokens' losses, summed where the policy works.
    const double total = detail::sum_over(
        exec_, tokens, detail::token_loss<T>{sums_.view(), target_data, ignore_index_});
    return total / divisor_;
  }

  /// dlogits: tokens x vocab_range().size(), overwritten with d(loss)/d(logits) (0 on ignored
  /// tokens).
  void backward(matrix_view<T> dlogits) {
    static constexpr std::string_view who = "vocab_parallel_cross_entropy::backward";
    if (targets_.empty()) throw error(std::string(who) + ": called before forward");
    const std::size_t tokens = targets_.size();
    expect_shape(who, "dlogits", dlogits, tokens, range_.size());
    const auto inv = static_cast<T>(1.0 / divisor_);
    const std::int32_t* target_data = targets_.data();
    if constexpr (on_device<Exec>) target_data = device_targets_.data();
    detail::for_each_element(exec_, tokens, range_.size(),
                             detail::cross_entropy_gradient<T>{probs_.view(), target_data, dlogits,
                                                               range_.begin, inv, ignore_index_});
  }

private:
  Comm* tp_;
  std::size_t vocab_;
  range range_;
  Exec exec_;
  matrix<T, space> probs_; // the softmax on local columns, kept for backward
  matrix<T, space> sums_;  // 2 x tokens: shifted target logits, sums of exponentials
  weft::detail::tallied_vector<std::int32_t> targets_;
  matrix<std::int32_t, space> device_targets_; // a device policy's copy of targets_
  detail::row_scratch<T, space> scratch_;      // the row statistics' lanes; results: the row maxima
  std::int32_t ignore_index_;
  double divisor_ = 1;
};

} // namespace weft::layer
