#pragma once
// weft::mesh<Axes...>: the device mesh, fixed at compile time. Ranks are laid out with the first
// axis varying fastest, so mesh<tp<2>, pp<2>, dp<2>> numbers its 8 ranks
//
//   rank  0  1  2  3  4  5  6  7
//   tp    0  1  0  1  0  1  0  1      stride 1
//   pp    0  0  1  1  0  0  1  1      stride 2
//   dp    0  0  0  0  1  1  1  1      stride 4
//
// and a group of axis A is the set of ranks that agree on every coordinate but A's. Putting tp
// first keeps each tensor-parallel group on consecutive ranks, which launchers place on one node.
//
// The index math lives once, in the constexpr weft::mesh_layout; the static mesh is a thin
// compile-time face over it, and a mesh with a weft::dynamic axis turns into a mesh_layout at run
// time through resolve(world_size).
#include <weft/core/error.hpp>

#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft {

// An axis extent fixed at run time: the world size divided by the product of the other extents.
inline constexpr int dynamic = 0;

// Tensor, pipeline, data, context and expert parallelism.
enum class axis : std::uint8_t { tp, pp, dp, cp, ep };

inline constexpr int axis_kind_count = 5;

inline constexpr std::array<axis, axis_kind_count> all_axes{axis::tp, axis::pp, axis::dp, axis::cp,
                                                            axis::ep};

[[nodiscard]] constexpr std::string_view axis_name(axis a) noexcept {
  switch (a) {
    case axis::tp: return "tp";
    case axis::pp: return "pp";
    case axis::dp: return "dp";
    case axis::cp: return "cp";
    case axis::ep: return "ep";
  }
  return "?";
}

namespace detail {
// What every axis tag says about itself: its kind, its extent and its name.
template <axis A, int N>
struct axis_tag {
  static constexpr weft::axis kind = A;
  static constexpr int extent = N;
  static constexpr std::string_view name = axis_name(A);
};
} // namespace detail

template <int N>
struct tp : detail::axis_tag<axis::tp, N> {};
template <int N>
struct pp : detail::axis_tag<axis::pp, N> {};
template <int N>
struct dp : detail::axis_tag<axis::dp, N> {};
template <int N>
struct cp : detail::axis_tag<axis::cp, N> {};
template <int N>
struct ep : detail::axis_tag<axis::ep, N> {};

// One coordinate type for every mesh, so `mesh::coord{.tp = 1, .dp = 1}` reads the same whatever
// the axis order; an axis absent from a mesh has coordinate 0.
struct mesh_coord {
  int tp = 0;
  int pp = 0;
  int dp = 0;
  int cp = 0;
  int ep = 0;

  [[nodiscard]] constexpr int operator[](axis a) const noexcept {
    switch (a) {
      case axis::tp: return tp;
      case axis::pp: return pp;
      case axis::dp: return dp;
      case axis::cp: return cp;
      case axis::ep: return ep;
    }
    return 0;
  }

  [[nodiscard]] constexpr int& operator[](axis a) noexcept {
    switch (a) {
      case axis::pp: return pp;
      case axis::dp: return dp;
      case axis::cp: return cp;
      case axis::ep: return ep;
      case axis::tp: break;
    }
    return tp;
  }

  friend constexpr bool operator==(const mesh_coord&, const mesh_coord&) = default;
};

// One axis of a layout, in mesh order. An extent of weft::dynamic is accepted only by
// mesh_layout::resolve.
struct axis_extent {
  axis kind = axis::tp;
  int extent = 1;

  friend constexpr bool operator==(const axis_extent&, const axis_extent&) = default;
};

namespace detail {

[[nodiscard]] constexpr std::size_t axis_slot(axis a) noexcept {
  return static_cast<std::size_t>(a);
}

inline std::string spec_name(std::span<const axis_extent> spec) {
  std::string s;
  for (const axis_extent& ax : spec) {
    if (!s.empty()) {
      s += " x ";
    }
    s += axis_name(ax.kind);
    s += ax.extent == dynamic ? std::string("(dynamic)") : std::to_string(ax.extent);
  }
  return s;
}

// Throwing lives in these non-constexpr functions: reached during constant evaluation, the call
// itself makes the expression non-constant, so misuse in a static_assert is a compile error.
[[noreturn]] inline void mesh_fail(std::span<const axis_extent> spec, const std::string& what) {
  throw error("weft: mesh " + (spec.empty() ? std::string("(no axes)") : spec_name(spec)) + ": " +
              what);
}

} // namespace detail

// A mesh resolved to concrete extents: rank <-> coordinates and the ranks of each group, all
// constexpr. Built by mesh<...>::resolve or directly from a list of axes.
class mesh_layout {
public:
  // The single-rank mesh with no axes.
  constexpr mesh_layout() = default;

