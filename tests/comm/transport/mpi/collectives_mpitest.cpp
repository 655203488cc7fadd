// Every collective with every algorithm that plans it, on MPI processes, against the serial
// reference: the typed checks of tests/support/collective_suite.hpp, written once for all
// transports, run here with one rank per process. ctest runs this program under mpirun with
// 2, 3, 4 and 8 processes, and with WEFT_TOPOLOGY grouping them into uneven emulated nodes.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "comm/transport/mpi/mpi_support.hpp"
#include "support/collective_suite.hpp"

namespace {

using namespace weft;

using hier_rr = algo::hierarchical<algo::ring, algo::ring>;
using hier_rt = algo::hierarchical<algo::ring, algo::tree>;

// The sweep of collective_suite.hpp for the world's size: every count of counts_for(p),
// every type and op, several roots, and the bitwise check across processes.
template <class Algo, collective C>
void sweep() {
  auto& c = test::mpi_world();
  const int p = c.size();
  for (std::size_t count : test::counts_for(p))
    test::check_all_types<Algo, C>(c, count, p - 1);
  if (C == collective::broadcast || C == collective::reduce) {
    for (int root = 0; root < p - 1; ++root) {
      test::call_and_check<Algo, C, std::int32_t, op::sum>(c, 7, root, test::pattern::exact, false);
    }
  }
  if (C == collective::all_reduce || C == collective::all_gather || C == collective::broadcast) {
    auto mine =
        test::call_and_check<Algo, C, float, op::sum>(c, 2049, 0, test::pattern::random, false);
    test::expect_identical_across_processes(
        c, mine, std::string(name_of(C)) + "<" + std::string(Algo::name) + ">");
  }
}

// About 1 MiB on every rank (the total for the collectives whose buffers hold p blocks):
// float random within tolerance, identical on all processes where the result is replicated,
// and int exact.
template <class Algo, collective C>
void mib() {
  auto& c = test::mpi_world();
  const auto p = static_cast<std::size_t>(c.size());
  const bool blocks =
      C == collective::reduce_scatter || C == collective::all_gather || C == collective::all_to_all;
  const std::size_t count =
      (std::size_t{1} << 18) / (blocks ? p : 1) + 3; // + 3: not divisible by p
  auto mine = test::call_and_check<Algo, C, float, op::sum>(c, count, c.size() / 2,
                                                            test::pattern::random, false);
  if (C == collective::all_reduce || C == collective::all_gather || C == collective::broadcast) {
    test::expect_identical_across_processes(c, mine, "1 MiB");
  }
  test::call_and_check<Algo, C, std::int32_t, op::sum>(c, count, 0, test::pattern::exact,
                                                       C == collective::all_reduce);
}

// Typed tests named after their algorithm ("all_reduce_on_mpi/hierarchical_ring_tree_"), so
// that ctest can pick the hierarchical ones for the emulated-node runs.
struct algorithm_names {
  template <class Algo>
  static std::string GetName(int) {
    std::string s(Algo::name);
    for (char& ch : s) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    }
    s.erase(std::unique(s.begin(), s.end(), [](char a, char b) { return a == '_' && b == '_'; }),
            s.end());
    return s;
  }
};

template <class Algo>
class all_reduce_on_mpi : public ::testing::Test {};
using all_reduce_algorithms =
    ::testing::Types<algo::ring, algo::tree, algo::halving_doubling, algo::recursive_doubling,
                     hier_rr, hier_rt, algo::automatic>;
TYPED_TEST_SUITE(all_reduce_on_mpi, all_reduce_algorithms, algorithm_names);
TYPED_TEST(all_reduce_on_mpi, matches_the_serial_reference) {
  sweep<TypeParam, collective::all_reduce>();
}
TYPED_TEST(all_reduce_on_mpi, one_mib) { mib<TypeParam, collective::all_reduce>(); }

template <class Algo>
class reduce_scatter_on_mpi : public ::testing::Test {};
using reduce_scatter_algorithms =
    ::testing::Types<algo::ring, algo::halving_doubling, algo::automatic>;
TYPED_TEST_SUITE(reduce_scatter_on_mpi, reduce_scatter_algorithms, algorithm_names);
TYPED_TEST(reduce_scatter_on_mpi, matches_the_serial_reference) {
  sweep<TypeParam, collective::reduce_scatter>();
}
TYPED_TEST(reduce_scatter_on_mpi, one_mib) { mib<TypeParam, collective::reduce_scatter>(); }

template <class Algo>
class all_gather_on_mpi : public ::testing::Test {};
using all_gather_algorithms = ::testing::Types<algo::ring, algo::halving_doubling, algo::automatic>;
TYPED_TEST_SUITE(all_gather_on_mpi, all_gather_algorithms, algorithm_names);
TYPED_TEST(all_gather_on_mpi, matches_the_serial_reference) {
  sweep<TypeParam, collective::all_gather>();
}
TYPED_TEST(all_gather_on_mpi, one_mib) { mib<TypeParam, collective::all_gather>(); }

template <class Algo>
class broadcast_on_mpi : public ::testing::Test {};
using broadcast_algorithms =
    ::testing::Types<algo::ring, algo::tree, hier_rr, hier_rt, algo::automatic>;
TYPED_TEST_SUITE(broadcast_on_mpi, broadcast_algorithms, algorithm_names);
TYPED_TEST(broadcast_on_mpi, matches_the_serial_reference) {
  sweep<TypeParam, collective::broadcast>();
}
TYPED_TEST(broadcast_on_mpi, one_mib) { mib<TypeParam, collective::broadcast>(); }

template <class Algo>
class reduce_on_mpi : public ::testing::Test {};
using reduce_algorithms =
    ::testing::Types<algo::ring, algo::tree, hier_rr, hier_rt, algo::automatic>;
TYPED_TEST_SUITE(reduce_on_mpi, reduce_algorithms, algorithm_names);
TYPED_TEST(reduce_on_mpi, matches_the_serial_reference) { sweep<TypeParam, collective::reduce>(); }
TYPED_TEST(reduce_on_mpi, one_mib) { mib<TypeParam, collective::reduce>(); }

template <class Algo>
class all_to_all_on_mpi : public ::testing::Test {};
using all_to_all_algorithms = ::testing::Types<algo::pairwise, algo::automatic>;
TYPED_TEST_SUITE(all_to_all_on_mpi, all_to_all_algorithms, algorithm_names);
TYPED_TEST(all_to_all_on_mpi, matches_the_serial_reference) {
  sweep<TypeParam, collective::all_to_all>();
}
TYPED_TEST(all_to_all_on_mpi, one_mib) { mib<TypeParam, collective::all_to_all>(); }

// The nodes the world was given: emulated by WEFT_TOPOLOGY when ctest sets it (uneven
// shapes such as 3+5), else the real ones (this machine: one node).
TEST(placement, node_of_follows_the_topology) {
  auto& c = test::mpi_world();
  const char* spec = std::getenv("WEFT_TOPOLOGY");
  const auto want =
      spec != nullptr && *spec != '\0' ? topology::parse(spec) : topology::host(c.size());
  EXPECT_EQ(c.cluster().devices_per_node(), want.devices_per_node());
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(c.devices()[static_cast<std::size_t>(r)], r);
    EXPECT_EQ(c.node_of()[static_cast<std::size_t>(r)], want.node_of(r));
  }
}

} // namespace
