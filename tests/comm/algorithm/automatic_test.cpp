#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/plan/cost_model.hpp>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/plan_checks.hpp"

namespace {

using namespace weft::test::plan_testing;
using weft::algo::candidate;
using weft::algo::candidates;
using weft::algo::choose;
namespace topo = weft::topology;

static_assert(weft::algo::plan_generator<weft::algo::automatic>);

std::vector<int> two_nodes_of_8() {
  std::vector<int> v(16, 0);
  for (std::size_t r = 8; r < 16; ++r)
    v[r] = 1;
  return v;
}

bool eligible(const candidate& a, const plan_request& q, bool peer_access) {
  std::set<int> nodes(q.node_of.begin(), q.node_of.end());
  const bool flat_loads_across_nodes = a.needs_peer_access && !a.needs_nodes && nodes.size() > 1;
  return a.serves(q.coll) && (peer_access || !a.needs_peer_access) &&
         (nodes.size() > 1 || !a.needs_nodes) && !flat_loads_across_nodes;
}

double price_of(const candidate& a, const plan_request& q, const topo::cluster& c,
                const std::vector<int>& dev) {
  return weft::cost_model::price(weft::cost_model::plans_of(a.make_plan, q), c, dev,
                                 q.element_size);
}

// The chosen candidate is eligible and no eligible candidate is priced lower.
void expect_cheapest(const plan_request& q, const topo::cluster& c, const std::vector<int>& dev,
                     bool peer_access) {
  const candidate& got = choose(q, c, dev, peer_access);
  EXPECT_TRUE(eligible(got, q, peer_access)) << got.name;
  const double mine = price_of(got, q, c, dev);
  for (const candidate& a : candidates()) {
    if (!eligible(a, q, peer_access)) continue;
    EXPECT_LE(mine, price_of(a, q, c, dev)) << got.name << " chosen over " << a.name << " for "
                                            << weft::name_of(q.coll) << " count " << q.count;
  }
}

TEST(automatic, table) {
  std::set<std::string_view> names;
  for (const candidate& a : candidates())
    names.insert(a.name);
  EXPECT_EQ(names, (std::set<std::string_view>{
                       "direct", "ring", "tree", "halving_doubling", "recursive_doubling",
                       "pairwise", "hierarchical<ring, ring>", "hierarchical<direct, ring>",
                       "hierarchical<ring, tree>"}));
  for (const candidate& a : candidates()) {
    EXPECT_EQ(a.needs_peer_access, a.name.find("direct") != std::string_view::npos) << a.name;
    EXPECT_EQ(a.needs_nodes, a.name.starts_with("hierarchical")) << a.name;
  }
}

TEST(automatic, tiny_all_reduce_on_shared_memory) {
  const auto c = topo::host(4);
  const plan_request q{collective::all_reduce, 4, 0, 1, 0, {}, 4};
  // One element: recursive_doubling takes log2 4 = 2 latencies, direct's one-shot three
  // (sync, load, sync), the others at least 2 log2 4.
  EXPECT_EQ(choose(q, c, {}, true).name, "recursive_doubling");
  const candidate& without = choose(q, c, {}, false);
  EXPECT_EQ(without.name, "recursive_doubling");
  EXPECT_FALSE(without.needs_peer_access);
  expect_cheapest(q, c, {}, true);
  expect_cheapest(q, c, {}, false);
}

TEST(automatic, large_all_reduce_across_nodes_is_hierarchical) {
  // 2 DGX H100: a flat ring sends 2(p-1)/p of 256 MiB over the one InfiniBand hop of its
  // ring; hierarchical sends 1/8 of it per leader, over 8 NICs.
  const auto c = topo::dgx_h100(2);
  const plan_request q{collective::all_reduce, 16, 0, std::size_t{1} << 26, 0, two_nodes_of_8(), 4};
  for (bool peer : {false, true}) {
    const candidate& got = choose(q, c, {}, peer);
    EXPECT_TRUE(got.name.starts_with("hierarchical<")) << got.name;
    expect_cheapest(q, c, {}, peer);
  }
  // Without node_of the group looks like one node: no hierarchical candidate.
  plan_request flat = q;
  flat.node_of.clear();
  EXPECT_FALSE(choose(flat, c, {}, false).needs_nodes);
}

TEST(automatic, every_rank_chooses_the_same) {
  const auto c = topo::parse("2x4,shm=20GB/s:1us,net=2GB/s:20us");
  const std::vector<int> node_of = {0, 0, 0, 0, 1, 1, 1, 1};
  for (collective coll :
       {collective::all_reduce, collective::broadcast, collective::reduce_scatter}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
      const candidate* first = nullptr;
      for (int r = 0; r < 8; ++r) {
        const candidate& got = choose({coll, 8, r, n, 3, node_of, 4}, c, {}, false);
        if (first == nullptr) first = &got;
        EXPECT_EQ(&got, first) << r;
      }
    }
  }
}

