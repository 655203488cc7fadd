// Tests for weft/mesh/mesh.hpp. Expected ranks and groups are written out by hand or taken from
// Megatron-LM's documentation; nothing is compared against the code under test itself.
//
// Misuse that must not compile cannot be tested from GoogleTest; each of these stops at a
// static_assert whose message says what to change (checked by hand with g++ 12 and clang++ 14):
// clang-format off
//   weft::mesh<int>                                  "every parameter must be an axis tag"
//   weft::mesh<weft::tp<2>, weft::tp<4>>             "an axis kind appears twice"
//   weft::mesh<weft::tp<-1>>                         "an extent is negative"
//   weft::mesh<weft::tp<weft::dynamic>, weft::dp<weft::dynamic>>  "at most one axis may be dynamic"
//   weft::mesh<weft::tp<2>, weft::dp<weft::dynamic>>::size        "call Mesh::resolve(world_size)"
//   weft::mesh<weft::tp<2>, weft::dp<weft::dynamic>>::extent<weft::axis::dp>   (same)
//   static_assert(weft::mesh<weft::tp<2>>::coords(2).tp == 0)     rank out of range: not constant
// clang-format on
#include <weft/mesh/mesh.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace {

using weft::axis;
using weft::dynamic;
using weft::mesh_coord;

// ---------------------------------------------------------------------------------------------
// Compile-time checks on the 8-rank mesh of the design sketch: tp stride 1, pp stride 2, dp
// stride 4.
using mesh_tpd = weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>;

static_assert(mesh_tpd::size == 8);
static_assert(mesh_tpd::rank_count == 3);
static_assert(!mesh_tpd::is_dynamic);
static_assert(mesh_tpd::extent<axis::tp> == 2);
static_assert(mesh_tpd::extent<axis::pp> == 2);
static_assert(mesh_tpd::extent<axis::dp> == 2);
static_assert(mesh_tpd::extent<axis::cp> == 1);
static_assert(mesh_tpd::extent<axis::ep> == 1);
static_assert(mesh_tpd::coords(0) == mesh_tpd::coord{});
static_assert(mesh_tpd::coords(5) == mesh_tpd::coord{.tp = 1, .pp = 0, .dp = 1});
static_assert(mesh_tpd::coords(6) == mesh_tpd::coord{.tp = 0, .pp = 1, .dp = 1});
static_assert(mesh_tpd::coords(7) == mesh_tpd::coord{.tp = 1, .pp = 1, .dp = 1});
static_assert(mesh_tpd::rank({.tp = 1, .pp = 1, .dp = 0}) == 3);
static_assert(mesh_tpd::rank({.tp = 0, .pp = 0, .dp = 1}) == 4);
static_assert(mesh_tpd::group<axis::tp>(5) == std::array{4, 5});
static_assert(mesh_tpd::group<axis::pp>(5) == std::array{5, 7});
static_assert(mesh_tpd::group<axis::dp>(5) == std::array{1, 5});
static_assert(mesh_tpd::group<axis::cp>(5) == std::array{5});
// tp groups {0,1} {2,3} {4,5} {6,7}; pp groups by first member 0,1,4,5; dp groups 0,1,2,3.
static_assert(mesh_tpd::group_index<axis::tp>(5) == 2);
static_assert(mesh_tpd::group_index<axis::pp>(5) == 3);
static_assert(mesh_tpd::group_index<axis::pp>(7) == 3);
static_assert(mesh_tpd::group_index<axis::pp>(2) == 0);
static_assert(mesh_tpd::group_index<axis::dp>(5) == 1);
static_assert(mesh_tpd::group_index<axis::dp>(6) == 2);
// An absent axis: every rank is its own group.
static_assert(mesh_tpd::group_index<axis::ep>(6) == 6);

// Axis order decides the strides: dp first makes tp stride 2.
using mesh_dt = weft::mesh<weft::dp<2>, weft::tp<4>>;
static_assert(mesh_dt::size == 8);
static_assert(mesh_dt::group<axis::tp>(0) == std::array{0, 2, 4, 6});
static_assert(mesh_dt::group<axis::tp>(7) == std::array{1, 3, 5, 7});
static_assert(mesh_dt::group<axis::dp>(5) == std::array{4, 5});
static_assert(mesh_dt::coords(5) == mesh_coord{.tp = 2, .dp = 1});

