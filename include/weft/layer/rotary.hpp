#pragma once
// Rotary position embedding (RoPE), in the "rotate_half" convention of Hugging Face's Llama: a head
// vector x of even length d at position pos has its halves paired, element i with element
// i + d/2, and each pair turned by the angle pos * theta^(-2i/d):
//
//   for i < d/2:   x_i       <-  x_i cos - x_{i+d/2} sin
//                  x_{i+d/2} <-  x_{i+d/2} cos + x_i sin
//
// Backward turns the gradient the other way (the transpose of a rotation is its inverse).
//
// The cosines and sines come from a table of seq x d (columns [0, d/2): cos, [d/2, d): sin),
// computed once on the host in double and rounded to T: a device kernel then reads the same
// values the host does (its own cos/sin of a float angle would differ from the host's in the last
// bits, and double cos/sin on a device is slow), and the per-element work is four multiplies.
//
//   auto table = weft::layer::rotary_table<float>(seq, d, 10000.0);           // host, seq x d
//   detail::rotate_heads(exec, qk, table_view, {.first = 0, .heads = n, .stride = d},
//   rotation::forward);
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/matrix.hpp>

#include <cmath>
#include <cstddef>
#include <string>

namespace weft::layer {

enum class rotation : bool { forward, inverse };

/// The table of cos (columns [0, d/2)) and sin (columns [d/2, d)) of pos * theta^(-2i/d), for
/// positions 0 .. seq - 1; head_dim must be even, theta positive.
template <class T>
[[nodiscard]] matrix<T> rotary_table(std::size_t seq, std::size_t head_dim, double theta) {
  if (head_dim % 2 != 0) {
    throw error(
        "rotary_table: rotary position embedding pairs the halves of a head, and head dimension " +
        std::to_string(head_dim) + " is odd");
  }
  if (!(theta > 0.0))
    throw error("rotary_table: theta " + std::to_string(theta) + " is not positive");
  const std::size_t half = head_dim / 2;
  matrix<T> t(seq, head_dim);
  for (std::size_t i = 0; i < half; ++i) {
    const double frequency =
        std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    for (std::size_t pos = 0; pos < seq; ++pos) {
      const double angle = static_cast<double>(pos) * frequency;
      t(pos, i) = static_cast<T>(std::cos(angle));
      t(pos, half + i) = static_cast<T>(std::sin(angle));
    }
  }
  return t;
}

/// Where the heads to rotate sit in a tokens x columns matrix: head k's d columns start at
/// first + k * stride.
struct head_columns {
  std::size_t first = 0;
  std::size_t heads = 0;
  std::size_t stride = 0;
};

namespace detail {

/// One pair (row r, p = head * d/2 + i) turned by its angle, or back: writes only its own two
/// elements, so any order of (r, p) gives the same result. Row r is position r % seq.
template <class T>
struct rotate_pair {
  matrix_view<T> x;
  matrix_view<const T> table; // seq x d: cos | sin
  head_columns at;
  bool inverse = false;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t p) const {
    const std::size_t half = table.cols() / 2;
    const std::size_t c = at.first + p / half * at.stride + p % half;
    const std::size_t pos = r % table.rows();
    const T cs = table(pos, p % half);
    const T sn = inverse ? -table(pos, half + p % half) : table(pos, half + p % half);
    const T a = x(r, c);
    const T b = x(r, c + half);
    x(r, c) = a * cs - b * sn;
    x(r, c + half) = b * cs + a * sn;
  }
};

/// Rotates the heads `at` of every row of x in place (rotation::inverse: the transpose, for the
/// gradient), where the policy works; table as rotary_table's, in the policy's memory.
template <class Exec, class T>
void rotate_heads(const Exec& exec, matrix_view<T> x, matrix_view<const T> table, head_columns at,
                  rotation dir) {
  for_each_element(exec, x.rows(), at.heads * (table.cols() / 2),
                   rotate_pair<T>{x, table, at, dir == rotation::inverse});
}

} // namespace detail

} // namespace weft::layer