TEST(automatic, the_choice_is_the_cheapest) {
  struct scene {
    topo::cluster c;
    std::vector<int> node_of;
    std::vector<int> device_of;
  };
  const std::vector<scene> scenes = {
      {topo::host(5), {}, {}},
      {topo::parse("2x4,shm=20GB/s:1us,net=2GB/s:20us"), {0, 0, 0, 0, 1, 1, 1, 1}, {}},
      {topo::parse("3+5,nvlink=300GB/s,ib=3us"), {0, 0, 0, 1, 1, 1, 1, 1}, {}},
      // Ranks placed round-robin over two nodes: node_of and device_of agree.
      {topo::parse("2x3,nics=2"), {0, 1, 0, 1, 0, 1}, {0, 3, 1, 4, 2, 5}},
      {topo::dgx_h100(2), two_nodes_of_8(), {}},
  };
  for (const scene& s : scenes) {
    const int p = s.node_of.empty() ? s.c.size() : static_cast<int>(s.node_of.size());
    for (collective coll : {collective::all_reduce, collective::reduce_scatter,
                            collective::all_gather, collective::broadcast, collective::reduce}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{10'000},
                            std::size_t{1} << 20}) {
        for (bool peer : {false, true}) {
          SCOPED_TRACE(s.c.to_string() + " " + std::string(weft::name_of(coll)) + " count " +
                       std::to_string(n));
          expect_cheapest({coll, p, 0, n, p - 1, s.node_of, 4}, s.c, s.device_of, peer);
        }
      }
    }
  }
}

TEST(automatic, choices_are_remembered_per_cluster) {
  // The same shape with two link sets: where latency is dear, fewer rounds win
  // (halving_doubling); where bandwidth is, fewer bytes (ring: on 6 ranks halving_doubling
  // first folds 2 ranks' whole vectors onto their partners). Each must get its own answer, not the
  // other's from the cache.
  const auto cheap_latency = topo::parse("6,shm=1GB/s:1ns");
  const auto dear_latency = topo::parse("6,shm=1TB/s:1ms");
  bool differed = false;
  for (std::size_t n : {std::size_t{1000}, std::size_t{100'000}, std::size_t{1} << 20}) {
    const plan_request q{collective::all_reduce, 6, 0, n, 0, {}, 4};
    for (int pass = 0; pass < 2; ++pass) {
      expect_cheapest(q, cheap_latency, {}, false);
      expect_cheapest(q, dear_latency, {}, false);
    }
    differed =
        differed || &choose(q, cheap_latency, {}, false) != &choose(q, dear_latency, {}, false);
  }
  EXPECT_TRUE(differed);
}

TEST(automatic, choose_is_thread_safe) {
  const auto c = topo::parse("2x4,shm=20GB/s:1us,net=2GB/s:20us");
  const std::vector<int> node_of = {0, 0, 0, 0, 1, 1, 1, 1};
  std::vector<const candidate*> got(4 * 50, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const plan_request q{
            collective::all_reduce, 8, t, static_cast<std::size_t>(i) * 997, 0, node_of, 4};
        got[static_cast<std::size_t>(t * 50 + i)] = &choose(q, c, {}, false);
      }
    });
  }
  for (auto& th : threads)
    th.join();
  for (int i = 0; i < 50; ++i) {
    for (int t = 1; t < 4; ++t) {
      EXPECT_EQ(got[static_cast<std::size_t>(t * 50 + i)], got[static_cast<std::size_t>(i)]) << i;
    }
  }
}

