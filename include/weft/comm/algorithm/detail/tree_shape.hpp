#pragma once
// The two binary trees of algo::tree (see tree.hpp for the picture).
//
// Tree 1 is the in-order binary tree on positions 0..q-1: position i is node v = i + 1 of the
// infinite in-order tree, where a node whose lowest set bit is 2^k (k >= 1) has the children
// v - 2^(k-1) and v + 2^(k-1), and odd v are leaves. Trimmed to 1..q, the root is the
// largest power of two <= q, and a right child beyond q is replaced by the highest node of
// its left spine that exists (v + 2^j, the largest j < k with v + 2^j <= q), which keeps
// the in-order numbering. Every even v has a left child, so the interior nodes are exactly
// the even v: the odd positions i. The height is floor(log2 q).
//
// Tree 2 is tree 1 shifted by one rank: position i holds rank (i + 1) % q. Its interior
// nodes are the even ranks (position q - 1 would be rank 0, but for odd q it is a leaf), so
// every rank is interior in at most one tree and a leaf in at least one, for every q >= 1.
// (Mirroring i -> q - 1 - i would do the same for even q only: for odd q it maps odd to odd.)
#include <weft/core/error.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::detail {

/// Position of the root of the in-order tree on q >= 1 nodes.
constexpr int in_order_root(int q) noexcept {
  return static_cast<int>(std::bit_floor(static_cast<unsigned>(q))) - 1;
}

/// Left child of position i in the in-order tree on q nodes, or -1.
constexpr int in_order_left(int i, int /*q*/) noexcept {
  const unsigned v = static_cast<unsigned>(i) + 1;
  const int k = std::countr_zero(v);
  return k == 0 ? -1 : static_cast<int>(v - (1u << (k - 1))) - 1;
}

/// Right child of position i in the in-order tree on q nodes, or -1.
constexpr int in_order_right(int i, int q) noexcept {
  const unsigned v = static_cast<unsigned>(i) + 1;
  for (int j = std::countr_zero(v) - 1; j >= 0; --j) {
    if (v + (1u << j) <= static_cast<unsigned>(q)) return static_cast<int>(v + (1u << j)) - 1;
  }
  return -1;
}

/// Parent of position i in the in-order tree on q nodes, or -1 at the root: the nearest
/// ancestor in the infinite tree that exists.
constexpr int in_order_parent(int i, int q) noexcept {
  unsigned v = static_cast<unsigned>(i) + 1;
  if (v == std::bit_floor(static_cast<unsigned>(q))) return -1;
  do {
    const unsigned low = v & (~v + 1);
    // A right child has the next bit up set: its parent is below it, else above.
    v = (v & (low << 1)) != 0 ? v - low : v + low;
  } while (v > static_cast<unsigned>(q));
  return static_cast<int>(v) - 1;
}

// q = 6:        3            (positions)
//           1       5
//         0   2   4
static_assert(in_order_root(6) == 3 && in_order_parent(3, 6) == -1);
static_assert(in_order_left(3, 6) == 1 && in_order_right(3, 6) == 5);
static_assert(in_order_left(5, 6) == 4 && in_order_right(5, 6) == -1);
static_assert(in_order_parent(4, 6) == 5 && in_order_parent(5, 6) == 3 &&
              in_order_parent(2, 6) == 1);
// q = 9: root 7 has children 3 and 8 (node 12 and its left spine 10 do not exist).
static_assert(in_order_root(9) == 7 && in_order_right(7, 9) == 8 && in_order_parent(8, 9) == 7);
static_assert(in_order_root(1) == 0 && in_order_left(0, 1) == -1 && in_order_right(0, 1) == -1);

/// One tree over ranks 0..p-1, indexed by rank.
struct tree_links {
  int root = 0;
  std::vector<int> parent;                  // -1 at the root
  std::vector<std::array<int, 2>> children; // left, right; -1 where absent
  std::vector<int> height;                  // edges down to the deepest leaf below (leaves 0)
  std::vector<int> depth;                   // edges up to the root

  [[nodiscard]] bool leaf(int r) const { return children[static_cast<std::size_t>(r)][0] < 0; }
};

/// The two trees of the double binary tree on p >= 1 ranks: tree 1 in-order, tree 2 the
/// same shifted by one rank.
inline std::array<tree_links, 2> double_binary_tree(int p) {
  WEFT_EXPECTS(p >= 1, "double_binary_tree needs at least one rank");
  const auto n = static_cast<std::size_t>(p);
  std::array<tree_links, 2> trees;
  for (int t = 0; t < 2; ++t) {
    tree_links& tr = trees[static_cast<std::size_t>(t)];
    const auto rank_at = [&](int pos) { return pos < 0 ? -1 : (pos + t) % p; };
    tr.parent.assign(n, -1);
    tr.children.assign(n, {-1, -1});
    tr.height.assign(n, 0);
    tr.depth.assign(n, 0);
    tr.root = rank_at(in_order_root(p));
    for (int pos = 0; pos < p; ++pos) {
      const auto r = static_cast<std::size_t>(rank_at(pos));
      tr.parent[r] = rank_at(in_order_parent(pos, p));
      tr.children[r] = {rank_at(in_order_left(pos, p)), rank_at(in_order_right(pos, p))};
    }
    // Depths from the root down, heights from the leaves up. An ancestor's node number has
    // a higher lowest set bit than its descendants', so ordering by that bit puts every
    // parent before its children.
    const auto low_bit = [](int pos) { return std::countr_zero(static_cast<unsigned>(pos) + 1); };
    std::vector<int> order;
    order.reserve(n);
    for (int k = low_bit(in_order_root(p)); k >= 0; --k) {
      for (int pos = 0; pos < p; ++pos) {
        if (low_bit(pos) == k) order.push_back(rank_at(pos));
      }
    }
    for (int r : order) {
      const int up = tr.parent[static_cast<std::size_t>(r)];
      if (up >= 0)
        tr.depth[static_cast<std::size_t>(r)] = tr.depth[static_cast<std::size_t>(up)] + 1;
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      const int up = tr.parent[static_cast<std::size_t>(*it)];
      if (up >= 0) {
        int& h = tr.height[static_cast<std::size_t>(up)];
        const int below = tr.height[static_cast<std::size_t>(*it)] + 1;
        h = below > h ? below : h;
      }
    }
  }
  return trees;
}

} // namespace weft::detail

#include <weft/core/detail/planning_end.hpp>