  constexpr mesh_layout(std::initializer_list<axis_extent> axes)
      : mesh_layout(std::span<const axis_extent>(axes.begin(), axes.size())) {}

  constexpr explicit mesh_layout(std::span<const axis_extent> axes) {
    if (axes.size() > static_cast<std::size_t>(axis_kind_count)) {
      detail::mesh_fail(axes, "a mesh has at most one axis of each of the 5 kinds");
    }
    long long size = 1;
    for (const axis_extent& ax : axes) {
      if (ax.extent < 1) {
        detail::mesh_fail(axes,
                          "every extent must be at least 1 (a weft::dynamic extent must go "
                          "through mesh_layout::resolve)");
      }
      for (std::size_t i = 0; i < count_; ++i) {
        if (axes_[i].kind == ax.kind) {
          detail::mesh_fail(axes, "axis " + std::string(axis_name(ax.kind)) + " appears twice");
        }
      }
      size *= ax.extent;
      if (size > INT_MAX) {
        detail::mesh_fail(axes, "more ranks than an int can number");
      }
      axes_[count_++] = ax;
    }
    size_ = static_cast<int>(size);
    for (std::size_t k = 0; k < static_cast<std::size_t>(axis_kind_count); ++k) {
      extent_[k] = 1;
      // An absent axis gets stride size_: the formulas below then give every rank a group of its
      // own.
      stride_[k] = size_;
    }
    int stride = 1;
    for (std::size_t i = 0; i < count_; ++i) {
      extent_[detail::axis_slot(axes_[i].kind)] = axes_[i].extent;
      stride_[detail::axis_slot(axes_[i].kind)] = stride;
      stride *= axes_[i].extent;
    }
  }

  // Replaces the one weft::dynamic extent in `spec` (if any) by world_size over the product of the
  // others, and checks that the result has exactly world_size ranks.
  [[nodiscard]] static constexpr mesh_layout resolve(std::span<const axis_extent> spec,
                                                     int world_size) {
    if (world_size < 1) {
      detail::mesh_fail(spec, "world size " + std::to_string(world_size) + " is not positive");
    }
    std::array<axis_extent, axis_kind_count> axes{};
    if (spec.size() > axes.size()) {
      detail::mesh_fail(spec, "a mesh has at most one axis of each of the 5 kinds");
    }
    long long fixed = 1;
    int dynamic_at = -1;
    for (std::size_t i = 0; i < spec.size(); ++i) {
      axes[i] = spec[i];
      if (spec[i].extent == dynamic) {
        if (dynamic_at >= 0) {
          detail::mesh_fail(spec, "at most one axis may be weft::dynamic");
        }
        dynamic_at = static_cast<int>(i);
      } else if (spec[i].extent < 0) {
        detail::mesh_fail(spec, "extents must not be negative");
      } else {
        fixed *= spec[i].extent;
        if (fixed > INT_MAX) {
          detail::mesh_fail(spec, "more ranks than an int can number");
        }
      }
    }
    if (dynamic_at >= 0) {
      if (world_size % fixed != 0) {
        detail::mesh_fail(spec, "world size " + std::to_string(world_size) +
                                    " is not divisible by the product of the static extents (" +
                                    std::to_string(fixed) +
                                    "), so the dynamic axis has no whole extent");
      }
      axes[static_cast<std::size_t>(dynamic_at)].extent = static_cast<int>(world_size / fixed);
    } else if (fixed != world_size) {
      detail::mesh_fail(spec, "the mesh has " + std::to_string(fixed) +
                                  " ranks but the world has " + std::to_string(world_size));
    }
    return mesh_layout(std::span<const axis_extent>(axes.data(), spec.size()));
  }

  [[nodiscard]] constexpr int size() const noexcept { return size_; }

  [[nodiscard]] constexpr std::size_t axis_count() const noexcept { return count_; }

  // The axes in mesh order, fastest varying first.
  [[nodiscard]] constexpr std::span<const axis_extent> axes() const noexcept {
    return {axes_.data(), count_};
  }

  [[nodiscard]] constexpr bool contains(axis a) const noexcept {
    for (std::size_t i = 0; i < count_; ++i) {
      if (axes_[i].kind == a) {
        return true;
      }
    }
    return false;
  }

  // 1 for an axis absent from the mesh.
  [[nodiscard]] constexpr int extent(axis a) const noexcept {
    return extent_[detail::axis_slot(a)];
  }

  // Distance in ranks between neighbours along `a`; size() for an absent axis.
  [[nodiscard]] constexpr int stride(axis a) const noexcept {
    return stride_[detail::axis_slot(a)];
  }

