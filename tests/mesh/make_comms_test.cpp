// Tests for weft/mesh/make_comms.hpp, over a fake communicator that simulates split() in one
// thread: every rank's make_comms runs in turn and records its (color, key) per split call in a
// shared table; a split result works out its members from the table only when asked, after all
// ranks have run. Expected groups are written out by hand.
#include <weft/comm/transport/local.hpp>
#include <weft/mesh/make_comms.hpp>
#include <weft/topology/topology.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using weft::axis;

struct split_call {
  int color = 0;
  int key = 0;
};

// table[n][r]: what world rank r passed to its n-th split of the world.
struct split_table {
  explicit split_table(int n) : world_size(n) {}
  int world_size;
  std::vector<std::vector<std::optional<split_call>>> calls;
};

class fake_comm {
public:
  fake_comm(std::shared_ptr<split_table> table, int world_rank)
      : table_(std::move(table)), world_rank_(world_rank) {}

  [[nodiscard]] int rank() const {
    const std::vector<int> m = members();
    return static_cast<int>(std::find(m.begin(), m.end(), world_rank_) - m.begin());
  }

  [[nodiscard]] int size() const { return static_cast<int>(members().size()); }

  fake_comm split(int color, int key) {
    if (call_ >= 0) {
      throw std::logic_error("fake_comm: only the world can be split");
    }
    const auto n = static_cast<std::size_t>(splits_made_++);
    if (table_->calls.size() <= n) {
      table_->calls.resize(n + 1, std::vector<std::optional<split_call>>(
                                      static_cast<std::size_t>(table_->world_size)));
    }
    table_->calls[n][static_cast<std::size_t>(world_rank_)] = split_call{color, key};
    return fake_comm(table_, world_rank_, static_cast<int>(n));
  }

  // World ranks of the members, in communicator rank order (by key, ties by world rank).
  [[nodiscard]] std::vector<int> members() const {
    std::vector<int> m;
    if (call_ < 0) {
      for (int r = 0; r < table_->world_size; ++r) {
        m.push_back(r);
      }
      return m;
    }
    const auto& row = table_->calls[static_cast<std::size_t>(call_)];
    const int color = row[static_cast<std::size_t>(world_rank_)]->color;
    std::vector<std::pair<int, int>> by_key;
    for (int r = 0; r < table_->world_size; ++r) {
      const auto& c = row[static_cast<std::size_t>(r)];
      if (!c) {
        throw std::logic_error("fake_comm: rank " + std::to_string(r) + " never made split " +
                               std::to_string(call_));
      }
      if (c->color == color) {
        by_key.emplace_back(c->key, r);
      }
    }
    std::sort(by_key.begin(), by_key.end());
    for (const auto& [key, r] : by_key) {
      m.push_back(r);
    }
    return m;
  }

private:
  fake_comm(std::shared_ptr<split_table> table, int world_rank, int call)
      : table_(std::move(table)), world_rank_(world_rank), call_(call) {}

  std::shared_ptr<split_table> table_;
  int world_rank_;
  int call_ = -1; // which split of the world made this communicator; -1 for the world
  int splits_made_ = 0;
};

static_assert(weft::detail::splittable_communicator<fake_comm>);

struct simulation {
  std::shared_ptr<split_table> table;
  std::vector<weft::axis_comms<fake_comm>> comms;
};

const std::vector<std::vector<int>> megatron_tp = {{0, 1}, {2, 3},   {4, 5},   {6, 7},
                                                   {8, 9}, {10, 11}, {12, 13}, {14, 15}};
const std::vector<std::vector<int>> megatron_dp = {{0, 2},  {1, 3},  {4, 6},   {5, 7},
                                                   {8, 10}, {9, 11}, {12, 14}, {13, 15}};
const std::vector<std::vector<int>> megatron_pp = {
    {0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}};

