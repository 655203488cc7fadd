#pragma once
// How a topology-aware algorithm sees its group: the ranks of each node (plan_request's
// node_of), who leads whom when nodes hold different numbers of ranks, and the constexpr
// name of a composed algorithm ("hierarchical<ring, tree>").
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>

#include <cstddef>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::detail {

/// The ranks of a group by node. Nodes are numbered in increasing order of their node_of
/// value, ranks within a node in increasing rank order (the local index), whatever order
/// node_of lists them in, so every rank builds the same layout.
struct node_layout {
  std::vector<std::vector<int>> ranks; // ranks[n][j]: local rank j of node n
  std::vector<int> node;               // node[r]: the node index of rank r
  std::vector<int> local;              // local[r]: the local index of rank r
  int fewest = 0;                      // the fewest ranks on any node

  [[nodiscard]] int nodes() const noexcept { return static_cast<int>(ranks.size()); }
};

/// Throws weft::error unless node_of is empty (one node) or names a node >= 0 for each rank.
inline node_layout layout_nodes(const plan_request& q, std::string_view algorithm) {
  const auto up = static_cast<std::size_t>(q.size);
  if (!q.node_of.empty() && q.node_of.size() != up) {
    throw error(name_of(q.coll), q.rank, error::unknown,
                std::string(algorithm) + ": node_of names the nodes of " +
                    std::to_string(q.node_of.size()) + " ranks in a group of " +
                    std::to_string(q.size));
  }
  std::map<int, std::vector<int>> by_node;
  for (int r = 0; r < q.size; ++r) {
    const int n = q.node_of.empty() ? 0 : q.node_of[static_cast<std::size_t>(r)];
    if (n < 0) {
      throw error(name_of(q.coll), q.rank, error::unknown,
                  std::string(algorithm) + ": node_of gives rank " + std::to_string(r) + " node " +
                      std::to_string(n));
    }
    by_node[n].push_back(r);
  }
  node_layout lay;
  lay.node.assign(up, 0);
  lay.local.assign(up, 0);
  for (auto& [id, members] : by_node) {
    const int n = lay.nodes();
    for (std::size_t j = 0; j < members.size(); ++j) {
      lay.node[static_cast<std::size_t>(members[j])] = n;
      lay.local[static_cast<std::size_t>(members[j])] = static_cast<int>(j);
    }
    const int k = static_cast<int>(members.size());
    lay.fewest = lay.ranks.empty() || k < lay.fewest ? k : lay.fewest;
    lay.ranks.push_back(std::move(members));
  }
  return lay;
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
