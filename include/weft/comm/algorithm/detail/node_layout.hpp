#pragma once
// How a two-level collective (hierarchical, automatic's pricing, two_level) sees its group:
// which ranks are on which node, each rank's index there, the leaders, and whether every
// node holds as many ranks; and the constexpr name of a composed algorithm
// ("hierarchical<ring, tree>").
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::detail {

/// The order in which a node_layout numbers the nodes. A node's number is its place in the
/// cross-node collectives (the rank of its leaders there), so it fixes the order in which
/// partial sums from different nodes meet, and with it the bits of a floating-point result;
/// each user keeps the numbering its results have always had. The two agree wherever node ids
/// grow with the nodes' first ranks, as they do for a topology spec's cluster.
enum class node_numbering {
  by_node_id,   ///< increasing node_of value: plans (hierarchical, automatic), from node_of alone
  by_first_rank ///< in the order of the nodes' first ranks: two_level, whose inter-node
                ///< communicators rank the nodes so (make_two_level splits with it as the key)
};

/// Which ranks are on which node, each rank's index on its node, and how many ranks the nodes
/// hold. Ranks within a node are in increasing rank order (the local index), whatever order
/// node_of lists them in, so every rank builds the same layout.
struct node_layout {
  std::vector<std::vector<int>> ranks; // ranks[n][j]: local rank j of node n
  std::vector<int> node;               // node[r]: the node index of rank r
  std::vector<int> local;              // local[r]: the local index of rank r

  node_layout() = default;
  /// The layout of node_of.size() ranks, rank r on node id node_of[r] (any int).
  explicit node_layout(const std::vector<int>& node_of,
                       node_numbering numbering = node_numbering::by_node_id) {
    std::map<int, std::vector<int>> by_id;
    for (std::size_t r = 0; r < node_of.size(); ++r)
      by_id[node_of[r]].push_back(static_cast<int>(r));
    ranks.reserve(by_id.size());
    for (auto& [id, members] : by_id)
      ranks.push_back(std::move(members));
    if (numbering == node_numbering::by_first_rank) {
      std::sort(ranks.begin(), ranks.end(),
                [](const std::vector<int>& a, const std::vector<int>& b) { return a[0] < b[0]; });
    }
    node.assign(node_of.size(), 0);
    local.assign(node_of.size(), 0);
    for (std::size_t n = 0; n < ranks.size(); ++n) {
      const auto& members = ranks[n];
      for (std::size_t j = 0; j < members.size(); ++j) {
        node[static_cast<std::size_t>(members[j])] = static_cast<int>(n);
        local[static_cast<std::size_t>(members[j])] = static_cast<int>(j);
      }
      const int k = static_cast<int>(members.size());
      min_ = n == 0 || k < min_ ? k : min_;
      max_ = n == 0 || k > max_ ? k : max_;
    }
  }

  [[nodiscard]] int nodes() const noexcept { return static_cast<int>(ranks.size()); }
  /// Ranks on node n.
  [[nodiscard]] int ranks_on(int n) const {
    return static_cast<int>(ranks[static_cast<std::size_t>(n)].size());
  }
  /// The fewest ranks on any node: local ranks 0 .. min_ranks_per_node() - 1 of every node are
  /// its leaders, which carry 1/min_ranks_per_node() of the node's data across nodes.
  [[nodiscard]] int min_ranks_per_node() const noexcept { return min_; }
  /// Every node holds as many ranks.
  [[nodiscard]] bool uniform() const noexcept { return min_ == max_; }

private:
  int min_ = 0;
  int max_ = 0;
};

/// The layout of a plan's group (by_node_id). Throws weft::error unless node_of is empty (one
/// node) or names a node >= 0 for each rank.
inline node_layout layout_nodes(const plan_request& q, std::string_view algorithm) {
  const auto up = static_cast<std::size_t>(q.size);
  if (!q.node_of.empty() && q.node_of.size() != up) {
    throw error(name_of(q.coll), q.rank, error::unknown,
                std::string(algorithm) + ": node_of names the nodes of " +
                    std::to_string(q.node_of.size()) + " ranks in a group of " +
                    std::to_string(q.size));
  }
  for (std::size_t r = 0; r < q.node_of.size(); ++r) {
    if (q.node_of[r] < 0) {
      throw error(name_of(q.coll), q.rank, error::unknown,
                  std::string(algorithm) + ": node_of gives rank " + std::to_string(r) + " node " +
                      std::to_string(q.node_of[r]));
    }
  }
  return node_layout(q.node_of.empty() ? std::vector<int>(up, 0) : q.node_of);
}

/// A name spelled at compile time from parts, for algorithms named after their parameters.
struct composed_name {
  char text[256] = {};
  std::size_t size = 0;

  constexpr composed_name(std::initializer_list<std::string_view> parts) {
    for (std::string_view part : parts) {
      for (char ch : part)
        text[size++] = ch; // past 256 characters: not a constant expression
    }
  }
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {text, size}; }
};

static_assert(composed_name{"a<", "b", ", ", "c", ">"}.view() == "a<b, c>");

} // namespace weft::detail

#include <weft/core/detail/planning_end.hpp>