// The static axes of a dynamic mesh keep their compile-time extents.
using mesh_dyn = weft::mesh<weft::tp<2>, weft::pp<dynamic>, weft::dp<2>>;
static_assert(mesh_dyn::is_dynamic);
static_assert(mesh_dyn::extent<axis::tp> == 2);
static_assert(mesh_dyn::extent<axis::dp> == 2);
static_assert(mesh_dyn::extent<axis::cp> == 1);
static_assert(mesh_dyn::resolve(16).extent(axis::pp) == 4);
static_assert(mesh_dyn::resolve(16).size() == 16);
static_assert(mesh_dyn::resolve(16).coords(13) == mesh_coord{.tp = 1, .pp = 2, .dp = 1});
static_assert(mesh_dyn::resolve(16).group_member(axis::pp, 13, 3) == 15);

// The axis tags.
static_assert(weft::tp<4>::kind == axis::tp && weft::tp<4>::extent == 4 &&
              weft::tp<4>::name == "tp");
static_assert(weft::pp<3>::kind == axis::pp && weft::pp<3>::name == "pp");
static_assert(weft::dp<dynamic>::kind == axis::dp && weft::dp<dynamic>::extent == 0);
static_assert(weft::cp<2>::kind == axis::cp && weft::cp<2>::name == "cp");
static_assert(weft::ep<8>::kind == axis::ep && weft::ep<8>::name == "ep");

template <std::size_t N>
std::vector<int> to_vector(const std::array<int, N>& a) {
  return {a.begin(), a.end()};
}

