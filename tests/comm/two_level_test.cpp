// weft::two_level on the local transport: every collective it offers against the serial
// reference for even, uneven and interleaved nodes, by chunks, in and out of place, from every
// root, with each level's algorithm named; every rank's bits equal; what crosses the
// inter-node communicator; bad construction and bad roots refused.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/comm/two_level.hpp>
#include <weft/topology/topology.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "support/reference.hpp"

namespace {

using namespace weft;

// A layout: the node of each rank. From a topology the nodes are contiguous runs of ranks;
// the interleaved ones give a node's ranks out of world order.
struct layout {
  std::string name;
  std::vector<int> node_of;
  bool from_topology = false; // name is a topology spec: make_two_level splits its world
};

layout from_spec(const std::string& spec) {
  const auto cluster = topology::parse(spec);
  layout l{spec, {}, true};
  for (int r = 0; r < cluster.size(); ++r)
    l.node_of.push_back(cluster.node_of(r));
  return l;
}

// Even and uneven nodes, one node, one rank per node, and interleaved nodes (even; uneven with
// the smallest node last; uneven with the biggest node's ranks first and last).
std::vector<layout> layouts() {
  std::vector<layout> ls;
  for (const char* spec : {"2x2", "2x3", "3+5", "1+3", "4+2+3", "4x1", "4"})
    ls.push_back(from_spec(spec));
  ls.push_back({"interleaved 0101", {0, 1, 0, 1}});
  ls.push_back({"interleaved 10120120", {1, 0, 1, 2, 0, 1, 2, 0}});
  ls.push_back({"interleaved 00101", {0, 0, 1, 0, 1}});
  return ls;
}

// f(two_level, rank) on each rank of the layout: from make_two_level on a topology's world, or
// split by hand as make_two_level splits one (the local transport's nodes are contiguous).
template <class F>
void on_two_level(const layout& l, std::size_t chunk_bytes, F&& f) {
  const int p = static_cast<int>(l.node_of.size());
  if (l.from_topology) {
    local::run(topology::parse(l.name), [&](local::communicator& world) {
      auto tl = make_two_level(world, {.chunk_bytes = chunk_bytes});
      f(tl, world.rank());
    });
    return;
  }
  local::run(topology::parse(std::to_string(p)), [&](local::communicator& world) {
    const int rank = world.rank();
    const int color = detail::node_color(l.node_of, rank);
    auto intra = world.split(color, rank);
    auto inter = world.split(intra.rank(), color);
    two_level<local::communicator> tl(std::move(intra), std::move(inter), l.node_of, rank,
                                      {.chunk_bytes = chunk_bytes});
    f(tl, rank);
  });
}

// got[r] against want[r] for every rank: exact, or within the float tolerance.
template <class T>
void expect_outputs(const std::vector<std::vector<T>>& got, const std::vector<std::vector<T>>& want,
                    test::pattern pat, const std::string& what) {
  const int p = static_cast<int>(want.size());
  for (int r = 0; r < p; ++r) {
    const auto& g = got[static_cast<std::size_t>(r)];
    const auto& w = want[static_cast<std::size_t>(r)];
    ASSERT_EQ(g.size(), w.size()) << what << ", rank " << r;
    for (std::size_t i = 0; i < w.size(); ++i) {
      if (pat == test::pattern::exact) {
        ASSERT_EQ(g[i], w[i]) << what << ", rank " << r << ", element " << i;
      } else {
        ASSERT_NEAR(static_cast<double>(g[i]), static_cast<double>(w[i]), 1e-5 * p)
            << what << ", element " << i;
      }
    }
  }
}

template <class T, class Op>
std::vector<std::vector<T>> inputs(int p, std::size_t count, test::pattern pat) {
  std::vector<std::vector<T>> in(static_cast<std::size_t>(p), std::vector<T>(count));
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < count; ++i)
      in[static_cast<std::size_t>(r)][i] = test::input_value<T, Op>(r, i, pat);
  }
  return in;
}

std::string describe(const layout& l, std::size_t count, std::size_t chunk_bytes) {
  return l.name + ", " + std::to_string(count) + " elements, chunks of " +
         std::to_string(chunk_bytes) + " B";
}

template <class Algo, class T, class Op>
void check_all_reduce(const layout& l, std::size_t count, std::size_t chunk_bytes, bool in_place,
                      test::pattern pat) {
  const int p = static_cast<int>(l.node_of.size());
  const auto in = inputs<T, Op>(p, count, pat);
  const auto want = test::reference<T, Op>(collective::all_reduce, p, count, 0, in);
  std::vector<std::vector<T>> got(static_cast<std::size_t>(p));
  on_two_level(l, chunk_bytes, [&](auto& tl, int rank) {
    const auto r = static_cast<std::size_t>(rank);
    std::vector<T> out(count);
    if (in_place) {
      out = in[r];
      all_reduce<Algo>(tl, std::span(out), Op{});
    } else {
      all_reduce<Algo>(tl, std::span<const T>(in[r]), std::span(out), Op{});
    }
    got[r] = std::move(out);
  });
  const std::string what =
      describe(l, count, chunk_bytes) + (in_place ? ", in place" : ", out of place");
  // Every rank holds the same bits as rank 0.
  for (int r = 0; r < p; ++r) {
    const auto& g = got[static_cast<std::size_t>(r)];
    ASSERT_EQ(g.size(), count) << what;
    if (count != 0) {
      ASSERT_EQ(std::memcmp(g.data(), got[0].data(), count * sizeof(T)), 0)
          << what << ": rank " << r << " differs";
    }
  }
  expect_outputs(got, want, pat, what);
}

// broadcast (in place: the root's data, -7 elsewhere) or reduce (out of place; in place at the
// root when in_place) from `root`.
template <class Algo, class T, class Op = op::sum>
void check_rooted(collective c, const layout& l, std::size_t count, std::size_t chunk_bytes,
                  int root, bool in_place, test::pattern pat) {
  const int p = static_cast<int>(l.node_of.size());
  const auto in = inputs<T, Op>(p, count, pat);
  const auto want = test::reference<T, Op>(c, p, count, root, in);
  std::vector<std::vector<T>> got(static_cast<std::size_t>(p));
  on_two_level(l, chunk_bytes, [&](auto& tl, int rank) {
    const auto r = static_cast<std::size_t>(rank);
    std::vector<T> out;
    if (c == collective::broadcast) {
      out = rank == root ? in[r] : std::vector<T>(count, T(-7));
      broadcast<Algo>(tl, std::span(out), root);
    } else if (in_place && rank == root) {
      out = in[r];
      reduce<Algo>(tl, std::span(out), std::span(out), root, Op{});
    } else {
      out.assign(rank == root ? count : 0, T(-7));
      reduce<Algo>(tl, std::span<const T>(in[r]), std::span(out), root, Op{});
    }
    got[r] = std::move(out);
  });
  expect_outputs(got, want, pat,
                 std::string(c == collective::broadcast ? "broadcast" : "reduce") + " from rank " +
                     std::to_string(root) + ", " + describe(l, count, chunk_bytes) +
                     (in_place ? ", in place" : ""));
}

