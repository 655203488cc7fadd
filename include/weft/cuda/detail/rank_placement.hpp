#pragma once
// Where the ranks of an NCCL communicator (weft/cuda/nccl.cuh) sit: the cluster its ranks
// form, each rank's device in it and each rank's node, from an emulated topology, node labels
// or one node. Host logic only: nothing here calls CUDA or NCCL.
#include <weft/core/error.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::cuda::detail {

/// Where the ranks of a communicator sit.
struct rank_placement {
  std::shared_ptr<const topology::cluster> cluster;
  std::vector<int> devices; // devices[r]: rank r's device in *cluster, node-major
  std::vector<int> node_of; // node_of[r]: rank r's node in *cluster
  bool emulated = false;
};

/// Places `size` ranks by the first of: `topology` (rank r on its device r), the spec
/// `env_spec` (WEFT_TOPOLOGY; null or empty: none), `node_label` (ranks with equal labels
/// share a node; nodes in the order of their lowest rank, devices numbered node-major), one
/// node. A topology must describe exactly `size` ranks, and node_label must have one label
/// per rank, else weft::error.
inline rank_placement place_ranks(int size, const std::optional<topology::cluster>& topology,
                                  const char* env_spec, const std::vector<int>& node_label) {
  constexpr std::string_view where = "nccl::communicator";
  rank_placement pl;
  std::optional<topology::cluster> emulated = topology;
  std::string source = "the topology in nccl::options";
  if (!emulated && env_spec != nullptr && *env_spec != '\0') {
    emulated = topology::parse(env_spec);
    source = "WEFT_TOPOLOGY=\"" + std::string(env_spec) + "\"";
  }
  if (emulated) {
    if (emulated->size() != size) {
      throw error(where, error::unknown, error::unknown,
                  source + " describes " + std::to_string(emulated->size()) +
                      " ranks, but the NCCL communicator has " + std::to_string(size) +
                      ": give a topology of " + std::to_string(size) +
                      " ranks (unset WEFT_TOPOLOGY to use options::node_of or one node)");
    }
    pl.emulated = true;
    for (int r = 0; r < size; ++r)
      pl.devices.push_back(r);
    pl.cluster = std::make_shared<const topology::cluster>(std::move(*emulated));
  } else {
    std::vector<int> label = node_label;
    if (label.empty()) label.assign(static_cast<std::size_t>(size), 0);
    if (label.size() != static_cast<std::size_t>(size)) {
      throw error(where, error::unknown, error::unknown,
                  "options::node_of has " + std::to_string(label.size()) +
                      " labels for a communicator of " + std::to_string(size) +
                      " ranks: give one per rank, or none");
    }
    std::vector<int> names; // labels in the order of each node's lowest rank
    std::vector<int> node(label.size());
    for (std::size_t r = 0; r < label.size(); ++r) {
      const auto it = std::find(names.begin(), names.end(), label[r]);
      node[r] = static_cast<int>(it - names.begin());
      if (it == names.end()) names.push_back(label[r]);
    }
    std::vector<int> per_node(names.size(), 0);
    for (int n : node)
      ++per_node[static_cast<std::size_t>(n)];
    std::vector<int> next(names.size(), 0); // the next free device of each node
    for (std::size_t n = 1; n < names.size(); ++n)
      next[n] = next[n - 1] + per_node[n - 1];
    for (int n : node)
      pl.devices.push_back(next[static_cast<std::size_t>(n)]++);
    pl.cluster = std::make_shared<const topology::cluster>(
        per_node, topology::default_link(topology::link_kind::nvlink),
        topology::default_link(topology::link_kind::infiniband));
  }
  for (int d : pl.devices)
    pl.node_of.push_back(pl.cluster->node_of(d));
  return pl;
}

} // namespace weft::cuda::detail
