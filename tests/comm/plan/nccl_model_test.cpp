// The model of NCCL's own collectives: hand-worked points from NCCL's tuning figures, the
// (algorithm, protocol) NCCL would pick, and what NCCL does not run.
#include <weft/comm/plan/nccl_model.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using namespace weft;
using cost_model::nccl_algorithm;
using cost_model::nccl_features;
using cost_model::nccl_price;
using cost_model::nccl_protocol;
using cost_model::nccl_time;
namespace topo = weft::topology;

constexpr double us = 1e-6;
constexpr double gib = 1024.0 * 1024.0 * 1024.0;
constexpr double nvlink_bw = 450e9;
constexpr double ib_bw = 50e9;

topo::cluster nodes_of_8(int nodes, topo::link_kind intra = topo::link_kind::nvlink) {
  return topo::cluster(std::vector<int>(static_cast<std::size_t>(nodes), 8),
                       {intra, intra == topo::link_kind::nvlink ? nvlink_bw : 25e9, 2e-6},
                       {topo::link_kind::infiniband, ib_bw, 5e-6}, 8);
}

plan_request request(collective c, int nodes, int per_node, double bytes, std::size_t es = 4) {
  plan_request q;
  q.coll = c;
  q.size = nodes * per_node;
  q.count = static_cast<std::size_t>(bytes) / es;
  q.element_size = es;
  for (int n = 0; n < nodes; ++n)
    for (int j = 0; j < per_node; ++j)
      q.node_of.push_back(n);
  return q;
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b)); }

TEST(nccl_model, ring_simple_all_reduce_on_one_node_is_latency_plus_bus_bytes) {
  const auto q = request(collective::all_reduce, 1, 8, gib);
  // baseLat ring Simple 8.4 us, 2(p-1) = 14 NVLink hops of 3.4 us; 2(p-1)/p of the bytes.
  const double hand = (8.4 + 14 * 3.4) * us + 2.0 * 7 / 8 * gib / nvlink_bw;
  EXPECT_TRUE(
      near(nccl_time(q, nodes_of_8(1), {}, nccl_algorithm::ring, nccl_protocol::simple), hand));
  // LL128: 14 us + 14 x 1.9 us, at 92% of the bus bandwidth.
  const double ll128 = (14.0 + 14 * 1.9) * us + 2.0 * 7 / 8 * gib / (0.92 * nvlink_bw);
  EXPECT_TRUE(
      near(nccl_time(q, nodes_of_8(1), {}, nccl_algorithm::ring, nccl_protocol::ll128), ll128));
  // At 1 GiB Simple wins over LL128, LL and the tree (half the bus bandwidth x 0.92).
  const auto e = nccl_price(q, nodes_of_8(1));
  EXPECT_EQ(e.algorithm, nccl_algorithm::ring);
  EXPECT_EQ(e.protocol, nccl_protocol::simple);
  EXPECT_TRUE(near(e.seconds, hand));
}

TEST(nccl_model, four_bytes_on_one_node_takes_ring_ll) {
  const auto q = request(collective::all_reduce, 1, 8, 4);
  // ring LL: 6.6 + 14 x 0.6 us; tree LL: 6.8 + 2 x 7 x 0.6 us; the bytes add next to nothing.
  const double ring_ll = (6.6 + 14 * 0.6) * us + 4 * 14.0 / 8 / (nvlink_bw / 4);
  const auto e = nccl_price(q, nodes_of_8(1));
  EXPECT_EQ(e.algorithm, nccl_algorithm::ring);
  EXPECT_EQ(e.protocol, nccl_protocol::ll);
  EXPECT_TRUE(near(e.seconds, ring_ll));
  const double tree_ll = nccl_time(q, nodes_of_8(1), {}, nccl_algorithm::tree, nccl_protocol::ll);
  EXPECT_NEAR(tree_ll, (6.8 + 2 * 7 * 0.6) * us, 1e-9);
}