// reduce_scatter (in: size() blocks of n) or all_gather (in: n), out of place.
template <class Algo, class T, class Op = op::sum>
void check_scatter_gather(collective c, const layout& l, std::size_t n, std::size_t chunk_bytes,
                          test::pattern pat) {
  const int p = static_cast<int>(l.node_of.size());
  const auto in = inputs<T, Op>(p, test::input_count(c, p, n), pat);
  const auto want = test::reference<T, Op>(c, p, n, 0, in);
  std::vector<std::vector<T>> got(static_cast<std::size_t>(p));
  on_two_level(l, chunk_bytes, [&](auto& tl, int rank) {
    const auto r = static_cast<std::size_t>(rank);
    std::vector<T> out(test::output_count(c, p, n, rank, 0), T(-7));
    if (c == collective::reduce_scatter) {
      reduce_scatter<Algo>(tl, std::span<const T>(in[r]), std::span(out), Op{});
    } else {
      all_gather<Algo>(tl, std::span<const T>(in[r]), std::span(out));
    }
    got[r] = std::move(out);
  });
  expect_outputs(got, want, pat, std::string(name_of(c)) + ", " + describe(l, n, chunk_bytes));
}

TEST(two_level, all_reduce_matches_the_reference_on_every_layout) {
  for (const auto& l : layouts()) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1000}}) {
      // 64-byte chunks: 16 int32 per chunk, so the 1000 elements take 63 chunks (the last short).
      check_all_reduce<algo::levels<>, std::int32_t, op::sum>(l, count, 64, true,
                                                              test::pattern::exact);
      check_all_reduce<algo::levels<>, std::int32_t, op::sum>(l, count, 1 << 20, false,
                                                              test::pattern::exact);
    }
  }
}

TEST(two_level, operators_and_types) {
  for (const auto& spec : {from_spec("2x3"), from_spec("3+5")}) {
    check_all_reduce<algo::levels<>, std::int64_t, op::max>(spec, 777, 256, true,
                                                            test::pattern::exact);
    check_all_reduce<algo::levels<>, std::int32_t, op::prod>(spec, 301, 128, false,
                                                             test::pattern::exact);
    check_all_reduce<algo::levels<>, std::int32_t, op::avg>(spec, 301, 128, true,
                                                            test::pattern::exact);
    check_all_reduce<algo::levels<>, double, op::avg>(spec, 513, 1024, true, test::pattern::exact);
    check_all_reduce<algo::levels<>, float, op::sum>(spec, 4099, 4096, false,
                                                     test::pattern::random);
  }
}

TEST(two_level, each_level_takes_the_named_algorithm) {
  for (const auto& spec : {from_spec("2x4"), from_spec("3+5"), from_spec("4+2+3")}) {
    check_all_reduce<algo::levels<algo::ring, algo::tree>, std::int32_t, op::sum>(
        spec, 997, 200, true, test::pattern::exact);
    check_all_reduce<algo::levels<algo::direct, algo::halving_doubling>, std::int32_t, op::sum>(
        spec, 997, 200, false, test::pattern::exact);
    check_all_reduce<algo::levels<algo::tree, algo::ring>, float, op::sum>(spec, 997, 1 << 16, true,
                                                                           test::pattern::random);
  }
}

TEST(two_level, broadcast_and_reduce_from_every_root_on_every_layout) {
  for (const auto& l : layouts()) {
    const int p = static_cast<int>(l.node_of.size());
    for (int root = 0; root < p; ++root) {
      for (const collective c : {collective::broadcast, collective::reduce}) {
        for (std::size_t count : {std::size_t{0}, std::size_t{5}, std::size_t{1000}}) {
          check_rooted<algo::levels<>, std::int32_t>(c, l, count, 64, root, false,
                                                     test::pattern::exact);
        }
        check_rooted<algo::levels<>, std::int32_t>(c, l, 1000, 1 << 20, root, true,
                                                   test::pattern::exact);
      }
    }
  }
}

TEST(two_level, reduce_operators_types_and_algorithms) {
  for (const auto& l : {from_spec("2x3"), from_spec("3+5"), layouts().back()}) {
    const int last = static_cast<int>(l.node_of.size()) - 1;
    check_rooted<algo::levels<>, std::int64_t, op::max>(collective::reduce, l, 777, 256, last,
                                                        false, test::pattern::exact);
    check_rooted<algo::levels<>, std::int32_t, op::prod>(collective::reduce, l, 301, 128, 1, true,
                                                         test::pattern::exact);
    check_rooted<algo::levels<>, std::int32_t, op::avg>(collective::reduce, l, 301, 128, last, true,
                                                        test::pattern::exact);
    check_rooted<algo::levels<>, double, op::avg>(collective::reduce, l, 513, 1024, 0, false,
                                                  test::pattern::exact);
    check_rooted<algo::levels<>, float, op::sum>(collective::reduce, l, 4099, 4096, last, false,
                                                 test::pattern::random);
    check_rooted<algo::levels<algo::ring, algo::tree>, std::int32_t>(
        collective::reduce, l, 997, 200, last, false, test::pattern::exact);
    check_rooted<algo::levels<algo::direct, algo::ring>, double>(collective::broadcast, l, 997, 200,
                                                                 last, false, test::pattern::exact);
    check_rooted<algo::levels<algo::tree, algo::ring>, float>(
        collective::broadcast, l, 997, 1 << 16, 1, false, test::pattern::random);
  }
}

TEST(two_level, reduce_scatter_and_all_gather_on_every_layout) {
  for (const auto& l : layouts()) {
    for (const collective c : {collective::reduce_scatter, collective::all_gather}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{100}}) {
        // 64-byte chunks: a block of 100 int32 goes across in 7 pieces.
        check_scatter_gather<algo::levels<>, std::int32_t>(c, l, n, 64, test::pattern::exact);
        check_scatter_gather<algo::levels<>, std::int32_t>(c, l, n, 1 << 20, test::pattern::exact);
      }
    }
  }
}

