#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/plan/cost_model.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace {

using weft::buffer;
using weft::collective;
using weft::plan;
using weft::plan_request;
using weft::cost_model::price;
using weft::cost_model::simulate;
namespace topo = weft::topology;

// Round figures, so that every expectation below is plain arithmetic.
constexpr double alpha = 1e-6;   // intra latency
constexpr double beta = 10e9;    // intra bandwidth
constexpr double alpha_x = 1e-5; // inter latency
constexpr double beta_x = 1e9;   // inter bandwidth per NIC
constexpr double gamma_r = 5e9;  // reduce bandwidth

topo::cluster make(std::vector<int> nodes, int nics = 1) {
  return topo::cluster(std::move(nodes), topo::link{topo::link_kind::shm, beta, alpha},
                       topo::link{topo::link_kind::ethernet, beta_x, alpha_x}, nics, gamma_r);
}

// Plans for p ranks, built by hand: element_size 1 below, so counts are bytes.
std::vector<plan> blank(int p) {
  std::vector<plan> v;
  for (int r = 0; r < p; ++r)
    v.emplace_back(plan_request{collective::all_reduce, p, r, 0, 0, {}, 1});
  return v;
}

constexpr double rel = 1e-12;

TEST(cost_model, one_message_costs_alpha_plus_bytes_over_beta) {
  auto pl = blank(2);
  pl[0].send(1, buffer::input, 0, 1000);
  pl[1].recv(0, buffer::output, 0, 1000);
  const auto b = simulate(pl, make({2}), {}, 1);
  EXPECT_NEAR(b.total, alpha + 1000 / beta, rel);
  EXPECT_NEAR(b.finish[0], alpha + 1000 / beta, rel); // the sender waits until it is received
  EXPECT_EQ(b.intra_bytes, 1000);
  EXPECT_EQ(b.inter_bytes, 0);
  // Element size scales the bytes, not the latency.
  EXPECT_NEAR(price(pl, make({2}), {}, 4), alpha + 4000 / beta, rel);
}

TEST(cost_model, a_message_across_nodes_costs_the_inter_link) {
  auto pl = blank(2);
  pl[0].send(1, buffer::input, 0, 1'000'000);
  pl[1].recv(0, buffer::output, 0, 1'000'000);
  const auto b = simulate(pl, make({1, 1}), {}, 1);
  EXPECT_NEAR(b.total, alpha_x + 1e6 / beta_x, rel);
  EXPECT_EQ(b.inter_bytes, 1e6);
  // The same ranks placed on one node (devices 0 and 1 of a 2x2 cluster) use the intra link,
  // placed on devices 0 and 3 the inter link.
  EXPECT_NEAR(price(pl, make({2, 2}), {0, 1}, 1), alpha + 1e6 / beta, rel);
  EXPECT_NEAR(price(pl, make({2, 2}), {0, 3}, 1), alpha_x + 1e6 / beta_x, rel);
}

TEST(cost_model, ranks_of_a_node_share_its_nics) {
  // Ranks 0, 1 on node 0 each send 1 MB to node 1 in the same round.
  auto pl = blank(4);
  pl[0].send(2, buffer::input, 0, 1'000'000);
  pl[1].send(3, buffer::input, 0, 1'000'000);
  pl[2].recv(0, buffer::output, 0, 1'000'000);
  pl[3].recv(1, buffer::output, 0, 1'000'000);
  EXPECT_NEAR(price(pl, make({2, 2}, 1), {}, 1), alpha_x + 1e6 / (beta_x / 2), rel);
  // Two NICs: each transfer has one to itself; more NICs do not make one faster.
  EXPECT_NEAR(price(pl, make({2, 2}, 2), {}, 1), alpha_x + 1e6 / beta_x, rel);
  EXPECT_NEAR(price(pl, make({2, 2}, 8), {}, 1), alpha_x + 1e6 / beta_x, rel);
  // Apart in time they do not share: rank 1 first copies 10 MB (2 ms), and by then rank 0's
  // transfer (1 ms) has left the NIC.
  auto apart = blank(4);
  apart[0].send(2, buffer::input, 0, 1'000'000);
  apart[2].recv(0, buffer::output, 0, 1'000'000);
  apart[1].copy(buffer::input, 0, buffer::output, 0, 10'000'000);
  apart[1].next_round();
  apart[1].send(3, buffer::input, 0, 1'000'000);
  apart[3].recv(1, buffer::output, 0, 1'000'000);
  EXPECT_NEAR(price(apart, make({2, 2}, 1), {}, 1), 1e7 / gamma_r + alpha_x + 1e6 / beta_x, rel);
  // Overlapping in time they do: rank 1 copies 1 MB (0.2 ms) first, then queues behind rank
  // 0's transfer, which holds the NIC until 1 ms; its own ends 1 ms later.
  auto overlap = blank(4);
  overlap[0].send(2, buffer::input, 0, 1'000'000);
  overlap[2].recv(0, buffer::output, 0, 1'000'000);
  overlap[1].copy(buffer::input, 0, buffer::output, 0, 1'000'000);
  overlap[1].next_round();
  overlap[1].send(3, buffer::input, 0, 1'000'000);
  overlap[3].recv(1, buffer::output, 0, 1'000'000);
  EXPECT_NEAR(price(overlap, make({2, 2}, 1), {}, 1), 2e6 / beta_x + alpha_x, rel);
}

