#pragma once
// What an algorithm policy is: an empty tag with a name, its capabilities (the collectives it
// plans and what it needs: capabilities.hpp), and a plan generator. Generators are plain
// functions of the request, not templates over the element type, so one compiled generator
// serves every type.
#include <weft/comm/algorithm/capabilities.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/config.hpp>

#include <concepts>
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

} // namespace weft::detail
