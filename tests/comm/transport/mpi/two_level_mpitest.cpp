// weft::two_level over MPI processes: each level an mpi::communicator split from the world,
// every collective it offers against the serial reference, with the typed checks of
// tests/support/collective_suite.hpp (every type and op, in and out of place, several roots),
// and the outputs bitwise identical across processes where they are replicated. ctest runs it
// with WEFT_TOPOLOGY grouping the processes into emulated nodes (even, uneven, one node); every
// run also builds a two_level whose nodes interleave in rank order (rank r on node r mod 2).
#include <weft/comm/two_level.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/transport/mpi/mpi_support.hpp"
#include "support/collective_suite.hpp"

namespace {

using namespace weft;

// 256-byte chunks: the 3001-element calls go by a dozen pipelined chunks and rank-block pieces.
constexpr two_level_options small_chunks{.chunk_bytes = 256};

// The world split as make_two_level splits it, but by `node_of` (the MPI world's own nodes are
// contiguous, so interleaved ones must be given).
two_level<mpi::communicator> split_by(mpi::communicator& world, const std::vector<int>& node_of) {
  const int rank = world.rank();
  const int color = detail::node_color(node_of, rank);
  mpi::communicator intra = world.split(color, rank);
  mpi::communicator inter = world.split(intra.rank(), color);
  return two_level<mpi::communicator>(std::move(intra), std::move(inter), node_of, rank,
                                      small_chunks);
}

template <class Algo, collective C, class TwoLevel>
void sweep(TwoLevel& tl, const std::string& what) {
  const int p = tl.size();
  for (std::size_t count : test::counts_for(p))
    test::check_all_types<Algo, C>(tl, count, p - 1);
  if constexpr (C == collective::broadcast || C == collective::reduce) {
    for (int root = 0; root < p - 1; ++root) {
      test::call_and_check<Algo, C, std::int32_t, op::sum>(tl, 7, root, test::pattern::exact,
                                                           false);
    }
  }
  if constexpr (C == collective::all_reduce || C == collective::all_gather ||
                C == collective::broadcast) {
    auto mine =
        test::call_and_check<Algo, C, float, op::sum>(tl, 2049, 0, test::pattern::random, false);
    test::expect_identical_across_processes(
        test::mpi_world(), mine,
        what + ": " + std::string(name_of(C)) + "<" + std::string(Algo::name) + ">");
  }
}

template <class Algo, class TwoLevel>
void every_collective(TwoLevel& tl, const std::string& what) {
  sweep<Algo, collective::all_reduce>(tl, what);
  sweep<Algo, collective::reduce_scatter>(tl, what);
  sweep<Algo, collective::all_gather>(tl, what);
  sweep<Algo, collective::broadcast>(tl, what);
  sweep<Algo, collective::reduce>(tl, what);
}

// The world's nodes (WEFT_TOPOLOGY): automatic at both levels, and ring inside with tree
// across (tree plans neither reduce_scatter nor all_gather: the rank-block paths).
TEST(two_level_on_mpi, every_collective_on_the_worlds_nodes) {
  auto& world = test::mpi_world();
  auto tl = make_two_level(world, small_chunks);
  EXPECT_EQ(tl.size(), world.size());
  EXPECT_EQ(tl.node_of(), world.node_of());
  every_collective<algo::levels<>>(tl, "world's nodes");
  every_collective<algo::levels<algo::ring, algo::tree>>(tl, "world's nodes, ring/tree");
}

// Two nodes whose ranks alternate: reduce_scatter and all_gather reorder through scratch.
TEST(two_level_on_mpi, every_collective_on_interleaved_nodes) {
  auto& world = test::mpi_world();
  if (world.size() < 3) GTEST_SKIP() << "interleaving needs a node of two ranks or more";
  std::vector<int> node_of;
  for (int r = 0; r < world.size(); ++r)
    node_of.push_back(r % 2);
  auto tl = split_by(world, node_of);
  EXPECT_EQ(tl.nodes(), 2);
  every_collective<algo::levels<>>(tl, "interleaved");
}

// About 1 MiB per rank, in the default 4 MiB chunks: float within tolerance and identical on
// every process where replicated, int exact.
TEST(two_level_on_mpi, one_mib) {
  auto& world = test::mpi_world();
  auto tl = make_two_level(world);
  const auto p = static_cast<std::size_t>(world.size());
  const std::size_t n = (std::size_t{1} << 18) + 3;
  auto sum = test::call_and_check<algo::levels<>, collective::all_reduce, float, op::sum>(
      tl, n, 0, test::pattern::random, false);
  test::expect_identical_across_processes(world, sum, "all_reduce 1 MiB");
  test::call_and_check<algo::levels<>, collective::all_reduce, std::int32_t, op::sum>(
      tl, n, 0, test::pattern::exact, true);
  test::call_and_check<algo::levels<>, collective::reduce_scatter, float, op::sum>(
      tl, n / p, 0, test::pattern::random, false);
  auto all = test::call_and_check<algo::levels<>, collective::all_gather, float, op::sum>(
      tl, n / p, 0, test::pattern::random, false);
  test::expect_identical_across_processes(world, all, "all_gather 1 MiB");
}

} // namespace
