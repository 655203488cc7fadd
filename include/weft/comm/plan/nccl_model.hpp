#pragma once
// The price of NCCL's own collectives (algo::vendor on weft::cuda::nccl): a model of how NCCL
// itself picks an algorithm and a protocol, so that automatic can weigh ncclAllReduce & co.
// against weft's plans, in host code, without a GPU.
//
// NCCL prices every (algorithm, protocol) of a call as latency + bytes / algorithm bandwidth
// and runs the cheapest; this model does the same, with the figures of NCCL's tuning model
// (NVIDIA/nccl, src/graph/tuning.cc at commit b6475625: baseLat, hwLat, the protocol and
// algorithm refinements, the tree correction table, the ring plateau). Latencies in us,
// bandwidths in bytes/s of the cluster's links.
//
//   algorithms  ring (every collective), tree (all_reduce), NVLS (all_reduce, reduce_scatter,
//               all_gather; only where the hardware has NVLink SHARP: nccl_features::nvls;
//               across nodes as NVLS-tree, all_reduce only)
//   protocols   LL (8-byte lines, 4 bytes of data and a flag: low latency, a quarter of the
//               bus bandwidth on rings, 1/3.8 on trees), LL128 (128-byte lines with 120 bytes
//               of data: 92% of it; only over NVLink), Simple (the whole bandwidth, the
//               highest latency); NVLS runs Simple only
//   bus bw      one node: the intra-node link; across nodes: the lesser of the intra-node
//               link and the node's NICs that its ranks use (min(nics, ranks per node) x NIC)
//   algbw       ring: busbw x p / steps (all_reduce 2(p-1) steps, reduce_scatter and
//               all_gather p-1, broadcast and reduce p); tree: busbw x 0.92 / 2; NVLS: x 5/6
//   latency     ring: base + (steps - inter steps) x intra hop + inter steps x network hop;
//               tree: base + 2 ((p/nodes - 1) intra hop + log2(nodes) network hop);
//               NVLS: its switch latency (+ 2 log2(nodes) network hops for NVLS-tree);
//               a ring's Simple all-reduce across nodes x 1.4 (NCCL's plateau factor)
//   time        latency + bytes / algbw, bytes as NCCL counts them (all_gather and
//               reduce_scatter: the whole gathered buffer)
//
// What it leaves out: NCCL's channel counts and per-channel caps (the links' bandwidth stands
// for channels x per-channel speed), CollNet, and NCCL's tuner plugins. all_to_all, which
// NCCL has no collective for (weft's vendor path groups ncclSend/ncclRecv), is priced as one
// Simple step of p2p: ring Simple's base and hop latency, and (p - 1)/p of the bytes over the
// slower link class the call crosses.
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>

namespace weft::cost_model {

enum class nccl_algorithm : std::uint8_t { ring, tree, nvls };
enum class nccl_protocol : std::uint8_t { ll, ll128, simple };

[[nodiscard]] constexpr std::string_view name_of(nccl_algorithm a) noexcept {
  switch (a) {
    case nccl_algorithm::ring: return "ring";
    case nccl_algorithm::tree: return "tree";
    case nccl_algorithm::nvls: return "nvls";
  }
  return "unknown";
}
[[nodiscard]] constexpr std::string_view name_of(nccl_protocol p) noexcept {
  switch (p) {
    case nccl_protocol::ll: return "LL";
    case nccl_protocol::ll128: return "LL128";
    case nccl_protocol::simple: return "Simple";
  }
  return "unknown";
}

/// What the GPUs offer NCCL beyond the links: the CUDA communicator fills it from the device.
struct nccl_features {
  bool nvls = false; // NVLink SHARP (NVSwitch multicast; H100 and later in an NVSwitch system)
  bool ll128 = true; // the GPU generation runs LL128 (NCCL enables it on sm_70, sm_80, sm_90)
  friend constexpr bool operator==(const nccl_features&, const nccl_features&) = default;
};

/// What a round of one of weft's plans costs on an NCCL communicator beyond its links: the
/// round's sends and receives are one ncclGroupStart/ncclGroupEnd, which starts an NCCL kernel
/// of its own, priced as NCCL prices the start of a Simple collective (baseLat, ring Simple:
/// 8.4 us); the round's reduce and copy kernels queue behind it.
inline constexpr double nccl_plan_round_seconds = 8.4e-6;

/// NCCL's pick for one call and what the model says it costs.
struct nccl_estimate {
  double seconds = std::numeric_limits<double>::infinity();
  nccl_algorithm algorithm = nccl_algorithm::ring;
  nccl_protocol protocol = nccl_protocol::simple;
};

} // namespace weft::cost_model

