#pragma once
// parallel_attention's causal softmax (weft/layer/attention.hpp): forward and its gradient, row
// by row in lanes, on the layer's execution policy.
#include <weft/layer/exec.hpp>
#include <weft/layer/matrix.hpp>

#include <cmath>
#include <cstddef>
#include <limits>

namespace weft::layer::detail {

// The causal softmax of the scores s, in place: s is a stack of seq x seq blocks (exec.hpp,
// causal_last), row i's causal part is j <= last = causal_last(i, seq) and the rest is masked to 0.
// In stages (exec.hpp, for_each_row_in_stages) with a row_scratch of one way and two results:
//   1. (i, l): lanes(i, l) = the largest s(i, j) of lane l's causal columns (lowest if it has none)
//   2. (i, 0): top(i) = the largest of the lanes
//   3. (i, l): s(i, j) = exp(s(i, j) - top) on lane l's causal columns; lanes(i, l) = their sum
//   4. (i, 0): inv(i) = 1 / the sum of the lanes, in order
//   5. (i, j): s(i, j) *= inv on the causal part, 0 above it
template <class T>
struct causal_lane_exponentials {
  matrix_view<T> s;
  matrix_view<const T> stats;
  matrix_view<T> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t l) const {
    const T top = stats(i, 0);
    T sum{};
    const std::size_t last = causal_last(i, s.cols());
    for (std::size_t j = l; j <= last; j += row_lanes) {
      s(i, j) = std::exp(s(i, j) - top);
      sum += s(i, j);
    }
    lanes(i, l) = sum;
  }
};

/// stats(i, 1) = 1 / the sum of the lanes, in order.
template <class T>
struct inverse_lane_sum {
  matrix_view<const T> lanes;
  matrix_view<T> stats;
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t) const {
    stats(i, 1) = T{1} / lane_total(lanes, i);
  }
};

template <class T>
struct causal_normalise {
  matrix_view<T> s;
  matrix_view<const T> stats; // (i, 1): inv
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t j) const {
    s(i, j) = j <= causal_last(i, s.cols()) ? s(i, j) * stats(i, 1) : T{};
  }
};

/// Row-wise causal softmax in place, where the policy works.
template <class Exec, class T, class Space>
void causal_softmax(const Exec& exec, matrix_view<T> s, row_scratch<T, Space>& scratch) {
  scratch.reserve(exec, s.rows(), 1, 2); // one sum at a time; results: max, inverse sum
  const auto lanes = scratch.lanes.view();
  const auto stats = scratch.results.view();
  for_each_row_in_stages(
      exec, s.rows(),
      row_stage{row_lanes, lane_maxima<T>{s, lanes, std::numeric_limits<T>::lowest(), true}},
      row_stage{1, lane_maximum<T>{lanes, stats}},
      row_stage{row_lanes, causal_lane_exponentials<T>{s, stats, lanes}},
      row_stage{1, inverse_lane_sum<T>{lanes, stats}},
      row_stage{s.cols(), causal_normalise<T>{s, stats}});
}

// The softmax's backward, in place: dp(i, j) = p(i, j) (dp(i, j) - dot(i)) on the causal part, 0
// above it, with dot(i) = sum_j p(i, j) dp(i, j): 1. (i, l): lanes(i, l) = lane l's part of the
// dot; 2. (i, 0): dot(i), the lanes in order; 3. (i, j): dp.
template <class T>
struct causal_lane_dots {
  matrix_view<const T> p;
  matrix_view<const T> dp;
  matrix_view<T> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t l) const {
    T dot{};
    const std::size_t last = causal_last(i, p.cols());
    for (std::size_t j = l; j <= last; j += row_lanes)
      dot += p(i, j) * dp(i, j);
    lanes(i, l) = dot;
  }
};

template <class T>
struct causal_softmax_gradient {
  matrix_view<const T> p;
  matrix_view<T> dp;
  matrix_view<const T> stats; // (i, 0): dot
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t j) const {
    dp(i, j) = j <= causal_last(i, p.cols()) ? p(i, j) * (dp(i, j) - stats(i, 0)) : T{};
  }
};

template <class Exec, class T, class Space>
void causal_softmax_backward(const Exec& exec, matrix_view<const T> p, matrix_view<T> dp,
                             row_scratch<T, Space>& scratch) {
  scratch.reserve(exec, p.rows(), 1, 2); // the forward's shape
  const auto lanes = scratch.lanes.view();
  const auto stats = scratch.results.view();
  for_each_row_in_stages(exec, p.rows(), row_stage{row_lanes, causal_lane_dots<T>{p, dp, lanes}},
                         row_stage{1, lane_sum<T>{lanes, stats}},
                         row_stage{dp.cols(), causal_softmax_gradient<T>{p, dp, stats}});
}

} // namespace weft::layer::detail
