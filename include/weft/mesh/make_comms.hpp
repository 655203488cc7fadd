#pragma once
// weft::make_comms<Mesh>(world, topo): splits the world communicator into one communicator per mesh
// axis, after checking that the latency-critical groups sit inside one node.
//
// Every rank runs the same sequence of collective splits of `world`, in a fixed order whatever the
// mesh order:
//
//   split       color                        key
//   world copy  0                            world rank
//   tp          group_index(tp, rank)        tp coordinate      (likewise pp, dp, cp, ep)
//
// so the ranks of each new communicator are the mesh's group, ordered by the axis coordinate. An
// axis absent from the mesh gets color = rank, a communicator of one.
//
// The placement check reads only the mesh and the topology, never the rank, and runs before the
// first split: a bad placement throws on every rank, instead of throwing on some while the others
// wait in a split that never completes.
#include <weft/core/error.hpp>
#include <weft/mesh/mesh.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <concepts>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft {

namespace placement {

// Tensor- and context-parallel groups must each lie within one node.
struct strict {};

// No placement check: for meshes that deliberately run tp or cp over the inter-node link.
struct allow_cross_node {};

} // namespace placement

namespace detail {

// What make_comms needs of a communicator; the full communicator concept asks for more.
template <class Comm>
concept splittable_communicator = std::movable<Comm> &&
    requires(Comm& c, const Comm& cc, int color, int key) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { c.split(color, key) } -> std::same_as<Comm>;
};

template <class T>
inline constexpr bool is_mesh_v = false;

template <class... Axes>
inline constexpr bool is_mesh_v<mesh<Axes...>> = true;

template <class P>
inline constexpr bool is_placement_v =
    std::is_same_v<P, placement::strict> || std::is_same_v<P, placement::allow_cross_node>;

inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    s += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  return s + "]";
}

// The first group of `a` whose ranks lie on more than one node (node[r]: rank r's), or an
// empty vector.
inline std::vector<int> first_cross_node_group(const mesh_layout& layout,
                                               const std::vector<int>& node, axis a) {
  const auto node_of = [&](int q) { return node[static_cast<std::size_t>(q)]; };
  for (int r = 0; r < layout.size(); ++r) {
    if (layout.coords(r)[a] != 0) {
      continue;
    }
    std::vector<int> group = layout.group(a, r);
    const int first = node_of(group.front());
    if (std::any_of(group.begin(), group.end(), [&](int q) { return node_of(q) != first; })) {
      return group;
    }
  }
  return {};
}

// node[r]: the node of the world's rank r, through the device it runs on where the communicator
// says (devices(): a launcher may place ranks in another order than the devices').
template <class Comm>
std::vector<int> node_of_ranks(const Comm& world, const topology::cluster& topo) {
  std::vector<int> node(static_cast<std::size_t>(world.size()));
  for (int q = 0; q < world.size(); ++q) {
    int device = q;
    if constexpr (requires { world.devices(); }) {
      const auto& devices = world.devices();
      if (devices.size() == node.size()) device = devices[static_cast<std::size_t>(q)];
    }
    if (device < 0 || device >= topo.size()) {
      throw error("make_comms", world.rank(), error::unknown,
                  "rank " + std::to_string(q) + " runs on device " + std::to_string(device) +
                      ", outside the topology of " + std::to_string(topo.size()));
    }
    node[static_cast<std::size_t>(q)] = topo.node_of(device);
  }
  return node;
}

// The mesh with tp first and cp second, the other axes in their order: the order that keeps tp and
// cp groups on consecutive ranks.
inline std::vector<axis_extent> tp_first(std::span<const axis_extent> spec) {
  std::vector<axis_extent> order;
  for (axis lead : {axis::tp, axis::cp}) {
    for (const axis_extent& ax : spec) {
      if (ax.kind == lead) {
        order.push_back(ax);
      }
    }
  }
  for (const axis_extent& ax : spec) {
    if (ax.kind != axis::tp && ax.kind != axis::cp) {
      order.push_back(ax);
    }
  }
  return order;
}

