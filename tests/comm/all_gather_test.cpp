#include "support/collective_suite.hpp"

namespace {

using namespace weft;

template <class Algo>
class all_gather_algorithms : public ::testing::Test {};
using algorithms =
    ::testing::Types<algo::ring, algo::halving_doubling, algo::direct, algo::automatic>;
TYPED_TEST_SUITE(all_gather_algorithms, algorithms);

TYPED_TEST(all_gather_algorithms, matches_the_serial_reference) {
  test::sweep<TypeParam, collective::all_gather>();
}

TYPED_TEST(all_gather_algorithms, several_mib) {
  test::large<TypeParam, collective::all_gather>(1u << 19);
}

TEST(all_gather, rejects_sizes_that_do_not_match) {
  local::run(3, [](local::communicator& c) {
    std::vector<int> in(4), out(11);
    EXPECT_THROW(all_gather(c, std::span<const int>(in), std::span(out)), error);
  });
}

} // namespace