  // How many groups axis `a` splits the mesh into.
  [[nodiscard]] constexpr int group_count(axis a) const noexcept { return size_ / extent(a); }

  [[nodiscard]] constexpr mesh_coord coords(int rank) const {
    check_rank(rank);
    mesh_coord c;
    for (std::size_t i = 0; i < count_; ++i) {
      c[axes_[i].kind] = rank % axes_[i].extent;
      rank /= axes_[i].extent;
    }
    return c;
  }

  [[nodiscard]] constexpr int rank(const mesh_coord& c) const {
    int r = 0;
    for (axis a : all_axes) {
      if (c[a] < 0 || c[a] >= extent(a)) {
        fail_coord(c, a);
      }
      r += c[a] * stride(a);
    }
    return r;
  }

  // The member at position `index` (= its coordinate along `a`) of the group of `a` holding `rank`.
  [[nodiscard]] constexpr int group_member(axis a, int rank, int index) const {
    check_rank(rank);
    if (index < 0 || index >= extent(a)) {
      detail::mesh_fail(axes(), "index " + std::to_string(index) + " is outside the " +
                                    std::string(axis_name(a)) + " group of " +
                                    std::to_string(extent(a)) + " ranks");
    }
    return group_base(a, rank) + index * stride(a);
  }

  // The ranks that share every coordinate with `rank` except a's, in order of a's coordinate.
  [[nodiscard]] constexpr std::vector<int> group(axis a, int rank) const {
    check_rank(rank);
    // reserve + push_back rather than vector(n): clang 14 rejects libstdc++'s value-initializing
    // constructor in constant evaluation.
    std::vector<int> ranks;
    ranks.reserve(static_cast<std::size_t>(extent(a)));
    for (int i = 0; i < extent(a); ++i) {
      ranks.push_back(group_base(a, rank) + i * stride(a));
    }
    return ranks;
  }

  // Which group of axis `a` holds `rank`, 0..group_count(a)-1, groups numbered in the rank order of
  // their first members (the order Megatron-LM lists its groups in).
  [[nodiscard]] constexpr int group_index(axis a, int rank) const {
    check_rank(rank);
    // First members are the ranks whose a-coordinate is 0: rank = low + high * stride * extent with
    // low < stride, so counting them in rank order gives high * stride + low.
    const int base = group_base(a, rank);
    const int low = base % stride(a);
    const int high = base / (stride(a) * extent(a));
    return high * stride(a) + low;
  }

  // "tp2 x pp4 x dp2", in mesh order.
  [[nodiscard]] std::string name() const { return detail::spec_name(axes()); }

  friend constexpr bool operator==(const mesh_layout&, const mesh_layout&) = default;

private:
  [[nodiscard]] constexpr int group_base(axis a, int rank) const noexcept {
    return rank - ((rank / stride(a)) % extent(a)) * stride(a);
  }

  constexpr void check_rank(int rank) const {
    if (rank < 0 || rank >= size_) {
      detail::mesh_fail(axes(), "rank " + std::to_string(rank) + " is outside [0, " +
                                    std::to_string(size_) + ")");
    }
  }

  [[noreturn]] void fail_coord(const mesh_coord& c, axis a) const {
    detail::mesh_fail(axes(), "coordinate {tp " + std::to_string(c.tp) + ", pp " +
                                  std::to_string(c.pp) + ", dp " + std::to_string(c.dp) + ", cp " +
                                  std::to_string(c.cp) + ", ep " + std::to_string(c.ep) + "} has " +
                                  std::string(axis_name(a)) + " = " + std::to_string(c[a]) +
                                  ", outside [0, " + std::to_string(extent(a)) + ")" +
                                  (contains(a) ? "" : " (the mesh has no such axis)"));
  }

  std::array<axis_extent, axis_kind_count> axes_{};
  std::size_t count_ = 0;
  int size_ = 1;
  std::array<int, axis_kind_count> extent_{1, 1, 1, 1, 1};
  std::array<int, axis_kind_count> stride_{1, 1, 1, 1, 1};
};

namespace detail {

template <class T>
struct axis_tag_traits {
  static constexpr bool is_tag = false;
  static constexpr axis kind = axis::tp;
  static constexpr int extent = 1;
};

template <template <int> class Tag, int N>
requires std::is_same_v<Tag<N>, tp<N>> || std::is_same_v<Tag<N>, pp<N>> ||
    std::is_same_v<Tag<N>, dp<N>> || std::is_same_v<Tag<N>, cp<N>> || std::is_same_v<Tag<N>, ep<N>>
struct axis_tag_traits<Tag<N>> {
  static constexpr bool is_tag = true;
  static constexpr axis kind = Tag<N>::kind;
  static constexpr int extent = N;
};

template <std::size_t N>
[[nodiscard]] constexpr bool kinds_distinct(const std::array<axis_extent, N>& spec) noexcept {
  for (std::size_t i = 0; i < N; ++i) {
    for (std::size_t j = i + 1; j < N; ++j) {
      if (spec[i].kind == spec[j].kind) {
        return false;
      }
    }
  }
  return true;
}

} // namespace detail