TEST(two_level, reduce_scatter_operators_types_and_algorithms) {
  for (const auto& l : {from_spec("2x3"), from_spec("3+5"), layouts().back()}) {
    check_scatter_gather<algo::levels<>, std::int64_t, op::max>(collective::reduce_scatter, l, 77,
                                                                256, test::pattern::exact);
    check_scatter_gather<algo::levels<>, std::int32_t, op::prod>(collective::reduce_scatter, l, 31,
                                                                 32, test::pattern::exact);
    check_scatter_gather<algo::levels<>, std::int32_t, op::avg>(collective::reduce_scatter, l, 31,
                                                                32, test::pattern::exact);
    check_scatter_gather<algo::levels<>, float, op::sum>(collective::reduce_scatter, l, 409, 1024,
                                                         test::pattern::random);
    check_scatter_gather<algo::levels<algo::ring, algo::tree>, double>(
        collective::reduce_scatter, l, 97, 200, test::pattern::exact);
    check_scatter_gather<algo::levels<algo::direct, algo::ring>, double>(
        collective::all_gather, l, 97, 200, test::pattern::exact);
    check_scatter_gather<algo::levels<algo::ring, algo::tree>, float>(collective::all_gather, l, 97,
                                                                      64, test::pattern::random);
  }
}

// Only the leaders' blocks cross the inter-node communicator: over nodes of 3 and 5 ranks
// (m = 3), local ranks 0-2 all-reduce a third of each chunk across the nodes, ranks 3 and 4
// of the bigger node never use it, and the intra-node calls are m reduces and m broadcasts
// per chunk.
TEST(two_level, only_the_blocks_cross_between_nodes) {
  const auto cluster = topology::parse("3+5");
  const std::size_t count = 3000;
  const std::size_t chunk = 1200; // elements of int32: chunks of 1200, 1200 and 600
  std::mutex m;
  std::vector<std::size_t> inter_elements(8), inter_calls(8), intra_reduces(8), intra_broadcasts(8);
  local::run(cluster, [&](local::communicator& c) {
    traced world(std::move(c), "world");
    auto tl = make_two_level(world, {.chunk_bytes = chunk * sizeof(std::int32_t)});
    EXPECT_EQ(tl.min_ranks_per_node(), 3);
    EXPECT_EQ(tl.nodes(), 2);
    std::vector<std::int32_t> v(count, 1);
    all_reduce(tl, std::span(v));
    for (auto x : v)
      ASSERT_EQ(x, 8);
    const std::lock_guard lock(m);
    const auto r = static_cast<std::size_t>(world.rank());
    for (const auto& o : tl.inter().ops()) {
      EXPECT_EQ(o.kind, collective::all_reduce);
      inter_elements[r] += o.count;
      ++inter_calls[r];
    }
    intra_reduces[r] = tl.intra().count(collective::reduce);
    intra_broadcasts[r] = tl.intra().count(collective::broadcast);
  });
  for (std::size_t r = 0; r < 8; ++r) {
    const std::size_t local = r < 3 ? r : r - 3;
    const bool leader = local < 3;
    EXPECT_EQ(inter_elements[r], leader ? count / 3 : 0) << "rank " << r;
    EXPECT_EQ(inter_calls[r], leader ? 3u : 0u) << "rank " << r;
    EXPECT_EQ(intra_reduces[r], 9u) << "rank " << r;
    EXPECT_EQ(intra_broadcasts[r], 9u) << "rank " << r;
  }
}

// Broadcast and reduce move the same blocks: from the root's node (rank 6 of nodes of 3 and 5
// ranks) each local rank 0-2 broadcasts a third across, or the leaders reduce a third onto it.
TEST(two_level, broadcast_and_reduce_cross_between_nodes_by_blocks) {
  const std::size_t count = 3000;
  const std::size_t chunk = 1200;
  const int root =
      6; // local rank 3 of the 5-rank node: no leader, so reduce hands every block to it
  std::mutex m;
  std::vector<std::size_t> inter_elements(8);
  local::run(topology::parse("3+5"), [&](local::communicator& c) {
    traced world(std::move(c), "world");
    auto tl = make_two_level(world, {.chunk_bytes = chunk * sizeof(std::int32_t)});
    std::vector<std::int32_t> v(count, world.rank() == root ? 5 : 0);
    broadcast(tl, std::span(v), root);
    for (auto x : v)
      ASSERT_EQ(x, 5);
    std::vector<std::int32_t> sum(world.rank() == root ? count : 0);
    reduce(tl, std::span<const std::int32_t>(v), std::span(sum), root);
    for (auto x : sum)
      ASSERT_EQ(x, 40);
    const std::lock_guard lock(m);
    for (const auto& o : tl.inter().ops()) {
      EXPECT_TRUE(o.kind == collective::broadcast || o.kind == collective::reduce);
      inter_elements[static_cast<std::size_t>(world.rank())] += o.count;
    }
  });
  for (std::size_t r = 0; r < 8; ++r) {
    const bool leader = (r < 3 ? r : r - 3) < 3;
    EXPECT_EQ(inter_elements[r], leader ? 2 * count / 3 : 0) << "rank " << r;
  }
}

// reduce_scatter and all_gather carry whole rank blocks across on local rank i mod m: over
// nodes of 3 and 5 ranks (m = 3) local rank 0 carries blocks 0 and 3 of the big node and 0 of
// the small one (3 blocks), local 1 blocks 1, 4 and 1 (3), local 2 blocks 2 and 2 (2); local
// ranks 3 and 4 carry none. Each block crosses once per call.
TEST(two_level, reduce_scatter_and_all_gather_cross_between_nodes_by_rank_blocks) {
  const std::size_t n = 100;
  std::mutex m;
  std::vector<std::size_t> inter_elements(8);
  local::run(topology::parse("3+5"), [&](local::communicator& c) {
    traced world(std::move(c), "world");
    auto tl = make_two_level(world);
    std::vector<std::int32_t> all(8 * n, 1), mine(n);
    reduce_scatter(tl, std::span<const std::int32_t>(all), std::span(mine));
    for (auto x : mine)
      ASSERT_EQ(x, 8);
    all_gather(tl, std::span<const std::int32_t>(mine), std::span(all));
    for (auto x : all)
      ASSERT_EQ(x, 8);
    const std::lock_guard lock(m);
    for (const auto& o : tl.inter().ops())
      inter_elements[static_cast<std::size_t>(world.rank())] += o.count;
  });
  const std::size_t blocks[] = {3, 3, 2, 3, 3, 2, 0, 0}; // by world rank: local ranks 0-2, then 0-4
  for (std::size_t r = 0; r < 8; ++r)
    EXPECT_EQ(inter_elements[r], 2 * blocks[r] * n) << "rank " << r;
}