inline std::string mesh_type_name(std::span<const axis_extent> spec) {
  std::string s = "weft::mesh<";
  for (std::size_t i = 0; i < spec.size(); ++i) {
    s += (i == 0 ? "weft::" : ", weft::") + std::string(axis_name(spec[i].kind)) + "<" +
         (spec[i].extent == dynamic ? std::string("weft::dynamic")
                                    : std::to_string(spec[i].extent)) +
         ">";
  }
  return s + ">";
}

// Throws if a tp or cp group spans nodes. `spec` is the mesh as written (possibly with a dynamic
// extent), used only for the suggestion; `layout` is it resolved to the world.
inline void check_placement(std::span<const axis_extent> spec, const mesh_layout& layout,
                            const topology::cluster& topo, const std::vector<int>& node, int rank) {
  for (axis a : {axis::tp, axis::cp}) {
    const std::vector<int> group = first_cross_node_group(layout, node, a);
    if (group.empty()) {
      continue;
    }
    std::vector<int> nodes;
    for (int q : group) {
      nodes.push_back(node[static_cast<std::size_t>(q)]);
    }
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());

    const bool is_tp = a == axis::tp;
    std::string what = "mesh " + layout.name() + " puts the " +
                       (is_tp ? "tensor-parallel (tp)" : "context-parallel (cp)") +
                       " group of ranks " + rank_list(group) + " on nodes " + rank_list(nodes) +
                       ": the " +
                       (is_tp ? "all-reduces inside every layer"
                              : "key/value exchanges inside every attention layer") +
                       " would run over the inter-node link (e.g. InfiniBand) instead of the "
                       "intra-node one (NVLink). ";

    const std::vector<axis_extent> order = tp_first(layout.axes());
    const mesh_layout reordered{std::span<const axis_extent>(order)};
    const bool reordering_helps = reordered != layout &&
                                  first_cross_node_group(reordered, node, axis::tp).empty() &&
                                  first_cross_node_group(reordered, node, axis::cp).empty();
    if (reordering_helps) {
      what += "Put tp first in the mesh (fastest varying)" +
              std::string(layout.contains(axis::cp) ? ", cp next" : "") + ", as in " +
              mesh_type_name(tp_first(spec)) + ",";
    } else {
      // Tp first and cp next is the most compact order: if it fails, every order does.
      what +=
          "No order of the mesh axes keeps every tp and cp group within one node of this "
          "topology (" +
          std::to_string(topo.size()) + " ranks on " + std::to_string(topo.nodes()) +
          " nodes): use a smaller " + std::string(axis_name(a)) + " extent,";
    }
    what += " or pass weft::placement::allow_cross_node to make_comms if this is intended";
    throw error("make_comms", rank, error::unknown, what);
  }
}

} // namespace detail

// One communicator per mesh axis, and a copy of the world, all owned; for the calling rank.
template <class Comm>
class axis_comms {
public:
  axis_comms(mesh_layout layout, mesh_coord coord, Comm world, Comm tp, Comm pp, Comm dp, Comm cp,
             Comm ep)
      : layout_(layout),
        coord_(coord),
        world_(std::move(world)),
        tp_(std::move(tp)),
        pp_(std::move(pp)),
        dp_(std::move(dp)),
        cp_(std::move(cp)),
        ep_(std::move(ep)) {}

  [[nodiscard]] Comm& tp() noexcept { return tp_; }
  [[nodiscard]] Comm& pp() noexcept { return pp_; }
  [[nodiscard]] Comm& dp() noexcept { return dp_; }
  [[nodiscard]] Comm& cp() noexcept { return cp_; }
  [[nodiscard]] Comm& ep() noexcept { return ep_; }
  [[nodiscard]] Comm& world() noexcept { return world_; }
  [[nodiscard]] const Comm& tp() const noexcept { return tp_; }
  [[nodiscard]] const Comm& pp() const noexcept { return pp_; }
  [[nodiscard]] const Comm& dp() const noexcept { return dp_; }
  [[nodiscard]] const Comm& cp() const noexcept { return cp_; }
  [[nodiscard]] const Comm& ep() const noexcept { return ep_; }
  [[nodiscard]] const Comm& world() const noexcept { return world_; }