// Ranks 2 and 3 (node 1) each load 1 MB from rank 0 (node 0) at once: the reads leave node 0
// through its one NIC, one after the other, as messages would.
TEST(cost_model, loads_across_nodes_queue_on_the_nics) {
  auto pl = blank(4);
  for (int r : {0, 2, 3}) {
    plan& x = pl[static_cast<std::size_t>(r)];
    const int g = x.add_group({0, 2, 3});
    x.sync(g);
    if (r != 0) x.load(0, buffer::input, 0, buffer::output, 0, 1'000'000);
    x.sync(g);
  }
  const double sync_latency = alpha_x; // the group spans both nodes
  EXPECT_NEAR(price(pl, make({2, 2}, 1), {}, 1),
              sync_latency + 2e6 / beta_x + alpha_x + sync_latency, rel);
  // Two NICs: both reads at once.
  EXPECT_NEAR(price(pl, make({2, 2}, 2), {}, 1),
              sync_latency + 1e6 / beta_x + alpha_x + sync_latency, rel);
}

TEST(cost_model, sends_of_one_rank_in_a_round_share_its_link) {
  auto pl = blank(3);
  pl[0].send(1, buffer::input, 0, 1000);
  pl[0].send(2, buffer::input, 0, 3000);
  pl[1].recv(0, buffer::output, 0, 1000);
  pl[2].recv(0, buffer::output, 0, 3000);
  const auto b = simulate(pl, make({3}), {}, 1);
  EXPECT_NEAR(b.finish[1], alpha + 1000 / beta, rel);
  EXPECT_NEAR(b.finish[2], 1000 / beta + alpha + 3000 / beta, rel);
  EXPECT_NEAR(b.total, b.finish[2], rel);
}

TEST(cost_model, a_transfer_waits_for_the_receiver) {
  // Rank 1 copies 1 MB (200 us at 5 GB/s) before it reaches the recv; the send was posted at 0.
  auto pl = blank(2);
  pl[0].send(1, buffer::input, 0, 1000);
  pl[1].copy(buffer::input, 0, buffer::scratch, 0, 1'000'000);
  pl[1].recv(0, buffer::output, 0, 1000);
  EXPECT_NEAR(price(pl, make({2}), {}, 1), 1e6 / gamma_r + alpha + 1000 / beta, rel);
  // And for the sender: a recv in a later round of the receiver starts when the round does.
  auto late = blank(2);
  late[0].copy(buffer::input, 0, buffer::scratch, 0, 1'000'000);
  late[0].next_round();
  late[0].send(1, buffer::input, 0, 1000);
  late[1].recv(0, buffer::output, 0, 1000);
  EXPECT_NEAR(price(late, make({2}), {}, 1), 1e6 / gamma_r + alpha + 1000 / beta, rel);
}

TEST(cost_model, local_work_costs_bytes_over_reduce_bandwidth) {
  auto pl = blank(2);
  pl[0].send(1, buffer::input, 0, 1000);
  pl[1].recv_reduce(0, buffer::input, 0, buffer::output, 0, 1000);
  pl[1].reduce(buffer::input, 0, buffer::output, 0, 2000);
  const auto b = simulate(pl, make({2}), {}, 1);
  EXPECT_NEAR(b.finish[1], alpha + 1000 / beta + 1000 / gamma_r + 2000 / gamma_r, rel);
  EXPECT_NEAR(b.finish[0], alpha + 1000 / beta, rel);
}

TEST(cost_model, loads_and_syncs) {
  auto pl = blank(3);
  for (int r = 0; r < 3; ++r) {
    auto& x = pl[static_cast<std::size_t>(r)];
    const int all = x.add_group({0, 1, 2});
    if (r == 2) x.copy(buffer::input, 0, buffer::scratch, 0, 5000); // arrives late at the sync
    x.sync(all);
    if (r == 0) x.load_reduce(all, buffer::input, 0, buffer::output, 0, 1000);
    if (r == 1) x.load(2, buffer::input, 0, buffer::output, 0, 1000);
    x.sync(all);
  }
  const double start = 5000 / gamma_r + alpha;
  const double reduce = alpha + 3 * 1000 / beta + 2 * 1000 / gamma_r;
  const double load = alpha + 1000 / beta;
  const auto b = simulate(pl, make({3}), {}, 1);
  EXPECT_NEAR(b.total, start + std::max(reduce, load) + alpha, rel);
  EXPECT_NEAR(b.finish[1], b.total, rel);
  EXPECT_EQ(b.intra_bytes, 4000);
}