// On even nodes (2 of 3 ranks; and 2 of 2 interleaved) reduce_scatter and all_gather take one
// call per level: Intra's over the N = 2 blocks of each local index (2n elements per rank),
// Inter's over one block, so each rank sends about n elements between nodes per call.
TEST(two_level, even_nodes_reduce_scatter_and_all_gather_in_one_call_per_level) {
  const std::size_t n = 100;
  for (const auto& l : {from_spec("2x3"), layout{"interleaved 0101", {0, 1, 0, 1}}}) {
    const int p = static_cast<int>(l.node_of.size());
    std::mutex m;
    std::vector<std::vector<traced_op>> intra_ops(static_cast<std::size_t>(p)),
        inter_ops(static_cast<std::size_t>(p));
    local::run(topology::parse(std::to_string(p)), [&](local::communicator& c) {
      traced world(std::move(c), "world");
      const int rank = world.rank();
      const int color = detail::node_color(l.node_of, rank);
      auto intra = world.split(color, rank);
      auto inter = world.split(intra.rank(), color);
      two_level<traced<local::communicator>> tl(std::move(intra), std::move(inter), l.node_of,
                                                rank);
      // rank r's block b holds r + 10 b: the sum over ranks of block b is known in closed form.
      std::vector<std::int32_t> all(static_cast<std::size_t>(p) * n), mine(n);
      for (std::size_t i = 0; i < all.size(); ++i)
        all[i] = rank + 10 * static_cast<std::int32_t>(i / n);
      reduce_scatter(tl, std::span<const std::int32_t>(all), std::span(mine));
      const std::int32_t want = p * (p - 1) / 2 + 10 * p * rank;
      for (auto x : mine)
        ASSERT_EQ(x, want) << l.name << ", rank " << rank;
      all_gather(tl, std::span<const std::int32_t>(mine), std::span(all));
      for (std::size_t i = 0; i < all.size(); ++i) {
        ASSERT_EQ(all[i], p * (p - 1) / 2 + 10 * p * static_cast<std::int32_t>(i / n))
            << l.name << ", element " << i;
      }
      const std::lock_guard lock(m);
      intra_ops[static_cast<std::size_t>(rank)] = tl.intra().ops();
      inter_ops[static_cast<std::size_t>(rank)] = tl.inter().ops();
    });
    for (std::size_t r = 0; r < intra_ops.size(); ++r) {
      const auto& a = intra_ops[r];
      const auto& b = inter_ops[r];
      ASSERT_EQ(a.size(), 2u) << l.name << ", rank " << r;
      ASSERT_EQ(b.size(), 2u) << l.name << ", rank " << r;
      EXPECT_EQ(a[0].kind, collective::reduce_scatter);
      EXPECT_EQ(a[0].count, 2 * n);
      EXPECT_EQ(b[0].kind, collective::reduce_scatter);
      EXPECT_EQ(b[0].count, n);
      EXPECT_EQ(b[1].kind, collective::all_gather);
      EXPECT_EQ(b[1].count, n);
      EXPECT_EQ(a[1].kind, collective::all_gather);
      EXPECT_EQ(a[1].count, 2 * n);
    }
  }
}

// Each rank's calls on each level, as (kind, element count), after f(two_level, world rank)
// on nodes of 3 (2x3) in chunks of 300 int32 elements.
using calls = std::vector<std::pair<collective, std::size_t>>;
struct level_calls {
  std::vector<calls> intra = std::vector<calls>(6), inter = std::vector<calls>(6);
};
template <class F>
level_calls trace_on_2x3(F&& f) {
  const auto kinds_of = [](const std::vector<traced_op>& ops) {
    calls out;
    for (const auto& o : ops)
      out.emplace_back(o.kind, o.count);
    return out;
  };
  std::mutex m;
  level_calls got;
  local::run(topology::parse("2x3"), [&](local::communicator& c) {
    traced world(std::move(c), "world");
    auto tl = make_two_level(world, {.chunk_bytes = 300 * sizeof(std::int32_t)});
    f(tl, world.rank());
    const std::lock_guard lock(m);
    got.intra[static_cast<std::size_t>(world.rank())] = kinds_of(tl.intra().ops());
    got.inter[static_cast<std::size_t>(world.rank())] = kinds_of(tl.inter().ops());
  });
  return got;
}

using C = collective;

// On even nodes the all-reduce of each chunk is one Intra reduce_scatter, the leaders'
// all-reduce of a third, and one Intra all_gather: 602 elements in chunks of 300 over nodes of
// 3 are 2 chunks of 3 blocks of 100, and the 2 left over go by blocks of 0, 0 and 2 (block
// boundaries fall on 16 bytes: a reduce and a broadcast on local rank 2).
TEST(two_level, even_nodes_all_reduce_by_reduce_scatter_and_all_gather) {
  const std::size_t count = 602;
  const auto got = trace_on_2x3([&](auto& tl, int rank) {
    std::vector<std::int32_t> v(count);
    for (std::size_t i = 0; i < count; ++i)
      v[i] = rank + static_cast<std::int32_t>(i);
    all_reduce(tl, std::span(v));
    for (std::size_t i = 0; i < count; ++i)
      ASSERT_EQ(v[i], 15 + 6 * static_cast<std::int32_t>(i)) << "element " << i;
  });
  for (std::size_t r = 0; r < 6; ++r) {
    // RS 0, RS 1, AG 0, AG 1 (chunk 1's reduce before chunk 0's gather), then the 2 left over.
    const calls intra = {{C::reduce_scatter, 100}, {C::reduce_scatter, 100}, {C::all_gather, 100},
                         {C::all_gather, 100},     {C::reduce, 2},           {C::broadcast, 2}};
    EXPECT_EQ(got.intra[r], intra) << "rank " << r;
    calls inter = {{C::all_reduce, 100}, {C::all_reduce, 100}};
    if (r % 3 == 2) inter.emplace_back(C::all_reduce, 2);
    EXPECT_EQ(got.inter[r], inter) << "rank " << r;
  }
}

// On even nodes the broadcast of each chunk goes from the root across its node (Intra), a third
// from each of its ranks to the other node (Inter) into scratch, and there one Intra
// all_gather spreads it: 602 elements from root 4 (local rank 1 of node 1). The 2 left over go
// by blocks of 0, 0 and 2: the root's node broadcasts them, local rank 2 sends its block
// across, the other node broadcasts it.
TEST(two_level, even_nodes_broadcast_by_all_gather) {
  const std::size_t count = 602;
  const int root = 4;
  const auto got = trace_on_2x3([&](auto& tl, int rank) {
    std::vector<std::int32_t> v(count, -1);
    if (rank == root) {
      for (std::size_t i = 0; i < count; ++i)
        v[i] = 7 * static_cast<std::int32_t>(i);
    }
    broadcast(tl, std::span(v), root);
    for (std::size_t i = 0; i < count; ++i)
      ASSERT_EQ(v[i], 7 * static_cast<std::int32_t>(i)) << "element " << i;
  });
  for (std::size_t r = 0; r < 6; ++r) {
    const calls intra = r >= 3
                            ? calls{{C::broadcast, 300}, {C::broadcast, 300}, {C::broadcast, 2}}
                            : calls{{C::all_gather, 100}, {C::all_gather, 100}, {C::broadcast, 2}};
    EXPECT_EQ(got.intra[r], intra) << "rank " << r;
    calls inter = {{C::broadcast, 100}, {C::broadcast, 100}};
    if (r % 3 == 2) inter.emplace_back(C::broadcast, 2);
    EXPECT_EQ(got.inter[r], inter) << "rank " << r;
  }
}

