// MPI's own collectives through weft (algo::vendor on weft::mpi) against the serial reference,
// for every collective, type and operator MPI serves, and automatic's measured choice between
// them and weft's plans: the rule on given prices, and a first call that measures. ctest runs
// this program under mpirun with 2, 3 and 4 processes on the machine's real node.
#include <weft/comm/measured_prices.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "comm/transport/mpi/mpi_support.hpp"
#include "support/collective_suite.hpp"

namespace {

using namespace weft;

// Every count of counts_for(p), roots 0 and p-1, each operator MPI has built in for the
// reducing collectives (op::sum alone for the others, which do not reduce).
template <collective C, class T>
void check_type(mpi::communicator& c) {
  const int p = c.size();
  constexpr bool reduces =
      C == collective::all_reduce || C == collective::reduce_scatter || C == collective::reduce;
  for (std::size_t count : test::counts_for(p)) {
    for (int root : {0, p - 1}) {
      if (root != 0 && C != collective::broadcast && C != collective::reduce) continue;
      test::call_and_check<algo::vendor, C, T, op::sum>(c, count, root, test::pattern::exact,
                                                        false);
      if constexpr (reduces) {
        test::call_and_check<algo::vendor, C, T, op::prod>(c, count, root, test::pattern::exact,
                                                           false);
        test::call_and_check<algo::vendor, C, T, op::min>(c, count, root, test::pattern::exact,
                                                          false);
        test::call_and_check<algo::vendor, C, T, op::max>(c, count, root, test::pattern::exact,
                                                          false);
        test::call_and_check<algo::vendor, C, T, op::avg>(c, count, root, test::pattern::exact,
                                                          false);
      }
    }
  }
  if constexpr (C == collective::all_reduce) {
    test::call_and_check<algo::vendor, C, T, op::sum>(c, 1000, 0, test::pattern::exact, true);
    test::call_and_check<algo::vendor, C, T, op::avg>(c, 1000, 0, test::pattern::exact, true);
  }
  if constexpr (std::is_floating_point_v<T>) {
    test::call_and_check<algo::vendor, C, T, op::sum>(c, 2049, 0, test::pattern::random, false);
  }
}

template <collective C>
void check_collective(mpi::communicator& c) {
  check_type<C, float>(c);
  check_type<C, double>(c);
  check_type<C, std::int32_t>(c);
  check_type<C, std::int64_t>(c);
}

void check_every_collective(mpi::communicator& c) {
  check_collective<collective::all_reduce>(c);
  check_collective<collective::reduce_scatter>(c);
  check_collective<collective::all_gather>(c);
  check_collective<collective::broadcast>(c);
  check_collective<collective::reduce>(c);
  check_collective<collective::all_to_all>(c);
}

TEST(vendor, every_collective_type_and_operator_against_the_reference) {
  check_every_collective(test::mpi_world());
}

// Under throw_error the call runs on weft's copy of the buffers (a failed call must leave no
// request on the caller's): the same results.
TEST(vendor, through_weft_memory_under_throw_error) {
  auto c = mpi::world({.timeout = test::mpi_test_timeout,
                       .topology = {},
                       .on_failure = weft::on_failure::throw_error});
  check_every_collective(c);
}

TEST(vendor, on_split_communicators) {
  auto& w = test::mpi_world();
  auto half = w.split(w.rank() % 2, -w.rank()); // reversed order inside each half
  check_collective<collective::all_reduce>(half);
  check_collective<collective::reduce>(half);
  check_collective<collective::all_gather>(half);
}

TEST(vendor, a_wrong_size_is_an_error) {
  auto& c = test::mpi_world();
  std::vector<float> in(5, 1.0f), out(4, 0.0f);
  try {
    c.vendor<collective::all_reduce>(in.data(), in.size(), out.data(), out.size(), 5, 0, op::sum{});
    FAIL() << "no error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("needs an input of 5 elements and an output of 5"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(c.failed()); // found before any data moved
}

// How vendor hands MPI its buffers: in place only where MPI runs in place, copied where they
// overlap otherwise.
TEST(vendor, buffer_layout) {
  using detail::mpi_vendor_buffers;
  using detail::mpi_vendor_layout;
  float b[64] = {};
  const std::size_t f = sizeof(float);
  EXPECT_EQ(mpi_vendor_layout(collective::all_reduce, b, 8 * f, b, 8 * f, 1, 0, 8 * f),
            mpi_vendor_buffers::in_place);
  EXPECT_EQ(mpi_vendor_layout(collective::all_reduce, b, 8 * f, b + 8, 8 * f, 1, 0, 8 * f),
            mpi_vendor_buffers::apart);
  EXPECT_EQ(mpi_vendor_layout(collective::all_reduce, b, 8 * f, b + 4, 8 * f, 1, 0, 8 * f),
            mpi_vendor_buffers::staged);
  // all_gather: in place where the input is the rank's block of the output.
  EXPECT_EQ(mpi_vendor_layout(collective::all_gather, b + 16, 8 * f, b, 32 * f, 2, 0, 8 * f),
            mpi_vendor_buffers::in_place);
  EXPECT_EQ(mpi_vendor_layout(collective::all_gather, b + 8, 8 * f, b, 32 * f, 2, 0, 8 * f),
            mpi_vendor_buffers::staged);
  // reduce: in place at the root only; a non-root has no output.
  EXPECT_EQ(mpi_vendor_layout(collective::reduce, b, 8 * f, b, 8 * f, 0, 0, 8 * f),
            mpi_vendor_buffers::in_place);
  EXPECT_EQ(mpi_vendor_layout(collective::reduce, b, 8 * f, b, 8 * f, 1, 0, 8 * f),
            mpi_vendor_buffers::apart);
  // reduce_scatter and all_to_all never run in place.
  EXPECT_EQ(mpi_vendor_layout(collective::reduce_scatter, b, 32 * f, b, 8 * f, 0, 0, 8 * f),
            mpi_vendor_buffers::staged);
  EXPECT_EQ(mpi_vendor_layout(collective::all_to_all, b, 32 * f, b + 32, 32 * f, 0, 0, 8 * f),
            mpi_vendor_buffers::apart);
  EXPECT_EQ(mpi_vendor_layout(collective::broadcast, b, 8 * f, b, 8 * f, 0, 0, 8 * f),
            mpi_vendor_buffers::apart);
}

mpi::communicator measured_world() {
  return mpi::world({.timeout = test::mpi_test_timeout,
                     .topology = {},
                     .measured_automatic = mpi::measured_automatic()});
}

std::size_t candidate_index(std::string_view name) {
  const auto table = algo::candidates();
  for (std::size_t i = 0; i < table.size(); ++i)
    if (table[i].name == name) return i;
  ADD_FAILURE() << "no candidate " << name;
  return 0;
}

// Measured prices at 4 KiB and 64 KiB: ring's and the vendor's as given, every other plan
// unmeasured.
measured_prices given_prices(std::vector<double> ring, std::vector<double> vendor) {
  measured_prices m;
  m.bytes = {4096, 65536};
  m.seconds.assign(algo::candidates().size(), {});
  m.seconds[candidate_index("ring")] = std::move(ring);
  m.vendor = std::move(vendor);
  return m;
}

std::string pick(mpi::communicator& c, const measured_prices& m, std::size_t bytes) {
  c.measured_prices_of(collective::all_reduce) = std::make_shared<const measured_prices>(m);
  return std::string(automatic_choice<collective::all_reduce, float>(c, bytes / 4).name());
}

// The rule on given prices (no timing): the vendor unless a plan is measured cheaper at the
// call's size, by straight lines between the measured sizes.
TEST(measured_automatic, takes_the_vendor_unless_a_plan_is_measured_cheaper) {
  auto c = measured_world();
  ASSERT_TRUE(c.measures_automatic());
  // vendor 10 us at 4 KiB, 100 us at 64 KiB; ring 20 us and 50 us. At 8 KiB: vendor 16, ring
  // 22; at 16 KiB: vendor 28, ring 26; at 64 KiB: vendor 100, ring 50.
  const auto m = given_prices({20e-6, 50e-6}, {10e-6, 100e-6});
  EXPECT_EQ(pick(c, m, 4096), "vendor");
  EXPECT_EQ(pick(c, m, 8192), "vendor");
  EXPECT_EQ(pick(c, m, 16384), "ring");
  EXPECT_EQ(pick(c, m, 65536), "ring");
  EXPECT_EQ(pick(c, m, 1024), "vendor"); // below the sizes: the smallest size's figures
  // A tie goes to the vendor.
  EXPECT_EQ(pick(c, given_prices({10e-6, 50e-6}, {10e-6, 60e-6}), 4096), "vendor");
  // No vendor measured: the cheapest plan.
  EXPECT_EQ(pick(c, given_prices({10e-6, 50e-6}, {}), 4096), "ring");
  // The call runs what the choice names: ring's result is bitwise the same on every rank.
  c.measured_prices_of(collective::all_reduce) =
      std::make_shared<const measured_prices>(given_prices({1e-6, 1e-6}, {1.0, 1.0}));
  test::call_and_check<algo::automatic, collective::all_reduce, float, op::sum>(
      c, 3000, 0, test::pattern::exact, false);
}

// The first automatic call measures weft's candidates and MPI's collective, all ranks alike,
// and later calls (and other communicators of the shape) reuse the figures.
TEST(measured_automatic, the_first_call_measures_the_vendor_too) {
  auto c = measured_world();
  ASSERT_FALSE(c.measured_prices_of(collective::all_reduce));
  test::call_and_check<algo::automatic, collective::all_reduce, float, op::sum>(
      c, 1024, 0, test::pattern::exact, false);
  const auto m = c.measured_prices_of(collective::all_reduce);
  ASSERT_TRUE(m);
  ASSERT_FALSE(m->vendor.empty());
  ASSERT_FALSE(m->bytes.empty());
  EXPECT_EQ(m->bytes.front(), 4096.0);
  for (double s : m->vendor)
    EXPECT_TRUE(s > 0 && std::isfinite(s)) << s;
  EXPECT_TRUE(std::isfinite(m->estimate(candidate_index("ring"), 4096)));
  // Every rank has the same figures (the slowest rank's): the bits of rank 0's.
  test::expect_identical_across_processes(c, m->vendor, "measured vendor prices");
  // Another communicator of the same shape takes them from the process's cache.
  auto d = measured_world();
  test::call_and_check<algo::automatic, collective::all_reduce, std::int32_t, op::sum>(
      d, 100, 0, test::pattern::exact, false);
  EXPECT_EQ(d.measured_prices_of(collective::all_reduce), m);
  // half has no MPI reduction: automatic runs weft's plans on the same measurement.
  test::call_and_check<algo::automatic, collective::all_reduce, half, op::sum>(
      d, 100, 0, test::pattern::exact, false);
  EXPECT_FALSE((automatic_choice<collective::all_reduce, half>(d, 100).vendor));
}

// A process in several groups of one shape holds the last one's measurement; a group takes a
// kept one where its ranks hold the same (by digest), the lowest rank's where they hold
// different ones, and measures only where some rank holds none. With groups A = {0, 1}, then
// C = {0, 2}, then B = {1, 2}: at B's first call process 1 holds A's table and process 2 C's;
// each taking its own would pick differently and mismatch. B takes A's, from process 1.
TEST(measured_automatic, a_group_takes_the_same_measurement_on_every_rank) {
  auto world = measured_world();
  if (world.size() < 3) GTEST_SKIP() << "needs 3 processes";
  const auto& nodes = world.node_of();
  if (std::any_of(nodes.begin(), nodes.end(), [&](int n) { return n != nodes.front(); }))
    GTEST_SKIP() << "the groups span nodes: each shape its own measurement";
  const int r = world.rank();
  const auto first_call = [](mpi::communicator& g) {
    test::call_and_check<algo::automatic, collective::broadcast, float, op::sum>(
        g, 300, 0, test::pattern::exact, false);
    const auto m = g.measured_prices_of(collective::broadcast);
    EXPECT_TRUE(m);
    const std::uint64_t d = m ? detail::digest(*m) : 0;
    test::expect_identical_across_processes(g, std::vector<std::uint64_t>{d},
                                            "the table a group's ranks take");
    return d;
  };
  std::uint64_t a = 0;
  for (const auto& in_group :
       {std::vector<int>{0, 1}, std::vector<int>{0, 2}, std::vector<int>{1, 2}}) {
    const bool in = r == in_group[0] || r == in_group[1];
    auto g = world.split(in ? 0 : 1, r);
    if (!in) continue;
    const std::uint64_t d = first_call(g);
    if (in_group[1] == 1) a = d; // A
    // B: process 1's table (A's); process 2 learns it from the call
    if (in_group[0] == 1 && r == 1) {
      EXPECT_EQ(d, a) << "B measured anew or took C's";
    }
  }
}

// The first call past 4 MiB continues the group's table at the large sizes, MPI's collective
// too, the same on every rank.
TEST(measured_automatic, the_first_call_past_4_mib_measures_the_large_sizes) {
  auto c = measured_world();
  test::call_and_check<algo::automatic, collective::broadcast, float, op::sum>(
      c, 1024, 0, test::pattern::exact, false);
  const auto first = c.measured_prices_of(collective::broadcast);
  ASSERT_TRUE(first);
  EXPECT_FALSE(first->large);
  test::call_and_check<algo::automatic, collective::broadcast, float, op::sum>(
      c, 1048577, 0, test::pattern::exact, false);
  const auto m = c.measured_prices_of(collective::broadcast);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->large);
  ASSERT_EQ(m->bytes.size(), first->bytes.size() + 2); // 16 and 64 MiB: p x 128 MiB < 1 GiB
  EXPECT_EQ(m->bytes.back(), 64.0 * 1048576.0);
  // MPI's collective goes on too where it was measured at every first size.
  if (first->vendor.size() == first->bytes.size()) {
    EXPECT_GT(m->vendor.size(), first->vendor.size());
  }
  test::expect_identical_across_processes(c, std::vector<std::uint64_t>{detail::digest(*m)},
                                          "the large table");
}

TEST(measured_automatic, not_on_emulated_nodes) {
  const int p = test::mpi_world().size();
  auto c = mpi::world(
      {.timeout = test::mpi_test_timeout,
       .topology = topology::cluster({p}, topology::default_link(topology::link_kind::shm),
                                     topology::default_link(topology::link_kind::ethernet)),
       .measured_automatic = mpi::measured_automatic()});
  EXPECT_FALSE(c.measures_automatic());
  auto d = measured_world();
  EXPECT_TRUE(d.measures_automatic());
  auto e = d.split(0, d.rank()); // a split inherits the option
  EXPECT_TRUE(e.measures_automatic());
}

TEST(measured_automatic, every_rank_must_pass_the_same) {
  try {
    (void)mpi::world({.timeout = test::mpi_test_timeout,
                      .topology = {},
                      .on_failure = weft::on_failure::throw_error,
                      .measured_automatic =
                          test::mpi_world().rank() == 0 ? mpi::measured_automatic() : nullptr});
    FAIL() << "no error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("disagree on mpi::options::measured_automatic"),
              std::string::npos)
        << e.what();
  }
}

} // namespace