TEST(cost_model, rejects_broken_plans) {
  auto dead = blank(2);
  dead[0].recv(1, buffer::output, 0, 10);
  dead[1].recv(0, buffer::output, 0, 10);
  EXPECT_THROW(price(dead, make({2}), {}, 4), weft::error);
  auto lost = blank(2);
  lost[0].send(1, buffer::input, 0, 10);
  EXPECT_THROW(price(lost, make({2}), {}, 4), weft::error);
  auto fine = blank(2);
  EXPECT_THROW(price(fine, make({1}), {}, 4), weft::error);     // 2 ranks on 1 device
  EXPECT_THROW(price(fine, make({2}), {0, 2}, 4), weft::error); // device out of range
  EXPECT_THROW(price(fine, make({2}), {0}, 4), weft::error);    // one device for 2 ranks
  EXPECT_EQ(price(fine, make({2}), {}, 4), 0.0);
  EXPECT_EQ(price({}, make({2}), {}, 4), 0.0);
}

TEST(cost_model, ring_all_reduce_on_two_ranks) {
  // p = 2, n floats: round 0 sends half and reduces the other half, round 1 sends the
  // reduced half: 2 (alpha + n/2 * 4 / beta) + n/2 * 4 / gamma.
  const std::size_t n = 1000;
  const plan_request q{collective::all_reduce, 2, 0, n, 0, {}, 4};
  EXPECT_NEAR(price<weft::algo::ring>(q, make({2})), 2 * (alpha + 2000 / beta) + 2000 / gamma_r,
              rel);
  // Across two nodes every hop is an inter-node one.
  EXPECT_NEAR(price<weft::algo::ring>(q, make({1, 1})),
              2 * (alpha_x + 2000 / beta_x) + 2000 / gamma_r, rel);
}

TEST(cost_model, ring_all_reduce_on_p_ranks) {
  // 2(p-1) rounds of alpha + (n/p) * 4 / beta; p-1 of them also reduce n/p elements. The
  // block is below ring's chunk size, so nothing is pipelined.
  for (int p : {3, 4, 8}) {
    const std::size_t n = 1200 * static_cast<std::size_t>(p);
    const plan_request q{collective::all_reduce, p, 0, n, 0, {}, 4};
    const double blk = 1200.0 * 4;
    EXPECT_NEAR(price<weft::algo::ring>(q, make({p})),
                2 * (p - 1) * (alpha + blk / beta) + (p - 1) * blk / gamma_r, rel)
        << "p=" << p;
  }
}

TEST(cost_model, prices_grow_with_count) {
  const auto c = topo::host(6);
  for (collective coll :
       {collective::all_reduce, collective::all_gather, collective::reduce_scatter}) {
    double last_ring = 0, last_hd = 0, last_direct = 0;
    for (std::size_t n : {0, 1, 5, 6, 100, 1000, 10'000, 100'000, 1'000'000}) {
      const plan_request q{coll, 6, 0, n, 0, {}, 4};
      const double r = price<weft::algo::ring>(q, c);
      const double h = price<weft::algo::halving_doubling>(q, c);
      const double d = price<weft::algo::direct>(q, c);
      EXPECT_GE(r, last_ring) << n;
      EXPECT_GE(h, last_hd) << n;
      EXPECT_GE(d, last_direct) << n;
      last_ring = r, last_hd = h, last_direct = d;
    }
    EXPECT_GT(last_ring, 0);
  }
}

TEST(cost_model, one_shot_wins_small_ring_wins_large) {
  const auto c = topo::host(4); // shm: 10 GB/s, 1 us
  // One float: direct's one-shot is staged: copy into the staging area, sync, load_reduce
  // from 4 ranks: two latencies. The ring's one non-empty block travels 2(p-1) = 6 hops and
  // is reduced on the first p-1 = 3 of them.
  const plan_request tiny{collective::all_reduce, 4, 0, 1, 0, {}, 4};
  const double d = price<weft::algo::direct>(tiny, c);
  const double r = price<weft::algo::ring>(tiny, c);
  EXPECT_NEAR(d, 4 / 10e9 + 2 * 1e-6 + 4 * 4 / 10e9 + 3 * 4 / 10e9, 1e-12);
  EXPECT_NEAR(r, 6 * (1e-6 + 4 / 10e9) + 3 * 4 / 10e9, 1e-12);
  EXPECT_LT(d, r);
  // 64 MiB: ring moves 2(p-1)/p of it per rank; direct reads it all, then 3/4 again.
  const plan_request large{collective::all_reduce, 4, 0, std::size_t{1} << 24, 0, {}, 4};
  EXPECT_LT(price<weft::algo::ring>(large, c), price<weft::algo::direct>(large, c));
}

} // namespace