std::vector<int> group_of(const std::vector<std::vector<int>>& groups, int r) {
  for (const auto& g : groups) {
    if (std::find(g.begin(), g.end(), r) != g.end()) {
      return g;
    }
  }
  return {};
}

int position(const std::vector<int>& g, int r) {
  return static_cast<int>(std::find(g.begin(), g.end(), r) - g.begin());
}

// Runs make_comms on every rank of an n-rank world, one after the other.
template <class Mesh, class Placement = weft::placement::strict>
simulation simulate(int n, const weft::topology::cluster* topo) {
  simulation sim{std::make_shared<split_table>(n), {}};
  for (int r = 0; r < n; ++r) {
    fake_comm world(sim.table, r);
    if (topo != nullptr) {
      sim.comms.push_back(weft::make_comms<Mesh, Placement>(world, *topo));
    } else {
      sim.comms.push_back(weft::make_comms<Mesh, Placement>(world));
    }
  }
  return sim;
}

// Runs make_comms on every rank and expects each to throw before making any split; returns rank 0's
// message.
template <class Mesh, class Placement = weft::placement::strict>
std::string expect_every_rank_throws(int n, const weft::topology::cluster& topo) {
  auto table = std::make_shared<split_table>(n);
  std::string first;
  for (int r = 0; r < n; ++r) {
    fake_comm world(table, r);
    try {
      (void)weft::make_comms<Mesh, Placement>(world, topo);
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const weft::error& e) {
      if (r == 0) {
        first = e.what();
      }
    }
  }
  EXPECT_TRUE(table->calls.empty()) << "a rank split the world before throwing";
  return first;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Megatron-LM's 16-GPU example (initialize_model_parallel's docstring in
// megatron/core/parallel_state.py; see tests/mesh/mesh_test.cpp), through make_comms.
TEST(MakeComms, AxisCommunicatorsHoldTheMeshGroups) {
  using megatron = weft::mesh<weft::tp<2>, weft::dp<2>, weft::pp<4>>;
  const weft::topology::cluster topo = weft::topology::parse("2x8");
  simulation sim = simulate<megatron>(16, &topo);
  ASSERT_EQ(sim.comms.size(), 16U);
  std::vector<int> everyone;
  for (int r = 0; r < 16; ++r) {
    everyone.push_back(r);
  }
  for (int r = 0; r < 16; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    auto& c = sim.comms[static_cast<std::size_t>(r)];
    EXPECT_EQ(c.tp().members(), group_of(megatron_tp, r));
    EXPECT_EQ(c.dp().members(), group_of(megatron_dp, r));
    EXPECT_EQ(c.pp().members(), group_of(megatron_pp, r));
    EXPECT_EQ(c.tp().rank(), position(group_of(megatron_tp, r), r));
    EXPECT_EQ(c.dp().rank(), position(group_of(megatron_dp, r), r));
    EXPECT_EQ(c.pp().rank(), position(group_of(megatron_pp, r), r));
    EXPECT_EQ(c.get<axis::pp>().members(), group_of(megatron_pp, r));
    // Axes absent from the mesh: a communicator of one.
    EXPECT_EQ(c.cp().members(), std::vector<int>{r});
    EXPECT_EQ(c.ep().members(), std::vector<int>{r});
    EXPECT_EQ(c.cp().size(), 1);
    EXPECT_EQ(c.world().members(), everyone);
    EXPECT_EQ(c.world().rank(), r);
    EXPECT_EQ(c.world().size(), 16);
    // rank = tp + 2 dp + 4 pp
    EXPECT_EQ(c.coord(), (weft::mesh_coord{.tp = r % 2, .pp = r / 4, .dp = (r / 2) % 2}));
    EXPECT_EQ(c.layout().name(), "tp2 x dp2 x pp4");
  }
}

TEST(MakeComms, DynamicAxisTakesTheWorldSize) {
  using m = weft::mesh<weft::tp<2>, weft::dp<weft::dynamic>>;
  simulation sim = simulate<m>(6, nullptr);
  EXPECT_EQ(sim.comms[3].layout().extent(axis::dp), 3);
  EXPECT_EQ(sim.comms[3].dp().members(), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(sim.comms[3].dp().rank(), 1);
  EXPECT_EQ(sim.comms[3].tp().members(), (std::vector<int>{2, 3}));
  EXPECT_EQ(sim.comms[3].pp().size(), 1);
}

// Topology "2x4": ranks 0-3 on node 0, ranks 4-7 on node 1.
TEST(MakeComms, TensorParallelAcrossNodesIsRejected) {
  const weft::topology::cluster topo = weft::topology::parse("2x4");
  const std::string what = expect_every_rank_throws<weft::mesh<weft::tp<8>>>(8, topo);
  EXPECT_TRUE(contains(what, "make_comms on rank 0")) << what;
  EXPECT_TRUE(contains(what, "tensor-parallel (tp) group of ranks [0, 1, 2, 3, 4, 5, 6, 7]"))
      << what;
  EXPECT_TRUE(contains(what, "on nodes [0, 1]")) << what;
  EXPECT_TRUE(contains(what, "all-reduces inside every layer")) << what;
  EXPECT_TRUE(contains(what, "InfiniBand")) << what;
  EXPECT_TRUE(contains(what, "NVLink")) << what;
  // tp8 cannot fit in a node of 4 whatever the order.
  EXPECT_TRUE(contains(what, "No order of the mesh axes")) << what;
  EXPECT_TRUE(contains(what, "weft::placement::allow_cross_node")) << what;
}

TEST(MakeComms, StridedTensorParallelAcrossNodesIsRejected) {
  // dp first gives tp stride 2: tp groups [0, 2, 4, 6] and [1, 3, 5, 7], each on both nodes.
  const weft::topology::cluster topo = weft::topology::parse("2x4");
  const std::string what = expect_every_rank_throws<weft::mesh<weft::dp<2>, weft::tp<4>>>(8, topo);
  EXPECT_TRUE(contains(what, "mesh dp2 x tp4")) << what;
  EXPECT_TRUE(contains(what, "group of ranks [0, 2, 4, 6] on nodes [0, 1]")) << what;
  EXPECT_TRUE(contains(what, "Put tp first in the mesh (fastest varying)")) << what;
  EXPECT_TRUE(contains(what, "weft::mesh<weft::tp<4>, weft::dp<2>>")) << what;
  EXPECT_TRUE(contains(what, "weft::placement::allow_cross_node")) << what;
}

TEST(MakeComms, SuggestionKeepsTheDynamicExtent) {
  const weft::topology::cluster topo = weft::topology::parse("2x4");
  const std::string what =
      expect_every_rank_throws<weft::mesh<weft::dp<weft::dynamic>, weft::tp<4>>>(8, topo);
  EXPECT_TRUE(contains(what, "weft::mesh<weft::tp<4>, weft::dp<weft::dynamic>>")) << what;
}

TEST(MakeComms, AllowCrossNodeSkipsTheCheck) {
  const weft::topology::cluster topo = weft::topology::parse("2x4");
  simulation sim =
      simulate<weft::mesh<weft::dp<2>, weft::tp<4>>, weft::placement::allow_cross_node>(8, &topo);
  EXPECT_EQ(sim.comms[0].tp().members(), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(sim.comms[7].tp().members(), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(sim.comms[7].tp().rank(), 3);
  EXPECT_EQ(sim.comms[5].dp().members(), (std::vector<int>{4, 5}));

  simulation whole = simulate<weft::mesh<weft::tp<8>>, weft::placement::allow_cross_node>(8, &topo);
  EXPECT_EQ(whole.comms[6].tp().size(), 8);
  EXPECT_EQ(whole.comms[6].tp().rank(), 6);
}

TEST(MakeComms, DataParallelMayCrossNodes) {
  // tp4 first: tp groups [0..3] and [4..7], one per node; dp groups [0, 4] ... span nodes, allowed.
  const weft::topology::cluster topo = weft::topology::parse("2x4");
  simulation sim = simulate<weft::mesh<weft::tp<4>, weft::dp<2>>>(8, &topo);
  EXPECT_EQ(sim.comms[6].tp().members(), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(sim.comms[6].dp().members(), (std::vector<int>{2, 6}));
}

TEST(MakeComms, ContextParallelAcrossNodesIsRejected) {
  const weft::topology::cluster topo = weft::topology::parse("2x4");
  // tp2 x dp2 x cp2: cp stride 4, groups [0, 4] ... span the nodes.
  const std::string what =
      expect_every_rank_throws<weft::mesh<weft::tp<2>, weft::dp<2>, weft::cp<2>>>(8, topo);
  EXPECT_TRUE(contains(what, "context-parallel (cp) group of ranks [0, 4] on nodes [0, 1]"))
      << what;
  EXPECT_TRUE(contains(what, "weft::mesh<weft::tp<2>, weft::cp<2>, weft::dp<2>>")) << what;

  // tp2 x cp2 x dp2: cp groups [0, 2], [1, 3], [4, 6], [5, 7], each within a node.
  simulation sim = simulate<weft::mesh<weft::tp<2>, weft::cp<2>, weft::dp<2>>>(8, &topo);
  EXPECT_EQ(sim.comms[5].cp().members(), (std::vector<int>{5, 7}));
  EXPECT_EQ(sim.comms[5].dp().members(), (std::vector<int>{1, 5}));
}

TEST(MakeComms, UnevenNodesThatNoOrderFixes) {
  // "3+5": node 0 holds ranks 0-2, so the tp group [2, 3] spans nodes 0 and 1.
  const weft::topology::cluster topo = weft::topology::parse("3+5");
  const std::string what = expect_every_rank_throws<weft::mesh<weft::tp<2>, weft::dp<4>>>(8, topo);
  EXPECT_TRUE(contains(what, "group of ranks [2, 3] on nodes [0, 1]")) << what;
  EXPECT_TRUE(contains(what, "No order of the mesh axes")) << what;
}

TEST(MakeComms, TopologyMustMatchTheWorld) {
  const weft::topology::cluster topo = weft::topology::parse("2x4");
  const std::string what =
      expect_every_rank_throws<weft::mesh<weft::tp<4>, weft::dp<weft::dynamic>>>(16, topo);
  EXPECT_TRUE(contains(what, "the topology has 8 ranks but the world has 16")) << what;
}

TEST(MakeComms, MeshMustMatchTheWorld) {
  const weft::topology::cluster topo = weft::topology::parse("2x4");
  const std::string what = expect_every_rank_throws<weft::mesh<weft::tp<4>, weft::dp<4>>>(8, topo);
  EXPECT_TRUE(contains(what, "has 16 ranks but the world has 8")) << what;
}

TEST(MakeComms, WithoutTopologyThereIsNoPlacementCheck) {
  simulation sim = simulate<weft::mesh<weft::dp<2>, weft::tp<4>>>(8, nullptr);
  EXPECT_EQ(sim.comms[2].tp().members(), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(sim.comms[2].dp().members(), (std::vector<int>{2, 3}));
}

// The same example over the in-process transport: 16 threads, each running make_comms.
TEST(MakeComms, RunsOverTheLocalTransport) {
  using megatron = weft::mesh<weft::tp<2>, weft::dp<2>, weft::pp<4>>;
  struct seen_by_rank {
    std::vector<int> tp, dp, pp, cp, world;
    int tp_rank = -1, dp_rank = -1, pp_rank = -1;
  };
  std::vector<seen_by_rank> seen(16); // each rank writes only its own slot
  const auto members = [](const weft::local::communicator& c) {
    std::vector<int> m;
    for (int i = 0; i < c.size(); ++i) {
      m.push_back(c.world_rank(i));
    }
    return m;
  };
  weft::local::run(weft::topology::parse("2x8"), [&](weft::local::communicator& world) {
    auto comms = weft::make_comms<megatron>(world, world.cluster());
    auto& s = seen[static_cast<std::size_t>(world.rank())];
    s.tp = members(comms.tp());
    s.dp = members(comms.dp());
    s.pp = members(comms.pp());
    s.cp = members(comms.cp());
    s.world = members(comms.world());
    s.tp_rank = comms.tp().rank();
    s.dp_rank = comms.dp().rank();
    s.pp_rank = comms.pp().rank();
  });
  std::vector<int> everyone;
  for (int r = 0; r < 16; ++r) {
    everyone.push_back(r);
  }
  for (int r = 0; r < 16; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const seen_by_rank& s = seen[static_cast<std::size_t>(r)];
    EXPECT_EQ(s.tp, group_of(megatron_tp, r));
    EXPECT_EQ(s.dp, group_of(megatron_dp, r));
    EXPECT_EQ(s.pp, group_of(megatron_pp, r));
    EXPECT_EQ(s.cp, std::vector<int>{r});
    EXPECT_EQ(s.world, everyone);
    EXPECT_EQ(s.tp_rank, position(group_of(megatron_tp, r), r));
    EXPECT_EQ(s.dp_rank, position(group_of(megatron_dp, r), r));
    EXPECT_EQ(s.pp_rank, position(group_of(megatron_pp, r), r));
  }
}

// Every rank throws before splitting, so run() returns the error instead of hanging in a split.
TEST(MakeComms, LocalTransportPlacementErrorDoesNotHang) {
  using bad = weft::mesh<weft::dp<2>, weft::tp<4>>;
  EXPECT_THROW(weft::local::run(weft::topology::parse("2x4"),
                                [](weft::local::communicator& world) {
                                  (void)weft::make_comms<bad>(world, world.cluster());
                                }),
               weft::error);
}

// A world whose ranks are not in device order (an MPI job launched round-robin over the nodes:
// rank r on device 0, 4, 1, 5, 2, 6, 3, 7 of "2x4"): the placement check follows each rank's
// device. Taking rank r for device r would pass a tp group that spans both nodes and refuse one
// that stays inside a node.
TEST(MakeComms, PlacementFollowsTheDeviceEachRankRunsOn) {
  std::vector<std::string> tp_first(8), dp_first(8);
  weft::local::run(weft::topology::parse("2x4"), [&](weft::local::communicator& c) {
    const int r = c.rank();
    auto world = c.split(0, (r % 4) * 2 + r / 4); // device r sits at rank (r % 4) * 2 + r / 4
    ASSERT_EQ(world.devices()[static_cast<std::size_t>(world.rank())], r);
    const auto what = [&](auto make) {
      try {
        make();
      } catch (const weft::error& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    // Ranks 0 and 1 are devices 0 and 4: two nodes.
    tp_first[static_cast<std::size_t>(r)] = what(
        [&] { (void)weft::make_comms<weft::mesh<weft::tp<2>, weft::dp<4>>>(world, c.cluster()); });
    // Ranks 0, 2, 4, 6 are devices 0-3, one node.
    dp_first[static_cast<std::size_t>(r)] = what([&] {
      auto comms = weft::make_comms<weft::mesh<weft::dp<2>, weft::tp<4>>>(world, c.cluster());
      std::vector<int> devices;
      for (int d : comms.tp().devices())
        devices.push_back(d);
      std::sort(devices.begin(), devices.end());
      EXPECT_EQ(devices, (r < 4 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{4, 5, 6, 7}));
    });
  });
  for (int r = 0; r < 8; ++r) {
    EXPECT_NE(tp_first[static_cast<std::size_t>(r)].find("group of ranks [0, 1] on nodes [0, 1]"),
              std::string::npos)
        << tp_first[static_cast<std::size_t>(r)];
    EXPECT_EQ(dp_first[static_cast<std::size_t>(r)], "") << "rank " << r;
  }
}

} // namespace
