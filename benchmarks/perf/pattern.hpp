#pragma once
// What -c 1 fills and expects. Inputs are small integers chosen so that every partial result
// any algorithm can form is exact in every element type, whatever the reduction order (as
// nccl-tests does): then the expected output is a plain loop in double, independent of
// weft's kernels, and a result either matches exactly or is wrong.
//
//   sum       v in [-m, m], m chosen so that p * m fits the type's exact integers
//             (bfloat16: 256, half: 2048)
//   avg       f(k) + d(r, k), f in [-m, m], d +1 on rank k mod p, -1 on rank k+1 mod p and 0
//             elsewhere: d sums to zero, so the sum is p * f(k) and the average f(k) is exact
//             for floats and for integer division alike, and every input and partial sum stays
//             within p * m + 1 whatever p (an offset that grew with p, such as p - 1 on one
//             rank, is itself inexact in bfloat16 from p = 258 on); except half on the host,
//             which scales each input by 1/p before summing (op::avg, as ncclAvg): with p not a
//             power of two those terms round, and the result is checked to within the rounding
//             of p terms and p - 1 partial sums (tolerance())
//   prod      v in {-1, 1}
//   min, max  v in [-8, 8]
//   data      v in [-125, 125] for the ops that only move data, different on every rank
#include <weft/core/half.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>

#include "options.hpp"

namespace weft::perf {

/// The pattern of one table: what it fills inputs with, for which op and group size.
class pattern {
public:
  pattern(collective c, redop op, dtype t, int ranks)
      : op_(reduces(c) ? op : redop::none), p_(ranks), type_(t) {
    // Largest integer magnitude every partial result must stay within to be exact.
    std::int64_t exact = std::int64_t{1} << 24;
    if (t == dtype::float16) exact = 2048;
    if (t == dtype::bfloat16) exact = 256;
    if (op_ == redop::sum) m_ = std::clamp<std::int64_t>(exact / p_, 1, 4);
    if (op_ == redop::avg)
      m_ = std::clamp<std::int64_t>((exact - 1) / p_, 0, 4); // p * m + 1 <= exact
  }

  /// Element k of rank r's input buffer.
  [[nodiscard]] std::int64_t input(int r, std::size_t k) const noexcept {
    const auto ur = static_cast<std::uint64_t>(r);
    const std::uint64_t mix = static_cast<std::uint64_t>(k) * 7 + ur * 13;
    switch (op_) {
      case redop::sum:
        return static_cast<std::int64_t>(mix % static_cast<std::uint64_t>(2 * m_ + 1)) - m_;
      case redop::avg: {
        const std::int64_t f = static_cast<std::int64_t>((static_cast<std::uint64_t>(k) * 7) %
                                                         static_cast<std::uint64_t>(2 * m_ + 1)) -
                               m_;
        const auto up = static_cast<std::size_t>(p_);
        const std::size_t ru = static_cast<std::size_t>(r);
        // +1 and -1 on two ranks (the same one when p = 1): a zero sum whatever p.
        return f + (k % up == ru ? 1 : 0) - ((k + 1) % up == ru ? 1 : 0);
      }
      case redop::prod: return (k + 2 * ur) % 3 == 0 ? -1 : 1;
      case redop::min:
      case redop::max: return static_cast<std::int64_t>(mix % 17) - 8;
      case redop::none: return static_cast<std::int64_t>(mix % 251) - 125;
    }
    return 0;
  }

  /// How far an output may be from reduced(): 0 (exact) but for half averages over a number of
  /// ranks that is not a power of two, where each of p scaled terms and p - 1 partial sums of
  /// magnitude at most m + 1 rounds by at most half an ulp (2^-11 relative); twice that, as margin.
  [[nodiscard]] double tolerance() const noexcept {
    const bool power_of_two = (p_ & (p_ - 1)) == 0;
    if (op_ != redop::avg || type_ != dtype::float16 || power_of_two) return 0.0;
    return 2.0 * p_ * static_cast<double>(m_ + 1) / 2048.0;
  }

  /// The reduction over all ranks of element k of their inputs, computed in double.
  [[nodiscard]] double reduced(std::size_t k) const noexcept {
    double acc = static_cast<double>(input(0, k));
    for (int r = 1; r < p_; ++r) {
      const auto v = static_cast<double>(input(r, k));
      switch (op_) {
        case redop::sum:
        case redop::avg: acc += v; break;
        case redop::prod: acc *= v; break;
        case redop::min: acc = std::min(acc, v); break;
        case redop::max: acc = std::max(acc, v); break;
        case redop::none: break;
      }
    }
    // The sum is a multiple of p by construction, so this is exact for integers too.
    if (op_ == redop::avg) acc /= static_cast<double>(p_);
    return acc;
  }

private:
  redop op_;
  int p_;
  dtype type_;
  std::int64_t m_ = 0;
};

template <class T>
T to_element(std::int64_t v) {
  return static_cast<T>(v);
}

/// An output value no correct result can equal: NaN, or an integer far outside the patterns.
template <class T>
T poison() {
  if constexpr (std::is_integral_v<T>) {
    return std::numeric_limits<T>::min();
  } else {
    return static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  }
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

/// Fills rank r's input elements [0, n) from the pattern.
template <class T>
void fill_input(const pattern& pat, int r, std::span<T> in) {
  for (std::size_t k = 0; k < in.size(); ++k)
    in[k] = to_element<T>(pat.input(r, k));
}

template <class T>
void fill_poison(std::span<T> out) {
  std::fill(out.begin(), out.end(), poison<T>());
}

/// Counts the elements of `got` further than `tolerance` from expected(i); NaN is always wrong.
template <class T, class Expected>
std::int64_t count_wrong(std::span<const T> got, Expected&& expected, double tolerance = 0.0) {
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(to_double(got[i]) - expected(i)) <= tolerance)) ++wrong;
  }
  return wrong;
}

} // namespace weft::perf