// Checks that every listed group is the group of each of its members, numbered by its position in
// the list, and that the list covers the world.
template <class Mesh, axis A>
void expect_groups(const std::vector<std::vector<int>>& listed) {
  SCOPED_TRACE(std::string("axis ") + std::string(weft::axis_name(A)));
  std::vector<int> seen;
  for (std::size_t g = 0; g < listed.size(); ++g) {
    for (int r : listed[g]) {
      EXPECT_EQ(to_vector(Mesh::template group<A>(r)), listed[g]) << "rank " << r;
      EXPECT_EQ(Mesh::template group_index<A>(r), static_cast<int>(g)) << "rank " << r;
      EXPECT_EQ(Mesh::resolve(Mesh::size).group(A, r), listed[g]) << "rank " << r;
      seen.push_back(r);
    }
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int> all(static_cast<std::size_t>(Mesh::size));
  for (int r = 0; r < Mesh::size; ++r) {
    all[static_cast<std::size_t>(r)] = r;
  }
  EXPECT_EQ(seen, all);
  EXPECT_EQ(Mesh::resolve(Mesh::size).group_count(A), static_cast<int>(listed.size()));
}

// Megatron-LM, megatron/core/parallel_state.py, initialize_model_parallel's docstring: "Let's say
// we have a total of 16 GPUs denoted by g0 ... g15 and we use 2 GPUs to parallelize the model
// tensor, and 4 GPUs to parallelize the model pipeline. The present function will create 8 tensor
// model-parallel groups, 4 pipeline model-parallel groups and 8 data-parallel groups as:" the lists
// below. Megatron's default order is tp-dp-pp, tp fastest.
TEST(Mesh, ReproducesMegatronSixteenGpuExample) {
  using megatron = weft::mesh<weft::tp<2>, weft::dp<2>, weft::pp<4>>;
  static_assert(megatron::size == 16);
  expect_groups<megatron, axis::dp>(
      {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  expect_groups<megatron, axis::tp>(
      {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  expect_groups<megatron, axis::pp>({{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
}

// The same docstring, on context_parallel_size: "assume we have 8 GPUs, if tensor model parallel
// size is 4 and context parallel size is 2 ... Four groups are build to do context parallel
// communications: [GPU0, GPU4], [GPU1, GPU5], [GPU2, GPU6], and [GPU3, GPU7]."
TEST(Mesh, ReproducesMegatronContextParallelExample) {
  using megatron = weft::mesh<weft::tp<4>, weft::cp<2>>;
  expect_groups<megatron, axis::cp>({{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  expect_groups<megatron, axis::tp>({{0, 1, 2, 3}, {4, 5, 6, 7}});
}

TEST(Mesh, FirstAxisVariesFastest) {
  // mesh<dp<3>, tp<2>, ep<2>>: enumerate the coordinates with ep outermost, dp innermost.
  using m = weft::mesh<weft::dp<3>, weft::tp<2>, weft::ep<2>>;
  int r = 0;
  for (int e = 0; e < 2; ++e) {
    for (int t = 0; t < 2; ++t) {
      for (int d = 0; d < 3; ++d) {
        const mesh_coord expected{.tp = t, .dp = d, .ep = e};
        EXPECT_EQ(m::coords(r), expected) << "rank " << r;
        EXPECT_EQ(m::rank(expected), r);
        ++r;
      }
    }
  }
  EXPECT_EQ(r, m::size);
}

template <class Mesh>
void expect_round_trip() {
  for (int r = 0; r < Mesh::size; ++r) {
    EXPECT_EQ(Mesh::rank(Mesh::coords(r)), r);
  }
}

TEST(Mesh, RankOfCoordsIsIdentity) {
  expect_round_trip<weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>>();
  expect_round_trip<weft::mesh<weft::tp<8>, weft::pp<4>, weft::dp<4>>>();
  expect_round_trip<weft::mesh<weft::pp<3>, weft::ep<5>, weft::tp<2>, weft::cp<2>, weft::dp<3>>>();
  expect_round_trip<weft::mesh<weft::dp<7>>>();
  expect_round_trip<weft::mesh<weft::tp<1>, weft::dp<1>>>();
  const weft::mesh_layout l = weft::mesh<weft::tp<4>, weft::dp<dynamic>>::resolve(64);
  for (int r = 0; r < l.size(); ++r) {
    EXPECT_EQ(l.rank(l.coords(r)), r);
  }
}

// Every group agrees with a brute-force scan: the ranks whose coordinates differ only along A,
// ordered by A, and groups numbered by their smallest member.
TEST(Mesh, GroupsMatchBruteForce) {
  const weft::mesh_layout l =
      weft::mesh<weft::pp<3>, weft::tp<2>, weft::cp<2>, weft::dp<2>>::resolve(24);
  for (axis a : weft::all_axes) {
    std::vector<int> first_members;
    for (int r = 0; r < l.size(); ++r) {
      if (l.coords(r)[a] == 0) {
        first_members.push_back(r);
      }
    }
    for (int r = 0; r < l.size(); ++r) {
      std::vector<int> expected;
      for (int q = 0; q < l.size(); ++q) {
        mesh_coord cq = l.coords(q);
        mesh_coord cr = l.coords(r);
        cq[a] = 0;
        cr[a] = 0;
        if (cq == cr) {
          expected.push_back(q);
        }
      }
      EXPECT_EQ(l.group(a, r), expected);
      const auto where = std::find(first_members.begin(), first_members.end(), expected.front());
      EXPECT_EQ(l.group_index(a, r), static_cast<int>(where - first_members.begin()));
    }
  }
}

TEST(Mesh, DynamicAxisResolves) {
  const weft::mesh_layout l = mesh_dyn::resolve(32);
  EXPECT_EQ(l.size(), 32);
  EXPECT_EQ(l.extent(axis::pp), 8);
  EXPECT_EQ(l.name(), "tp2 x pp8 x dp2");
  ASSERT_EQ(l.axes().size(), 3U);
  EXPECT_EQ(l.axes()[0], (weft::axis_extent{axis::tp, 2}));
  EXPECT_EQ(l.axes()[1], (weft::axis_extent{axis::pp, 8}));
  EXPECT_EQ(l.axes()[2], (weft::axis_extent{axis::dp, 2}));
  EXPECT_EQ(l.group(axis::pp, 1), (std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15}));
  EXPECT_EQ(l.group(axis::dp, 1), (std::vector<int>{1, 17}));
  EXPECT_EQ(l.stride(axis::dp), 16);

  // A dynamic axis may come first too.
  const weft::mesh_layout d = weft::mesh<weft::dp<dynamic>, weft::tp<2>>::resolve(6);
  EXPECT_EQ(d.extent(axis::dp), 3);
  EXPECT_EQ(d.group(axis::tp, 4), (std::vector<int>{1, 4}));
}

TEST(Mesh, DynamicAxisRejectsIndivisibleWorld) {
  try {
    (void)mesh_dyn::resolve(14);
    FAIL() << "expected weft::error";
  } catch (const weft::error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tp2 x pp(dynamic) x dp2"), std::string::npos) << what;
    EXPECT_NE(what.find("world size 14 is not divisible"), std::string::npos) << what;
    EXPECT_NE(what.find("(4)"), std::string::npos) << what;
  }
  EXPECT_THROW((void)mesh_dyn::resolve(0), weft::error);
  EXPECT_THROW((void)mesh_dyn::resolve(-4), weft::error);
}

TEST(Mesh, StaticResolveChecksWorldSize) {
  EXPECT_EQ(mesh_tpd::resolve(8), mesh_tpd::layout());
  EXPECT_EQ(mesh_tpd::resolve(8).name(), "tp2 x pp2 x dp2");
  try {
    (void)mesh_tpd::resolve(16);
    FAIL() << "expected weft::error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("has 8 ranks but the world has 16"), std::string::npos)
        << e.what();
  }
}

TEST(Mesh, OutOfRangeThrows) {
  // Runtime arguments, so these are evaluated at run time rather than rejected at compile time.
  volatile int eight = 8;
  volatile int minus_one = -1;
  EXPECT_THROW((void)mesh_tpd::coords(eight), weft::error);
  EXPECT_THROW((void)mesh_tpd::coords(minus_one), weft::error);
  EXPECT_THROW((void)mesh_tpd::group<axis::tp>(eight), weft::error);
  EXPECT_THROW((void)mesh_tpd::group_index<axis::dp>(minus_one), weft::error);
  EXPECT_THROW((void)mesh_tpd::rank({.tp = eight / 4}), weft::error);
  EXPECT_THROW((void)mesh_tpd::rank({.dp = minus_one}), weft::error);
  try {
    (void)mesh_tpd::rank({.cp = eight / 8});
    FAIL() << "expected weft::error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("no such axis"), std::string::npos) << e.what();
  }
  try {
    (void)mesh_tpd::coords(eight);
    FAIL() << "expected weft::error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 8 is outside [0, 8)"), std::string::npos)
        << e.what();
  }
}

TEST(Mesh, LayoutRejectsBadAxes) {
  EXPECT_THROW((weft::mesh_layout{{axis::tp, 2}, {axis::tp, 2}}), weft::error);
  EXPECT_THROW((weft::mesh_layout{{axis::tp, 0}}), weft::error);
  EXPECT_THROW((weft::mesh_layout{{axis::tp, -2}}), weft::error);
  EXPECT_THROW((weft::mesh_layout{{axis::tp, 1 << 16}, {axis::dp, 1 << 16}}), weft::error);
  const weft::mesh_layout ok{{axis::ep, 4}, {axis::tp, 2}};
  EXPECT_EQ(ok.size(), 8);
  EXPECT_EQ(ok.group(axis::tp, 1), (std::vector<int>{1, 5}));
  EXPECT_EQ(ok.name(), "ep4 x tp2");
}

TEST(Mesh, EmptyMeshIsOneRank) {
  using m = weft::mesh<>;
  static_assert(m::size == 1);
  static_assert(m::rank_count == 0);
  static_assert(m::coords(0) == mesh_coord{});
  static_assert(m::group<axis::tp>(0) == std::array{0});
  EXPECT_EQ(weft::mesh_layout{}.size(), 1);
}

} // namespace