// On even nodes the reduce of each chunk is one Intra reduce_scatter, the leaders' reduce of a
// third onto the root's node, and there one Intra all_gather: 602 elements to root 4. The 2
// left over go by blocks of 0, 0 and 2: a reduce on local rank 2, and on the root's node its
// block handed to the root by a broadcast.
TEST(two_level, even_nodes_reduce_by_reduce_scatter_and_all_gather) {
  const std::size_t count = 602;
  const int root = 4;
  const auto got = trace_on_2x3([&](auto& tl, int rank) {
    std::vector<std::int32_t> v(count), sum(rank == root ? count : 0);
    for (std::size_t i = 0; i < count; ++i)
      v[i] = rank + static_cast<std::int32_t>(i);
    reduce(tl, std::span<const std::int32_t>(v), std::span(sum), root);
    for (std::size_t i = 0; i < sum.size(); ++i)
      ASSERT_EQ(sum[i], 15 + 6 * static_cast<std::int32_t>(i)) << "element " << i;
  });
  for (std::size_t r = 0; r < 6; ++r) {
    const bool root_node = r >= 3;
    // RS 0, RS 1 (chunk 1's before chunk 0's gather), AG 0, AG 1 on the root's node only.
    calls intra = {{C::reduce_scatter, 100}, {C::reduce_scatter, 100}};
    if (root_node) intra.insert(intra.end(), {{C::all_gather, 100}, {C::all_gather, 100}});
    intra.emplace_back(C::reduce, 2);
    if (root_node) intra.emplace_back(C::broadcast, 2);
    EXPECT_EQ(got.intra[r], intra) << "rank " << r;
    calls inter = {{C::reduce, 100}, {C::reduce, 100}};
    if (r % 3 == 2) inter.emplace_back(C::reduce, 2);
    EXPECT_EQ(got.inter[r], inter) << "rank " << r;
  }
}

// The host handoff's scratch comes back to its pool and is handed out again where it fits:
// the smallest free block that holds the request, else a new one.
TEST(two_level, host_scratch_is_reused_between_calls) {
  host_runtime h;
  int comm = 0; // the host handoff ignores the communicator
  const float* first = nullptr;
  {
    auto a = h.scratch<float>(comm, 1000);
    first = a.data();
    a.data()[999] = 1.0f; // usable to its end
  }
  {
    auto b = h.scratch<float>(comm, 500);  // fits the freed block
    auto c = h.scratch<float>(comm, 2000); // does not: a new one
    EXPECT_EQ(b.data(), first);
    EXPECT_NE(c.data(), first);
    c.data()[1999] = 2.0f;
  }
  auto d = h.scratch<double>(comm, 900); // 7200 bytes: only the 8000-byte block fits
  EXPECT_NE(d.data(), reinterpret_cast<const double*>(first));
  auto e = h.scratch<float>(comm, 0);
  EXPECT_EQ(e.data(), nullptr);
}

// The order between the levels, as a device transport needs it (there each level has its own
// stream, and a handoff orders one after the other): a call that uses Inter hands the caller's
// order from Intra to Inter before Inter's first operation, and back after its last, so the call
// starts after the caller's work and ends on Intra's stream. The host transports' handoff does
// nothing, so this records when each handoff came, as the number of Inter operations by then.
struct recorded_space : host_runtime {
  struct state {
    const void* intra = nullptr; // the two_level's own communicators, set once it is made
    const traced<local::communicator>* inter = nullptr;
    std::vector<std::size_t> to_inter, to_intra; // each handoff, as the Inter operations by then
  };
  std::shared_ptr<state> s = std::make_shared<state>();
  template <class From, class To>
  void operator()(From& from, To&) {
    const std::size_t n = s->inter->ops().size();
    (static_cast<const void*>(&from) == s->intra ? s->to_inter : s->to_intra).push_back(n);
  }
};

TEST(two_level, a_call_on_inter_is_ordered_after_the_callers_work_and_ends_on_intra) {
  for (const char* spec : {"4x1", "2x2", "3+1"}) {
    local::run(topology::parse(spec), [&](local::communicator& world) {
      const int rank = world.rank();
      const auto& node_of = world.node_of();
      std::vector<int> nodes(node_of.begin(), node_of.end());
      const int color = detail::node_color(nodes, rank);
      auto intra = world.split(color, rank);
      auto inter = world.split(intra.rank(), color);
      recorded_space h;
      two_level<traced<local::communicator>, traced<local::communicator>, recorded_space> tl(
          traced(std::move(intra), "intra"), traced(std::move(inter), "inter"), nodes, rank, {}, h);
      h.s->intra = &tl.intra();
      h.s->inter = &tl.inter();
      const auto check = [&](const char* what, auto&& call) {
        h.s->to_inter.clear();
        h.s->to_intra.clear();
        const std::size_t before = tl.inter().ops().size();
        call();
        const std::size_t after = tl.inter().ops().size();
        const std::string where =
            std::string(spec) + ", " + what + ", rank " + std::to_string(rank);
        if (after == before) return; // Inter not used here
        ASSERT_FALSE(h.s->to_inter.empty()) << where << ": Inter ran without a handoff from Intra";
        EXPECT_EQ(h.s->to_inter.front(), before)
            << where << ": Inter ran before the handoff from Intra";
        ASSERT_FALSE(h.s->to_intra.empty()) << where << ": the call did not end on Intra";
        EXPECT_EQ(h.s->to_intra.back(), after)
            << where << ": Inter ran after the last handoff back";
      };
      const std::size_t p = static_cast<std::size_t>(world.size());
      std::vector<float> v(64, 1.0f), all(64 * p, 1.0f), out(64);
      check("all_reduce", [&] { all_reduce(tl, std::span(v)); });
      check("broadcast", [&] { broadcast(tl, std::span(v), 0); });
      check("reduce", [&] { reduce(tl, std::span<const float>(v), std::span(out), 0); });
      check("reduce_scatter",
            [&] { reduce_scatter(tl, std::span<const float>(all), std::span(out)); });
      check("all_gather", [&] { all_gather(tl, std::span<const float>(out), std::span(all)); });
    });
  }
}

TEST(two_level, refuses_bad_roots_and_buffers) {
  local::run(topology::parse("2x2"), [](local::communicator& world) {
    auto tl = make_two_level(world);
    std::vector<float> v(8), small(4);
    EXPECT_THROW(broadcast(tl, std::span(v), 4), error);
    EXPECT_THROW(broadcast(tl, std::span(v), -1), error);
    EXPECT_THROW(reduce(tl, std::span<const float>(v), std::span(v), 7), error);
    if (world.rank() == 1) { // only the root's output is checked
      EXPECT_THROW(reduce(tl, std::span<const float>(v), std::span(small), 1), error);
    }
    std::vector<float> three(3);
    EXPECT_THROW(reduce_scatter(tl, std::span<const float>(v), std::span(three)), error);
    EXPECT_THROW(all_gather(tl, std::span<const float>(three), std::span(v)), error);
  });
}