TEST(automatic, errors) {
  const auto c = topo::host(4);
  EXPECT_THROW(choose({collective::all_reduce, 4, 4, 10, 0, {}, 4}, c, {}, false), weft::error);
  EXPECT_THROW(choose({collective::broadcast, 4, 0, 10, 7, {}, 4}, c, {}, false), weft::error);
  // all_to_all: pairwise without peer access; with it, direct competes too.
  EXPECT_EQ(choose({collective::all_to_all, 4, 0, 10, 0, {}, 4}, c, {}, false).name, "pairwise");
  const auto a2a = choose({collective::all_to_all, 4, 0, 10, 0, {}, 4}, c, {}, true).name;
  EXPECT_TRUE(a2a == "direct" || a2a == "pairwise") << a2a;
  // More ranks than the cluster has devices, and no placement.
  EXPECT_THROW(choose({collective::all_reduce, 5, 0, 10, 0, {}, 4}, c, {}, false), weft::error);
}

TEST(automatic, as_a_policy_its_plans_are_correct) {
  for (int p : {1, 2, 3, 5, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(p + 3), std::size_t{5000}}) {
      check_plans<weft::algo::automatic, int>(collective::all_reduce, p, n);
      check_plans<weft::algo::automatic, float>(collective::reduce_scatter, p, n, 0,
                                                pattern::random);
      check_plans<weft::algo::automatic, int>(collective::broadcast, p, n, p - 1);
    }
  }
  check_plans<weft::algo::automatic, int>(collective::all_reduce, 8, 100'000, 0, pattern::exact,
                                          {0, 0, 0, 1, 1, 1, 1, 1});
  check_plans<weft::algo::automatic, double>(collective::reduce, 6, 777, 4, pattern::random,
                                             {0, 1, 0, 1, 0, 1});
  // Without a topology it never picks a peer-access plan.
  const auto pl = weft::algo::automatic::make_plan({collective::all_reduce, 4, 0, 1, 0, {}, 4});
  EXPECT_FALSE(pl.peer_access());
  EXPECT_FALSE(
      weft::algo::automatic::make_plan({collective::all_to_all, 4, 0, 1, 0, {}, 4}).peer_access());
  EXPECT_THROW(weft::algo::automatic::make_plan({collective::all_reduce, 4, 0, 1, 0, {0, 0, 1}, 4}),
               weft::error);
}

// Peers on other nodes cannot be read directly, even where the transport could (the local
// transport emulates nodes in one process): across nodes, direct is never chosen.
TEST(automatic, never_loads_across_nodes) {
  const auto c = topo::parse("2x4,intra=shm:8GB/s:2us,inter=net:0.5GB/s:20us");
  std::vector<int> node_of{0, 0, 0, 0, 1, 1, 1, 1};
  for (std::size_t count : {std::size_t{1}, std::size_t{1} << 18, std::size_t{1} << 22}) {
    const plan_request q{collective::all_reduce, 8, 0, count, 0, node_of, 4};
    const candidate& got = choose(q, c, {}, true);
    EXPECT_FALSE(got.needs_peer_access && !got.needs_nodes) << got.name << " count " << count;
    expect_cheapest(q, c, {}, true);
  }
}

} // namespace