TEST(nccl_model, across_nodes_the_nics_bound_the_ring_and_the_plateau_applies) {
  const auto q = request(collective::all_reduce, 2, 8, gib);
  // min(NVLink 450, 8 NICs x 50) = 400 GB/s; 30 steps, 4 of them over the network (14 us),
  // the other 26 NVLink hops of 3.4 us; x 1.4 from 2 KiB per rank.
  const double bw = 400e9;
  const double hand = (8.4 + 26 * 3.4 + 4 * 14.0) * 1.4 * us + 2.0 * 15 / 16 * gib / bw;
  EXPECT_TRUE(
      near(nccl_time(q, nodes_of_8(2), {}, nccl_algorithm::ring, nccl_protocol::simple), hand));
  // One rank per node: the node's NICs serve one GPU, not eight, and all 6 steps cross the
  // network.
  const auto one = request(collective::all_reduce, 4, 1, gib);
  const double t1 = nccl_time(one, nodes_of_8(4), {}, nccl_algorithm::ring, nccl_protocol::simple);
  EXPECT_NEAR(t1 - (8.4 + 6 * 14.0) * 1.4 * us, 2.0 * 3 / 4 * gib / ib_bw, 1e-9);
}

TEST(nccl_model, nvls_only_where_the_hardware_has_it) {
  const auto q = request(collective::all_reduce, 1, 8, gib);
  const auto c = nodes_of_8(1);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(nccl_time(q, c, {}, nccl_algorithm::nvls, nccl_protocol::simple), inf);
  const nccl_features h100{.nvls = true, .ll128 = true};
  const double nvls = 23 * us + gib / (nvlink_bw * 5 / 6);
  EXPECT_TRUE(near(nccl_time(q, c, h100, nccl_algorithm::nvls, nccl_protocol::simple), nvls));
  EXPECT_EQ(nccl_time(q, c, h100, nccl_algorithm::nvls, nccl_protocol::ll), inf);
  const auto e = nccl_price(q, c, h100);
  EXPECT_EQ(e.algorithm, nccl_algorithm::nvls);
  EXPECT_TRUE(near(e.seconds, nvls));
  // No NVLink, no NVLS and no LL128.
  const auto pcie = nodes_of_8(1, topo::link_kind::pcie);
  EXPECT_EQ(nccl_time(q, pcie, h100, nccl_algorithm::nvls, nccl_protocol::simple), inf);
  EXPECT_EQ(nccl_time(q, pcie, h100, nccl_algorithm::ring, nccl_protocol::ll128), inf);
  EXPECT_EQ(
      nccl_time(q, c, {.nvls = false, .ll128 = false}, nccl_algorithm::ring, nccl_protocol::ll128),
      inf);
}

TEST(nccl_model, gathered_collectives_count_the_whole_buffer) {
  // all_gather of 1 MiB per rank on 8 ranks: NCCL counts 8 MiB, (p-1)/p of it per link.
  const auto q = request(collective::all_gather, 1, 8, 1 << 20);
  EXPECT_EQ(cost_model::nccl_bytes(q), 8.0 * (1 << 20));
  const double hand = (8.4 + 7 * 3.4) * us + 7.0 / 8 * 8 * (1 << 20) / nvlink_bw;
  EXPECT_TRUE(
      near(nccl_time(q, nodes_of_8(1), {}, nccl_algorithm::ring, nccl_protocol::simple), hand));
  EXPECT_EQ(nccl_time(q, nodes_of_8(1), {}, nccl_algorithm::tree, nccl_protocol::simple),
            std::numeric_limits<double>::infinity());
}

TEST(nccl_model, trivial_and_bad_requests) {
  auto q = request(collective::all_reduce, 1, 1, 1024);
  EXPECT_EQ(nccl_price(q, nodes_of_8(1)).seconds, 0.0);
  q = request(collective::all_reduce, 1, 8, 0);
  EXPECT_EQ(nccl_price(q, nodes_of_8(1)).seconds, 0.0);
  q.size = 0;
  EXPECT_THAT([&] { (void)nccl_price(q, nodes_of_8(1)); },
              ::testing::ThrowsMessage<error>(::testing::HasSubstr("a group of 0 ranks")));
}

} // namespace