// The collectives on pointers cannot be called past the free functions, which check buffers,
// roots and the call, and scale half averages (a member broadcast from root 9 of 4 ranks
// indexed past the world's node table).
template <class TL>
concept pointer_collectives_reachable = requires(TL& tl, const float* in, float* out,
                                                 std::size_t n) {
  tl.template all_reduce<algo::levels<>>(in, out, n, op::sum{});
  tl.template broadcast<algo::levels<>>(out, n, 0);
  tl.template reduce<algo::levels<>>(in, out, n, 0, op::sum{});
  tl.template reduce_scatter<algo::levels<>>(in, out, n, op::sum{});
  tl.template all_gather<algo::levels<>>(in, out, n);
};
static_assert(!pointer_collectives_reachable<two_level<local::communicator>>);
// The concept can hold: the free functions reach them through the access struct.
static_assert(requires(two_level<local::communicator> & tl, const float* in, float* out,
                       std::size_t n) {
  detail::two_level_access::all_reduce<algo::levels<>>(tl, in, out, n, op::sum{});
});

TEST(two_level, barrier_meets_every_rank) {
  local::run(topology::parse("2+3"), [](local::communicator& world) {
    auto tl = make_two_level(world);
    for (int i = 0; i < 3; ++i)
      tl.barrier();
    EXPECT_EQ(tl.size(), 5);
    EXPECT_EQ(tl.rank(), world.rank());
  });
}

TEST(two_level, refuses_communicators_that_do_not_match_node_of) {
  local::run(topology::parse("2x2"), [](local::communicator& world) {
    // The world as the intra-node communicator: 4 ranks where node_of puts 2 on each node.
    auto intra = world.split(0, world.rank());
    auto inter = world.split(0, world.rank());
    try {
      two_level<local::communicator> tl(std::move(intra), std::move(inter), world.node_of(),
                                        world.rank());
      ADD_FAILURE() << "a world-sized intra communicator must be refused";
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("intra-node communicator has rank"), std::string::npos)
          << e.what();
    }
  });
  local::run(topology::parse("2x2"), [](local::communicator& world) {
    const int node = world.rank() / 2;
    auto intra = world.split(node, world.rank());
    auto inter = world.split(0, world.rank()); // everyone, where it should be one per node
    try {
      two_level<local::communicator> tl(std::move(intra), std::move(inter), world.node_of(),
                                        world.rank());
      ADD_FAILURE() << "a world-sized inter communicator must be refused";
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("inter-node communicator has 4 ranks, but 2 nodes"),
                std::string::npos)
          << e.what();
    }
  });
  local::run(topology::parse("2x2"), [](local::communicator& world) {
    const int node = world.rank() / 2;
    auto intra = world.split(node, world.rank());
    auto inter = world.split(world.rank() % 2, -node); // the nodes in reverse order
    try {
      two_level<local::communicator> tl(std::move(intra), std::move(inter), world.node_of(),
                                        world.rank());
      ADD_FAILURE() << "an inter communicator with the nodes out of order must be refused";
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("but its node comes at"), std::string::npos) << e.what();
    }
  });
  local::run(topology::parse("2x2"), [](local::communicator& world) {
    EXPECT_THROW(make_two_level(world, {.chunk_bytes = 0}), error);
  });
}

// A chunk larger than the call (chunk_bytes = SIZE_MAX: "no chunking") takes the call in one
// chunk. A reduce that sized its working memory by the chunk would wrap SIZE_MAX to a 1-byte
// block written past (ASan) and ask 2^36 for 64 GiB for 10 floats; the chunk count would wrap
// to 0.
TEST(two_level, chunks_larger_than_the_call_take_it_in_one) {
  for (const std::size_t chunk_bytes :
       {std::numeric_limits<std::size_t>::max(), std::size_t{1} << 36}) {
    for (const char* spec : {"1+3", "2x2", "3+2"}) {
      local::run(topology::parse(spec), [&](local::communicator& world) {
        auto tl = make_two_level(world, {.chunk_bytes = chunk_bytes});
        const int p = world.size();
        std::vector<float> in(10), out(10, -1.0f), all(10);
        for (std::size_t i = 0; i < in.size(); ++i)
          in[i] = static_cast<float>(world.rank() * 100 + i);
        reduce(tl, std::span<const float>(in), std::span(out), 0);
        all_reduce(tl, std::span<const float>(in), std::span(all));
        for (std::size_t i = 0; i < in.size(); ++i) {
          const float want = static_cast<float>(100 * p * (p - 1) / 2 + p * static_cast<int>(i));
          if (world.rank() == 0) {
            EXPECT_EQ(out[i], want) << spec << " element " << i;
          }
          EXPECT_EQ(all[i], want) << spec << " element " << i;
        }
      });
    }
  }
}

// half averages whose sum half cannot hold (4 x 30000 > 65504): as the plain collectives,
// each input is scaled by 1/size first. They gave inf.
TEST(two_level, half_averages_do_not_overflow) {
  for (const char* spec : {"2x2", "3+2", "1+3"}) {
    local::run(topology::parse(spec), [&](local::communicator& world) {
      auto tl = make_two_level(world);
      const std::size_t n = 2 * static_cast<std::size_t>(world.size());
      std::vector<half> in(n, half(30000.0f)), out(n), part(2), root(n);
      all_reduce(tl, std::span<const half>(in), std::span(out), op::avg{});
      for (const half v : out)
        EXPECT_NEAR(static_cast<float>(v), 30000.0f, 30.0f) << spec;
      reduce_scatter(tl, std::span<const half>(in), std::span(part), op::avg{});
      for (const half v : part)
        EXPECT_NEAR(static_cast<float>(v), 30000.0f, 30.0f) << spec;
      reduce(tl, std::span<const half>(in), std::span(root), 1, op::avg{});
      if (world.rank() == 1) {
        for (const half v : root)
          EXPECT_NEAR(static_cast<float>(v), 30000.0f, 30.0f) << spec;
      }
      all_reduce(tl, std::span(in), op::avg{});
      for (const half v : in)
        EXPECT_NEAR(static_cast<float>(v), 30000.0f, 30.0f) << spec << " in place";
    });
  }
}

// A runtime whose memory the host cannot scale in (cuda::stream_runtime) scales half averages
// itself: the dispatch hands it each input, and sums the result. Here a host runtime with that
// hook, made of the device kernel's functor, against host_runtime: the same bits, and eight
// ranks of 10000 (whose sum half cannot hold) average to 10000 on both.
struct scaling_runtime : host_runtime {
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  template <class Comm, class T>
  std::vector<T> scaled_by_ranks(Comm&, const T* in, std::size_t n, int ranks) {
    ++*calls;
    std::vector<T> scaled(n);
    const detail::scale_elements<T> f{scaled.data(), in, detail::average_scale<T>(ranks)};
    for (std::size_t i = 0; i < n; ++i)
      f(i);
    return scaled;
  }
};

