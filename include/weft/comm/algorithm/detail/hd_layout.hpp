#pragma once
// Index math of halving_doubling: the fold of p ranks onto a power of two, and where the
// share of each virtual rank starts in the vector. Plain constexpr, checked below.
#include <weft/comm/algorithm/generator.hpp>

#include <cstddef>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::detail {

/// Largest power of two <= p (p >= 1).
constexpr int hd_floor_pow2(int p) noexcept {
  int q = 1;
  while (q <= p / 2)
    q *= 2;
  return q;
}

/// p ranks folded onto pow2 virtual ranks. The first 2*rem ranks pair up (2i, 2i+1); 2i hands
/// its data to 2i+1 and waits, 2i+1 stands for both as virtual rank i. Rank r >= 2*rem is
/// virtual rank r - rem. Virtual ranks are thus in rank order, and virtual rank v stands for
/// the contiguous ranks [first_rank(v), first_rank(v + 1)).
struct hd_fold {
  int size;
  int pow2;
  int rem;

  constexpr explicit hd_fold(int p) noexcept
      : size(p), pow2(hd_floor_pow2(p)), rem(p - hd_floor_pow2(p)) {}

  [[nodiscard]] constexpr bool folded_out(int r) const noexcept {
    return r < 2 * rem && r % 2 == 0;
  }
  [[nodiscard]] constexpr bool absorbs(int r) const noexcept { return r < 2 * rem && r % 2 == 1; }
  /// Virtual rank of a rank that is not folded out.
  [[nodiscard]] constexpr int virtual_rank(int r) const noexcept {
    return r < 2 * rem ? r / 2 : r - rem;
  }
  /// The rank that plays virtual rank v.
  [[nodiscard]] constexpr int real_rank(int v) const noexcept {
    return v < rem ? 2 * v + 1 : v + rem;
  }
  /// The first rank virtual rank v stands for; first_rank(pow2) == size.
  [[nodiscard]] constexpr int first_rank(int v) const noexcept { return v < rem ? 2 * v : v + rem; }
};

static_assert(hd_floor_pow2(1) == 1 && hd_floor_pow2(2) == 2 && hd_floor_pow2(3) == 2);
static_assert(hd_floor_pow2(7) == 4 && hd_floor_pow2(8) == 8 && hd_floor_pow2(9) == 8);
// p = 6: pairs (0,1) and (2,3); virtual ranks 0..3 are ranks 1, 3, 4, 5.
static_assert(hd_fold(6).pow2 == 4 && hd_fold(6).rem == 2);
static_assert(hd_fold(6).real_rank(0) == 1 && hd_fold(6).real_rank(1) == 3 &&
              hd_fold(6).real_rank(2) == 4 && hd_fold(6).real_rank(3) == 5);
static_assert(hd_fold(6).virtual_rank(3) == 1 && hd_fold(6).virtual_rank(4) == 2);
static_assert(hd_fold(6).first_rank(1) == 2 && hd_fold(6).first_rank(2) == 4 &&
              hd_fold(6).first_rank(4) == 6);
static_assert(hd_fold(6).folded_out(2) && hd_fold(6).absorbs(3) && !hd_fold(6).folded_out(4) &&
              !hd_fold(6).absorbs(5));

/// Where the share of virtual rank v starts, in elements; v == pow2 gives the end.
/// all_reduce splits the vector into pow2 near-equal shares (per_rank false); reduce_scatter
/// and all_gather give virtual rank v the blocks of `count` of the ranks it stands for, so each
/// rank's own block r is where the collective wants it (per_rank true).
struct hd_layout {
  hd_fold fold;
  std::size_t count;
  bool per_rank;

  [[nodiscard]] constexpr std::size_t offset(int v) const noexcept {
    if (per_rank) return static_cast<std::size_t>(fold.first_rank(v)) * count;
    return split_block(count, static_cast<std::size_t>(fold.pow2), static_cast<std::size_t>(v))
        .begin;
  }
  [[nodiscard]] constexpr block_range range(int v_begin, int v_end) const noexcept {
    return {offset(v_begin), offset(v_end) - offset(v_begin)};
  }
};

static_assert(hd_layout{hd_fold(4), 10, false}.offset(2) == 6 &&
              hd_layout{hd_fold(4), 10, false}.offset(4) == 10);
static_assert(hd_layout{hd_fold(6), 5, true}.range(0, 2).begin == 0 &&
              hd_layout{hd_fold(6), 5, true}.range(0, 2).count == 20);
static_assert(hd_layout{hd_fold(6), 5, true}.range(2, 3).begin == 20 &&
              hd_layout{hd_fold(6), 5, true}.range(2, 3).count == 5);

} // namespace weft::detail

#include <weft/core/detail/planning_end.hpp>