namespace weft::detail::nccl_figures {

// Latencies in us, indexed [algorithm][protocol] with protocols LL, LL128, Simple.
// baseLat: the fixed cost of a collective (NVLS has none beyond its hop).
inline constexpr double base_us[3][3] = {{6.6, 14.0, 8.4}, {6.8, 14.0, 0.0}, {0.0, 0.0, 0.0}};
// hwLat: one hop over NVLink, PCIe and the network.
inline constexpr double nvlink_hop_us[3][3] = {{0.6, 1.9, 3.4}, {0.6, 1.25, 28.0}, {0, 0, 23.0}};
inline constexpr double pci_hop_us[3][3] = {{1.0, 2.5, 5.7}, {1.0, 1.9, 28.0}, {0, 0, 0}};
inline constexpr double net_hop_us[3][3] = {{2.7, 4.0, 14.0}, {5.0, 8.5, 28.0}, {0, 0, 18.0}};
inline constexpr double nvls_tree_net_hop_us = 14.0;
// A network post's overhead on an x86 host (us; Simple posts three per step): floors the
// intra-node hop of a ring that crosses nodes.
inline constexpr double net_overhead_us = 1.0;
// Trees stray from the model at medium sizes: NCCL scales their bandwidth by these, for
// log2(bytes / 64) = 0 .. 22, per protocol (LL, LL128, Simple).
inline constexpr double tree_correction[3][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7,  .7,  .7,  .6, .5,
     .4,  .4,  .5,  .6,  .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7,  .6, .6,
     .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};
// A ring's Simple all-reduce across nodes pays 1.4 x its latency (sm_80 and later) once each
// rank's share of each channel reaches 64 bytes: with NCCL's 32 channels at most, from
// 2 KiB per rank.
inline constexpr double ring_plateau = 1.4;
inline constexpr double ring_plateau_bytes_per_rank = 64.0 * 32;

constexpr int log2_floor(double x) {
  int k = 0;
  while (x >= 2) {
    x /= 2;
    ++k;
  }
  return k;
}

} // namespace weft::detail::nccl_figures