TEST(two_level, a_runtime_that_scales_half_averages_gives_the_host_bits) {
  for (const char* spec : {"2x4", "3+5"}) {
    local::run(topology::parse(spec), [&](local::communicator& world) {
      const std::size_t n = 3 * static_cast<std::size_t>(world.size()) + 1;
      std::vector<half> in(n);
      for (std::size_t i = 0; i < n; ++i)
        in[i] = i % 3 == 0
                    ? half(10000.0f)
                    : half(static_cast<float>((static_cast<int>(i) * 7919 + world.rank() * 104729) %
                                              60000) -
                           30000.0f);
      auto host = make_two_level(world);
      scaling_runtime rt;
      auto scaling = make_two_level(world, {}, rt);
      std::vector<half> want(n), got(n);
      all_reduce(host, std::span<const half>(in), std::span(want), op::avg{});
      all_reduce(scaling, std::span<const half>(in), std::span(got), op::avg{});
      EXPECT_EQ(*rt.calls, 1) << spec;
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(got[i].bits(), want[i].bits()) << spec << " i " << i;
        if (i % 3 == 0 && world.size() == 8) {
          EXPECT_NEAR(static_cast<float>(got[i]), 10000.0f, 16.0f) << spec << " i " << i;
        }
      }
    });
  }
}

// The call check covers two_level's own calls: ranks that ask for avg and sum, or name different
// roots, are told so before data moves. Its levels' calls could not tell (an average travels as
// a sum, a root as node and local indices), and the ranks ended with different results.
TEST(two_level, the_call_check_compares_the_two_level_call) {
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<std::string> seen(4);
    (void)local::run(topology::parse("2x2"),
                     [&](local::communicator& world) {
                       auto tl = make_two_level(world);
                       std::vector<float> a(4, static_cast<float>(world.rank() + 1)), out(4);
                       try {
                         if (variant == 0) {
                           if (world.rank() == 0) {
                             all_reduce(tl, std::span(a), op::avg{});
                           } else {
                             all_reduce(tl, std::span(a), op::sum{});
                           }
                         } else {
                           const int root = world.rank() == 1 ? 1 : 0;
                           reduce(tl, std::span<const float>(a), std::span(out), root);
                         }
                       } catch (const error& e) {
                         seen[static_cast<std::size_t>(world.rank())] = e.what();
                       }
                     },
                     {.timeout = std::chrono::seconds(20), .check_calls = true});
    int told = 0;
    for (const auto& m : seen)
      told += m.find("the ranks called different collectives") != std::string::npos ? 1 : 0;
    EXPECT_GE(told, 2) << "variant " << variant << ": " << seen[0] << " | " << seen[1];
    for (const auto& m : seen)
      EXPECT_FALSE(m.empty()) << "variant " << variant << ": a rank finished the call";
  }
}

// --- chunks bounded by what a level takes in one call ------------------------------------------

