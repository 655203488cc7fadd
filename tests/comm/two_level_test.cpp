// weft::two_level on the local transport: the all-reduce against the serial reference for even
// and uneven nodes, by chunks, in and out of place, with each level's algorithm named; every
// rank's bits equal; what crosses the inter-node communicator; bad construction refused.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/comm/two_level.hpp>
#include <weft/topology/topology.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "support/reference.hpp"

namespace {

using namespace weft;

// The layouts: even and uneven nodes, one node, one rank per node, nodes not in rank order.
const char* const layouts[] = {"2x2", "2x3", "3+5", "1+3", "4+2+3", "4x1", "4"};

template <class Algo, class T, class Op>
void check_all_reduce(const std::string& spec, std::size_t count, std::size_t chunk_bytes, bool in_place,
                      test::pattern pat) {
  const auto cluster = topology::parse(spec);
  const int p = cluster.size();
  std::vector<std::vector<T>> in(static_cast<std::size_t>(p), std::vector<T>(count));
  for (int r = 0; r < p; ++r) {
    for (std::size_t i = 0; i < count; ++i) in[static_cast<std::size_t>(r)][i] = test::input_value<T, Op>(r, i, pat);
  }
  const auto want = test::reference<T, Op>(collective::all_reduce, p, count, 0, in);
  std::vector<std::vector<T>> got(static_cast<std::size_t>(p));
  local::run(cluster, [&](local::communicator& world) {
    auto tl = make_two_level(world, {.chunk_bytes = chunk_bytes});
    const auto r = static_cast<std::size_t>(world.rank());
    std::vector<T> out(count);
    if (in_place) {
      out = in[r];
      all_reduce<Algo>(tl, std::span(out), Op{});
    } else {
      all_reduce<Algo>(tl, std::span<const T>(in[r]), std::span(out), Op{});
    }
    got[r] = std::move(out);
  });
  const std::string what = spec + ", " + std::to_string(count) + " elements, chunks of " +
                           std::to_string(chunk_bytes) + " B" + (in_place ? ", in place" : ", out of place");
  for (int r = 0; r < p; ++r) {
    const auto& g = got[static_cast<std::size_t>(r)];
    ASSERT_EQ(g.size(), count) << what;
    // Every rank holds the same bits as rank 0.
    if (count != 0) {
      ASSERT_EQ(std::memcmp(g.data(), got[0].data(), count * sizeof(T)), 0) << what << ": rank " << r << " differs";
    }
    for (std::size_t i = 0; i < count; ++i) {
      const auto& w = want[static_cast<std::size_t>(r)][i];
      if (pat == test::pattern::exact) {
        ASSERT_EQ(g[i], w) << what << ", rank " << r << ", element " << i;
      } else {
        ASSERT_NEAR(static_cast<double>(g[i]), static_cast<double>(w), 1e-5 * p) << what << ", element " << i;
      }
    }
  }
}

TEST(two_level, all_reduce_matches_the_reference_on_every_layout) {
  for (const char* spec : layouts) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1000}}) {
      // 64-byte chunks: 16 int32 per chunk, so the 1000 elements take 63 chunks (the last short).
      check_all_reduce<algo::stages<>, std::int32_t, op::sum>(spec, count, 64, true, test::pattern::exact);
      check_all_reduce<algo::stages<>, std::int32_t, op::sum>(spec, count, 1 << 20, false, test::pattern::exact);
    }
  }
}

TEST(two_level, operators_and_types) {
  for (const char* spec : {"2x3", "3+5"}) {
    check_all_reduce<algo::stages<>, std::int64_t, op::max>(spec, 777, 256, true, test::pattern::exact);
    check_all_reduce<algo::stages<>, std::int32_t, op::prod>(spec, 301, 128, false, test::pattern::exact);
    check_all_reduce<algo::stages<>, std::int32_t, op::avg>(spec, 301, 128, true, test::pattern::exact);
    check_all_reduce<algo::stages<>, double, op::avg>(spec, 513, 1024, true, test::pattern::exact);
    check_all_reduce<algo::stages<>, float, op::sum>(spec, 4099, 4096, false, test::pattern::random);
  }
}

TEST(two_level, each_level_takes_the_named_algorithm) {
  for (const char* spec : {"2x4", "3+5", "4+2+3"}) {
    check_all_reduce<algo::stages<algo::ring, algo::tree>, std::int32_t, op::sum>(spec, 997, 200, true,
                                                                                   test::pattern::exact);
    check_all_reduce<algo::stages<algo::direct, algo::halving_doubling>, std::int32_t, op::sum>(
        spec, 997, 200, false, test::pattern::exact);
    check_all_reduce<algo::stages<algo::tree, algo::ring>, float, op::sum>(spec, 997, 1 << 16, true,
                                                                          test::pattern::random);
  }
}

// Only the leaders' blocks cross the inter-node communicator: over nodes of 3 and 5 ranks
// (m = 3), local ranks 0-2 all-reduce a third of each chunk across the nodes, ranks 3 and 4
// of the bigger node never use it, and the intra-node calls are m reduces and m broadcasts
// per chunk.
TEST(two_level, only_the_blocks_cross_between_nodes) {
  const auto cluster = topology::parse("3+5");
  const std::size_t count = 3000;
  const std::size_t chunk = 1200;  // elements of int32: chunks of 1200, 1200 and 600
  std::mutex m;
  std::vector<std::size_t> inter_elements(8), inter_calls(8), intra_reduces(8), intra_broadcasts(8);
  local::run(cluster, [&](local::communicator& c) {
    traced world(std::move(c), "world");
    auto tl = make_two_level(world, {.chunk_bytes = chunk * sizeof(std::int32_t)});
    EXPECT_EQ(tl.leaders(), 3);
    EXPECT_EQ(tl.nodes(), 2);
    std::vector<std::int32_t> v(count, 1);
    all_reduce(tl, std::span(v));
    for (auto x : v) ASSERT_EQ(x, 8);
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

TEST(two_level, barrier_meets_every_rank) {
  local::run(topology::parse("2+3"), [](local::communicator& world) {
    auto tl = make_two_level(world);
    for (int i = 0; i < 3; ++i) tl.barrier();
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
      two_level<local::communicator> tl(std::move(intra), std::move(inter), world.node_of(), world.rank());
      ADD_FAILURE() << "a world-sized intra communicator must be refused";
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("intra-node communicator has rank"), std::string::npos) << e.what();
    }
  });
  local::run(topology::parse("2x2"), [](local::communicator& world) {
    const int node = world.rank() / 2;
    auto intra = world.split(node, world.rank());
    auto inter = world.split(0, world.rank());  // everyone, where it should be one per node
    try {
      two_level<local::communicator> tl(std::move(intra), std::move(inter), world.node_of(), world.rank());
      ADD_FAILURE() << "a world-sized inter communicator must be refused";
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("inter-node communicator has 4 ranks, but 2 nodes"), std::string::npos)
          << e.what();
    }
  });
  local::run(topology::parse("2x2"), [](local::communicator& world) {
    EXPECT_THROW(make_two_level(world, {.chunk_bytes = 0}), error);
  });
}

} // namespace