namespace weft::cost_model {

/// The bytes NCCL counts for a call of q (q.count in plan.hpp's sense): the buffer for
/// all_reduce, broadcast and reduce, the whole gathered buffer (count x p) for all_gather and
/// reduce_scatter, a rank's whole input (count x p) for all_to_all.
[[nodiscard]] constexpr double nccl_bytes(const plan_request& q) noexcept {
  const bool whole = q.coll == collective::all_gather || q.coll == collective::reduce_scatter ||
                     q.coll == collective::all_to_all;
  return static_cast<double>(q.count) * static_cast<double>(q.element_size) *
         (whole ? static_cast<double>(q.size) : 1.0);
}

/// The model's time for NCCL's algorithm a with protocol pr on q over c (q.node_of groups the
/// ranks into nodes; empty: one node), or infinity where NCCL does not run that pair for q.
[[nodiscard]] inline double nccl_time(const plan_request& q, const topology::cluster& c,
                                      const nccl_features& f, nccl_algorithm a, nccl_protocol pr) {
  namespace k = weft::detail::nccl_figures;
  constexpr double inf = std::numeric_limits<double>::infinity();
  const int p = q.size;
  if (p < 1) throw error("weft: NCCL model: a group of " + std::to_string(p) + " ranks");
  const double bytes = nccl_bytes(q);
  if (p == 1 || bytes == 0) return 0;
  const std::set<int> node_set(q.node_of.begin(), q.node_of.end());
  const int nodes = node_set.empty() ? 1 : static_cast<int>(node_set.size());
  const int ppn = std::max(1, p / nodes);
  const auto ai = static_cast<std::size_t>(a);
  const auto pi = static_cast<std::size_t>(pr);
  const bool nvlink = c.intra().kind == topology::link_kind::nvlink;
  const collective coll = q.coll;

  // What NCCL runs.
  if (pr == nccl_protocol::ll128 && !(f.ll128 && nvlink)) return inf;
  if (a == nccl_algorithm::tree && coll != collective::all_reduce) return inf;
  if (a == nccl_algorithm::nvls) {
    if (!f.nvls || !nvlink || pr != nccl_protocol::simple) return inf;
    const bool served =
        coll == collective::all_reduce ||
        (nodes == 1 && (coll == collective::reduce_scatter || coll == collective::all_gather));
    if (!served) return inf;
  }
  if (coll == collective::all_to_all && (a != nccl_algorithm::ring || pr != nccl_protocol::simple))
    return inf;

  const auto& intra_hop = nvlink ? k::nvlink_hop_us : k::pci_hop_us;
  const double link_bw =
      nodes == 1
          ? c.intra().bandwidth
          : std::min(c.intra().bandwidth, c.inter().bandwidth * std::min(c.nics_per_node(), ppn));

  if (coll == collective::all_to_all) {
    const double hop = nodes == 1 ? intra_hop[0][2] : k::net_hop_us[0][2];
    return (k::base_us[0][2] + hop) * 1e-6 + bytes * (p - 1) / p / link_bw;
  }

  double bus = link_bw;
  double latency_us = k::base_us[ai][pi];
  double algbw = 0;
  switch (a) {
    case nccl_algorithm::ring: {
      const bool reducing_or_nodes =
          nodes > 1 || coll == collective::all_reduce || coll == collective::reduce;
      if (pr == nccl_protocol::ll) bus *= reducing_or_nodes ? 1.0 / 4.0 : 1.0 / 3.0;
      if (pr == nccl_protocol::ll128) bus *= ppn < 2 ? 0.7 : 0.92;
      int steps = p;
      int inter_steps = nodes;
      if (coll == collective::all_reduce) {
        steps = 2 * (p - 1);
        // NCCL counts 2 x nodes network steps; with one rank per node every step is one.
        inter_steps = nodes > 1 ? std::min(steps, 2 * nodes) : 0;
      } else if (coll == collective::reduce_scatter || coll == collective::all_gather) {
        steps = p - 1;
        inter_steps = nodes - 1;
      }
      algbw = bus * p / steps;
      if (coll == collective::broadcast || coll == collective::reduce) {
        // A pipelined chain: the data streams through; one hop's latency to fill it.
        latency_us += nodes == 1 ? intra_hop[ai][pi] : k::net_hop_us[ai][pi];
      } else {
        double intra = intra_hop[ai][pi];
        if (nodes > 1)
          intra = std::max(intra, k::net_overhead_us * (pr == nccl_protocol::simple ? 3 : 1));
        latency_us += (steps - inter_steps) * intra + inter_steps * k::net_hop_us[ai][pi];
        if (pr == nccl_protocol::simple && nodes > 1 && coll == collective::all_reduce &&
            bytes / p >= k::ring_plateau_bytes_per_rank)
          latency_us *= k::ring_plateau;
      }
      break;
    }
    case nccl_algorithm::tree: {
      bus *= 0.92;
      if (pr == nccl_protocol::ll) bus /= 3.8;
      if (pr == nccl_protocol::ll128) bus *= nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0;
      algbw = bus / 2;
      const int log_size = k::log2_floor(bytes / 64);
      if (log_size < 23) algbw *= k::tree_correction[pi][log_size];
      latency_us += 2 * ((ppn - 1) * intra_hop[ai][pi] +
                         k::log2_floor(static_cast<double>(nodes)) * k::net_hop_us[ai][pi]);
      break;
    }
    case nccl_algorithm::nvls: {
      if (nodes > 1) bus = std::min(c.intra().bandwidth, nodes <= 2 ? link_bw : link_bw / 2);
      algbw = bus * 5.0 / 6.0;
      latency_us = k::nvlink_hop_us[ai][pi];
      if (nodes > 1)
        latency_us += 2 * k::log2_floor(static_cast<double>(nodes)) * k::nvls_tree_net_hop_us;
      break;
    }
  }
  return latency_us * 1e-6 + bytes / algbw;
}

/// NCCL's cheapest (algorithm, protocol) for q over c, as NCCL's tuner picks it, and its time.
/// A tie goes to the earlier pair in the order ring, tree, NVLS x LL, LL128, Simple.
[[nodiscard]] inline nccl_estimate nccl_price(const plan_request& q, const topology::cluster& c,
                                              const nccl_features& f = {}) {
  nccl_estimate best;
  for (const auto a : {nccl_algorithm::ring, nccl_algorithm::tree, nccl_algorithm::nvls}) {
    for (const auto pr : {nccl_protocol::ll, nccl_protocol::ll128, nccl_protocol::simple}) {
      const double t = nccl_time(q, c, f, a, pr);
      if (t < best.seconds) best = {t, a, pr};
    }
  }
  return best;
}

} // namespace weft::cost_model