// The device mesh, first axis varying fastest. A fully static mesh answers everything at compile
// time; with one weft::dynamic axis only extent<A> of the static axes is known, and the rest comes
// from resolve(world_size).
//
// Misuse that does not compile (each stops at a static_assert saying what to change):
//   mesh<int>                          not an axis tag
//   mesh<tp<2>, tp<4>>                 an axis kind twice
//   mesh<tp<-1>>                       a negative extent
//   mesh<tp<dynamic>, dp<dynamic>>     two dynamic axes
//   mesh<tp<2>, dp<dynamic>>::size     (and coords, rank, group, group_index, layout,
//                                      extent<axis::dp>): needs resolve(world_size)
//   mesh<tp<2>>::coords(2)             a rank out of range inside a constant expression
template <class... Axes>
struct mesh {
  static_assert((detail::axis_tag_traits<Axes>::is_tag && ...),
                "weft::mesh: every parameter must be an axis tag: weft::tp<N>, weft::pp<N>, "
                "weft::dp<N>, weft::cp<N> or weft::ep<N>");

  // The axes as data, extent weft::dynamic (0) for the run-time one.
  static constexpr std::array<axis_extent, sizeof...(Axes)> spec{
      axis_extent{detail::axis_tag_traits<Axes>::kind, detail::axis_tag_traits<Axes>::extent}...};

  static_assert(
      detail::kinds_distinct(spec),
      "weft::mesh: an axis kind appears twice; give each of tp, pp, dp, cp, ep at most once");
  static_assert(((detail::axis_tag_traits<Axes>::extent >= 0) && ...),
                "weft::mesh: an extent is negative; use a positive extent or weft::dynamic");
  static_assert(((detail::axis_tag_traits<Axes>::extent == dynamic ? 1 : 0) + ... + 0) <= 1,
                "weft::mesh: at most one axis may be weft::dynamic; fix the others to numbers");

  using coord = mesh_coord;

  // The number of axes (not of ranks: that is size).
  static constexpr int rank_count = sizeof...(Axes);

  static constexpr bool is_dynamic = ((detail::axis_tag_traits<Axes>::extent == dynamic) || ...);

  // The resolved layout of a fully static mesh.
  [[nodiscard]] static constexpr mesh_layout layout() {
    static_assert(!is_dynamic,
                  "weft::mesh: this mesh has a weft::dynamic axis, so its size, coordinates and "
                  "groups are known only at run time: call Mesh::resolve(world_size) and use the "
                  "returned weft::mesh_layout");
    return mesh_layout(std::span<const axis_extent>(spec));
  }

  static constexpr int size = layout().size();

private:
  template <axis A>
  static constexpr int checked_extent() {
    constexpr int e = [] {
      for (const axis_extent& ax : spec) {
        if (ax.kind == A) {
          return ax.extent;
        }
      }
      return 1;
    }();
    static_assert(e != dynamic,
                  "weft::mesh: this axis is weft::dynamic, so its extent is known only at "
                  "run time: call Mesh::resolve(world_size).extent(axis)");
    return e;
  }

public:
  // 1 for an axis kind absent from the mesh. Known for the static axes of a dynamic mesh too.
  template <axis A>
  static constexpr int extent = checked_extent<A>();

  // For a static mesh, checks world_size == size; for a dynamic one, fixes the dynamic extent.
  // Generic code can always go through the returned layout.
  [[nodiscard]] static constexpr mesh_layout resolve(int world_size) {
    return mesh_layout::resolve(std::span<const axis_extent>(spec), world_size);
  }

  [[nodiscard]] static constexpr coord coords(int rank) { return layout().coords(rank); }

  [[nodiscard]] static constexpr int rank(const coord& c) { return layout().rank(c); }

  template <axis A>
  [[nodiscard]] static constexpr std::array<int, static_cast<std::size_t>(extent<A>)> group(
      int rank) {
    constexpr mesh_layout l = layout();
    std::array<int, static_cast<std::size_t>(extent<A>)> ranks{};
    for (int i = 0; i < extent<A>; ++i) {
      ranks[static_cast<std::size_t>(i)] = l.group_member(A, rank, i);
    }
    return ranks;
  }

  template <axis A>
  [[nodiscard]] static constexpr int group_index(int rank) {
    return layout().group_index(A, rank);
  }
};

} // namespace weft

#include <weft/core/detail/planning_end.hpp>
