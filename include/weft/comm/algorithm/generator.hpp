#pragma once
// What an algorithm policy is: an empty tag with a name, its capabilities (the collectives it
// plans and what it needs: capabilities.hpp), and a plan generator. Generators are plain
// functions of the request, not templates over the element type, so one compiled generator
// serves every type.
#include <weft/comm/algorithm/capabilities.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/config.hpp>

#include <concepts>
#include <cstddef>
#include <numeric>
#include <string_view>

namespace weft::algo {

template <class A>
concept plan_generator = requires(const plan_request& r) {
  { A::name } -> std::convertible_to<std::string_view>;
  { A::serves(collective::all_reduce) } -> std::same_as<bool>;
  { A::make_plan(r) } -> std::same_as<plan>;
};

/// Whether algorithm A can plan collective C (usable in static_assert).
template <class A, collective C>
inline constexpr bool serves_v = A::serves(C);

} // namespace weft::algo

namespace weft::detail {

inline void check_request(const plan_request& r, std::string_view algorithm) {
  if (r.size < 1 || r.rank < 0 || r.rank >= r.size) {
    throw error(name_of(r.coll), r.rank, error::unknown,
                std::string(algorithm) + ": rank " + std::to_string(r.rank) +
                    " outside a group of " + std::to_string(r.size));
  }
  if (r.root < 0 || r.root >= r.size) {
    throw error(name_of(r.coll), r.rank, error::unknown,
                std::string(algorithm) + ": root " + std::to_string(r.root) +
                    " outside a group of " + std::to_string(r.size));
  }
}

/// Element range [begin, end) of block b when n elements are split into k near-equal blocks
/// (the first n % k blocks get one more).
struct block_range {
  std::size_t begin;
  std::size_t count;
};
constexpr block_range split_block(std::size_t n, std::size_t k, std::size_t b) {
  const std::size_t base = n / k;
  const std::size_t extra = n % k;
  const std::size_t begin = b * base + (b < extra ? b : extra);
  return {begin, base + (b < extra ? 1 : 0)};
}
static_assert(split_block(10, 4, 0).begin == 0 && split_block(10, 4, 0).count == 3);
static_assert(split_block(10, 4, 1).begin == 3 && split_block(10, 4, 1).count == 3);
static_assert(split_block(10, 4, 2).begin == 6 && split_block(10, 4, 2).count == 2);
static_assert(split_block(10, 4, 3).begin == 8 && split_block(10, 4, 3).count == 2);
static_assert(split_block(2, 4, 3).begin == 2 && split_block(2, 4, 3).count == 0);

/// The first scratch offset at or after `at` that lies `like` elements of element_size bytes
/// past a 16-byte boundary, mod 16 bytes: a block kept there and a block at offset `like` of a
/// buffer that starts on such a boundary reduce in 16-byte packs on a device (its kernels'
/// packs, comm/detail/elementwise.hpp). At most 15 elements past `at`.
constexpr std::size_t scratch_offset_like(std::size_t at, std::size_t like,
                                          std::size_t element_size) noexcept {
  const std::size_t q = 16 / std::gcd(std::size_t{16}, element_size == 0 ? 1 : element_size);
  return at + (q + like % q - at % q) % q;
}
static_assert(scratch_offset_like(0, 19, 1) == 3 && scratch_offset_like(5, 5, 4) == 5);
static_assert(scratch_offset_like(37, 0, 1) == 48 && scratch_offset_like(7, 3, 8) == 7);

} // namespace weft::detail
