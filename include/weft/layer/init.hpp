#pragma once
// Deterministic initialisation over the full (unsplit) shape, so that a model is the same model
// at every TP size: element (r, c) of a full rows x cols tensor is a function of (seed, tensor_id,
// r * cols + c) only, counter-based (splitmix64 hashing and Box-Muller), and a rank fills just its
// slice with the values the unsplit tensor has there.
//
//   auto [b, e] = weft::layer::split_range(out, tp.size(), tp.rank());   // this rank's rows
//   weft::layer::init_normal(w.view(), in, b, 0, seed, id, 0.02);         // w is (e - b) x in
//
// split_range is the balanced split every layer uses: the first n % parts parts get one more.
#include <weft/core/error.hpp>
#include <weft/layer/matrix.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <string>

namespace weft::layer {

struct range {
  std::size_t begin = 0;
  std::size_t end = 0;
  [[nodiscard]] constexpr std::size_t size() const noexcept { return end - begin; }
  friend constexpr bool operator==(const range&, const range&) = default;
};

/// Part `part` of n split over `parts` (the first n % parts parts get one more element).
[[nodiscard]] constexpr range split_range(std::size_t n, int parts, int part) {
  if (parts <= 0 || part < 0 || part >= parts) {
    throw error("split_range: part " + std::to_string(part) + " of " + std::to_string(parts) +
                " parts");
  }
  const auto p = static_cast<std::size_t>(parts);
  const auto i = static_cast<std::size_t>(part);
  const std::size_t base = n / p;
  const std::size_t extra = n % p;
  const std::size_t begin = i * base + (i < extra ? i : extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

static_assert(split_range(10, 3, 0) == range{0, 4});
static_assert(split_range(10, 3, 1) == range{4, 7});
static_assert(split_range(10, 3, 2) == range{7, 10});
static_assert(split_range(2, 4, 3) == range{2, 2});

namespace detail {

constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A uniform in (0, 1], from the top 53 bits.
constexpr double unit_open0(std::uint64_t h) noexcept {
  return (static_cast<double>(h >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

} // namespace detail

/// The standard normal sample at `index` of the stream (seed, tensor_id).
[[nodiscard]] inline double normal_at(std::uint64_t seed, std::uint64_t tensor_id,
                                      std::uint64_t index) noexcept {
  const std::uint64_t key =
      detail::splitmix64(seed ^ detail::splitmix64(tensor_id ^ 0x5EEDC0DE12345678ull));
  const double u1 = detail::unit_open0(detail::splitmix64(key ^ (2 * index)));
  const double u2 = detail::unit_open0(detail::splitmix64(key ^ (2 * index + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

/// Fills `local`, the block at (row0, col0) of a full tensor with full_cols columns, with that
/// tensor's N(0, stddev^2) values.
template <class T>
void init_normal(matrix_view<T> local, std::size_t full_cols, std::size_t row0, std::size_t col0,
                 std::uint64_t seed, std::uint64_t tensor_id, double stddev) {
  if (col0 + local.cols() > full_cols) {
    throw error("init_normal: columns [" + std::to_string(col0) + ", " +
                std::to_string(col0 + local.cols()) + ") outside a tensor of " +
                std::to_string(full_cols) + " columns");
  }
  for (std::size_t r = 0; r < local.rows(); ++r) {
    for (std::size_t c = 0; c < local.cols(); ++c) {
      const std::uint64_t index = (row0 + r) * full_cols + (col0 + c);
      local(r, c) = static_cast<T>(stddev * normal_at(seed, tensor_id, index));
    }
  }
}

} // namespace weft::layer