  template <axis A>
  [[nodiscard]] Comm& get() noexcept {
    return const_cast<Comm&>(std::as_const(*this).template get<A>());
  }

  template <axis A>
  [[nodiscard]] const Comm& get() const noexcept {
    if constexpr (A == axis::tp) {
      return tp_;
    } else if constexpr (A == axis::pp) {
      return pp_;
    } else if constexpr (A == axis::dp) {
      return dp_;
    } else if constexpr (A == axis::cp) {
      return cp_;
    } else {
      return ep_;
    }
  }

  [[nodiscard]] const mesh_layout& layout() const noexcept { return layout_; }

  // This rank's coordinates in the mesh.
  [[nodiscard]] const mesh_coord& coord() const noexcept { return coord_; }

private:
  mesh_layout layout_;
  mesh_coord coord_;
  Comm world_;
  Comm tp_;
  Comm pp_;
  Comm dp_;
  Comm cp_;
  Comm ep_;
};

namespace detail {

template <class Mesh, class Placement, class Comm>
void check_make_comms_arguments() {
  static_assert(is_mesh_v<Mesh>, "weft::make_comms<Mesh>: Mesh must be a weft::mesh<...>");
  static_assert(is_placement_v<Placement>,
                "weft::make_comms<Mesh, Placement>: Placement must be weft::placement::strict or "
                "weft::placement::allow_cross_node");
  static_assert(splittable_communicator<Comm>,
                "weft::make_comms: the communicator needs int rank() const, int size() const, "
                "Comm split(int color, int key) and a move constructor");
}

// Collective over `world`: every rank makes the same splits in the same order.
template <class Comm>
axis_comms<Comm> split_axes(Comm& world, const mesh_layout& layout) {
  const int rank = world.rank();
  const mesh_coord coord = layout.coords(rank);
  const auto split = [&](axis a) { return world.split(layout.group_index(a, rank), coord[a]); };
  // Separate statements, because the order of splits must be the same on every rank and function
  // arguments are evaluated in no fixed order.
  Comm world_copy = world.split(0, rank);
  Comm tp = split(axis::tp);
  Comm pp = split(axis::pp);
  Comm dp = split(axis::dp);
  Comm cp = split(axis::cp);
  Comm ep = split(axis::ep);
  return axis_comms<Comm>(layout, coord, std::move(world_copy), std::move(tp), std::move(pp),
                          std::move(dp), std::move(cp), std::move(ep));
}

} // namespace detail

// Collective over `world`. Throws weft::error on every rank, before any split, if the mesh does not
// fit the world size, the topology's size differs from the world's, or (with placement::strict) a
// tp or cp group spans nodes. A rank's node is its device's (world.devices()[r] where the
// communicator has devices(), else device r).
template <class Mesh, class Placement = placement::strict, class Comm>
[[nodiscard]] axis_comms<Comm> make_comms(Comm& world, const topology::cluster& topo) {
  detail::check_make_comms_arguments<Mesh, Placement, Comm>();
  const int world_size = world.size();
  const mesh_layout layout = Mesh::resolve(world_size);
  if (topo.size() != world_size) {
    throw error("make_comms", world.rank(), error::unknown,
                "the topology has " + std::to_string(topo.size()) + " ranks but the world has " +
                    std::to_string(world_size));
  }
  if constexpr (std::is_same_v<Placement, placement::strict>) {
    detail::check_placement(std::span<const axis_extent>(Mesh::spec), layout, topo,
                            detail::node_of_ranks(world, topo), world.rank());
  }
  return detail::split_axes(world, layout);
}

// Collective over `world`, without a placement check.
template <class Mesh, class Placement = placement::strict, class Comm>
[[nodiscard]] axis_comms<Comm> make_comms(Comm& world) {
  detail::check_make_comms_arguments<Mesh, Placement, Comm>();
  return detail::split_axes(world, Mesh::resolve(world.size()));
}

} // namespace weft

#include <weft/core/detail/planning_end.hpp>