// Chunk elements: chunk_bytes' worth (rounded down, at least one), no more than the levels'
// bound, to whole 16 bytes where that leaves any; a bound of 0 is refused.
TEST(two_level, chunk_elements_take_the_chunk_bytes_up_to_the_levels_bound) {
  using detail::two_level_chunk_elements;
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  EXPECT_EQ(two_level_chunk_elements(4096, 4, none), 1024u);
  EXPECT_EQ(two_level_chunk_elements(4099, 4, none), 1024u); // not a whole element more
  EXPECT_EQ(two_level_chunk_elements(3, 4, none), 1u);       // less than one element: one
  EXPECT_EQ(two_level_chunk_elements(4096, 4, 1023), 1020u); // the bound, to whole 16 bytes
  EXPECT_EQ(two_level_chunk_elements(4096, 4, 1024), 1024u); // at it
  EXPECT_EQ(two_level_chunk_elements(4096, 4, 1025), 1024u); // above it
  EXPECT_EQ(two_level_chunk_elements(none, 2, 7), 7u);       // under 16 bytes: the bound alone
  EXPECT_EQ(two_level_chunk_elements(none, 2, 9), 8u);
  EXPECT_EQ(two_level_chunk_elements(none, 1, none), none / 16 * 16);
  try {
    (void)two_level_chunk_elements(4096, 8, 0);
    ADD_FAILURE() << "a bound of 0 elements was taken";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("8 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("workspace_bytes"), std::string::npos) << e.what();
  }
}

// Every chunk or level piece but the last starts 16 bytes apart from the buffer's start, for
// every element size, wherever a whole 16 bytes fits the chunk and the bound; the reference
// searches down from the largest chunk the bytes and the bound allow for one that spans whole
// 16 bytes, and otherwise keeps it.
TEST(two_level, every_chunk_but_the_last_starts_on_16_bytes) {
  using detail::two_level_chunk_elements;
  using detail::two_level_uniform_chunk;
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  for (std::size_t es : {1, 2, 3, 4, 6, 8, 12, 16, 32}) {
    for (std::size_t bytes : {std::size_t{1}, std::size_t{15}, std::size_t{100}, std::size_t{4099},
                              std::size_t{4} << 20, none}) {
      for (std::size_t limit :
           {std::size_t{1}, std::size_t{5}, std::size_t{9}, std::size_t{1001}, none}) {
        const std::size_t most = std::min(std::max<std::size_t>(1, bytes / es), limit);
        std::size_t want = most;
        if (most < 4096) {
          for (std::size_t m = most; m >= 1; --m) {
            if (m * es % 16 == 0) {
              want = m;
              break;
            }
          }
        } else {
          want = most - most % (16 / std::gcd<std::size_t>(16, es));
        }
        const std::size_t chunk = two_level_chunk_elements(bytes, es, limit);
        EXPECT_EQ(chunk, want) << "element " << es << " bytes " << bytes << " limit " << limit;
        if (want * es % 16 == 0) { // whole 16 bytes fit: every later chunk starts on them
          for (std::size_t k = 1; k < 5; ++k)
            EXPECT_EQ(k * chunk * es % 16, 0u) << "element " << es << " chunk " << chunk;
        }
      }
    }
    // A chunk's m blocks (one per leader): contiguous over the chunk, each starting on 16 bytes,
    // at the largest such boundary at or below the even split's len * j / m.
    for (std::size_t m : {1, 2, 3, 4, 7}) {
      for (std::size_t len :
           {std::size_t{1}, std::size_t{10}, std::size_t{1000}, std::size_t{4099}}) {
        std::size_t next = 0;
        for (std::size_t j = 0; j < m; ++j) {
          const auto [b, e] = detail::two_level_block(len, j, m, es);
          EXPECT_EQ(b, next) << "blocks are contiguous";
          next = e;
          std::size_t want_b = len * j / m;
          while (want_b * es % 16 != 0)
            --want_b;
          EXPECT_EQ(b, want_b) << "element " << es << " m " << m << " len " << len << " j " << j;
          EXPECT_LE(b, e);
          for (std::size_t longer : {len, len + 1, len + 100})
            EXPECT_LE(e - b, detail::two_level_block_room(longer, m, es)) << "a slot holds it";
        }
        EXPECT_EQ(detail::two_level_block_room(len, m, es) * es % 16, 0u);
        EXPECT_EQ(next, len) << "the blocks cover the chunk";
      }
    }
    // Uniform nodes: each of a chunk's L blocks starts on 16 bytes too.
    for (std::size_t L : {1, 2, 3, 4, 8}) {
      for (std::size_t chunk :
           {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{1} << 20}) {
        const std::size_t u = two_level_uniform_chunk(chunk, L, es);
        EXPECT_EQ(u % L, 0u);
        EXPECT_GE(u, L);
        EXPECT_LE(u, std::max(chunk, L));
        const std::size_t block = u / L;
        if (chunk >= L * 16) { // room for whole 16 bytes per block at any element size
          EXPECT_EQ(block * es % 16, 0u) << "element " << es << " L " << L << " chunk " << chunk;
          EXPECT_GT(u + L * 16, chunk / L * L) << "rounded down more than needed";
        }
      }
    }
  }
}

// A level that lays out at most `cap` elements per rank in one call, as a p2p communicator's
// workspace bounds it (max_count: for reduce_scatter and all_gather, whose count is one rank
// block, cap / size blocks' worth); it records its calls (traced). Not split again.
struct capped : traced<local::communicator> {
  capped(local::communicator c, std::size_t cap) : traced(std::move(c)), cap(cap) {}
  [[nodiscard]] std::size_t max_count(collective c, std::size_t) const {
    const bool blocks = c == collective::reduce_scatter || c == collective::all_gather;
    return blocks ? cap / static_cast<std::size_t>(size()) : cap;
  }
  [[nodiscard]] capped split(int, int) { throw error("capped: not split in these tests"); }
  std::size_t cap;
};
static_assert(communicator<capped>);

// The elements a level call lays out per rank, as a p2p workspace holds them: a reduce_scatter's
// or all_gather's count is one rank block.
std::size_t footprint(const traced_op& o, int level_size) {
  const bool blocks = o.kind == collective::reduce_scatter || o.kind == collective::all_gather;
  return blocks ? o.count * static_cast<std::size_t>(level_size) : o.count;
}

// Every collective on two_levels whose levels take at most `cap` elements per call, against the
// serial reference: one node (the p2p level alone, a call far larger than it takes), one rank
// per node, and two levels (even and uneven nodes) with chunk_bytes far above the bound. Counts
// below, at and above the bound, odd, and not divided by the ranks. No level call exceeds the
// bound, and on one level the pieces cover the call once.
TEST(two_level, calls_are_cut_to_what_a_level_takes_in_one_call) {
  constexpr std::size_t cap = 8;
  const collective every[] = {collective::all_reduce, collective::broadcast, collective::reduce,
                              collective::reduce_scatter, collective::all_gather};
  for (const char* spec : {"3", "3x1", "2x3", "3+2"}) {
    const layout l = from_spec(spec);
    const int p = static_cast<int>(l.node_of.size());
    const bool one_node = std::string(spec) == "3";
    const bool one_per_node = std::string(spec) == "3x1";
    for (const std::size_t count :
         {std::size_t{5}, cap, cap + 1, std::size_t{29}, std::size_t{0}}) {
      for (const collective c : every) {
        const int root = p - 1;
        const auto in =
            inputs<std::int32_t, op::sum>(p, test::input_count(c, p, count), test::pattern::exact);
        const auto want = test::reference<std::int32_t, op::sum>(c, p, count, root, in);
        std::vector<std::vector<std::int32_t>> got(static_cast<std::size_t>(p));
        std::vector<std::vector<traced_op>> intra_ops(got.size()), inter_ops(got.size());
        std::vector<int> level_sizes(got.size());
        std::mutex m;
        local::run(topology::parse(spec), [&](local::communicator& world) {
          const int rank = world.rank();
          const auto r = static_cast<std::size_t>(rank);
          const int color = detail::node_color(l.node_of, rank);
          auto intra = world.split(color, rank);
          auto inter = world.split(intra.rank(), color);
          two_level<capped> tl(capped(std::move(intra), cap), capped(std::move(inter), cap),
                               l.node_of, rank, {.chunk_bytes = std::size_t{1} << 20});
          const std::span<const std::int32_t> mine(in[r]);
          std::vector<std::int32_t> out(test::output_count(c, p, count, rank, root), -7);
          if (c == collective::all_reduce) {
            all_reduce(tl, mine, std::span(out));
          } else if (c == collective::broadcast) {
            if (rank == root) out = in[r];
            broadcast(tl, std::span(out), root);
          } else if (c == collective::reduce) {
            reduce(tl, mine, std::span(out), root);
          } else if (c == collective::reduce_scatter) {
            reduce_scatter(tl, mine, std::span(out));
          } else {
            all_gather(tl, mine, std::span(out));
          }
          const std::lock_guard lock(m);
          got[r] = std::move(out);
          intra_ops[r] = tl.intra().ops();
          inter_ops[r] = tl.inter().ops();
          level_sizes[r] = (one_per_node ? tl.inter() : tl.intra()).size();
        });
        const std::string what =
            std::string(spec) + ", " + std::string(name_of(c)) + " of " + std::to_string(count);
        expect_outputs(got, want, test::pattern::exact, what);
        for (std::size_t r = 0; r < got.size(); ++r) {
          for (const auto& o : intra_ops[r])
            EXPECT_LE(footprint(o, level_sizes[r]), cap) << what << ", rank " << r << " intra";
          for (const auto& o : inter_ops[r])
            EXPECT_LE(footprint(o, level_sizes[r]), cap) << what << ", rank " << r << " inter";
          if (!one_node && !one_per_node) continue;
          // One level: pieces of the whole call (of each rank block), each as large as the level
          // takes.
          const auto& one = one_per_node ? inter_ops[r] : intra_ops[r];
          const std::size_t piece = c == collective::reduce_scatter || c == collective::all_gather
                                        ? cap / static_cast<std::size_t>(p)
                                        : cap;
          std::size_t sum = 0;
          for (const auto& o : one) {
            EXPECT_EQ(o.kind, c) << what;
            sum += o.count;
          }
          EXPECT_EQ(sum, count) << what << ", rank " << r;
          EXPECT_EQ(one.size(), std::max<std::size_t>(1, (count + piece - 1) / piece))
              << what << ", rank " << r;
        }
      }
    }
  }
}

} // namespace
