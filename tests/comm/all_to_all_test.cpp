#include "support/collective_suite.hpp"

namespace {

using namespace weft;

template <class Algo>
class all_to_all_algorithms : public ::testing::Test {};
using algorithms = ::testing::Types<algo::pairwise, algo::direct, algo::automatic>;
TYPED_TEST_SUITE(all_to_all_algorithms, algorithms);

TYPED_TEST(all_to_all_algorithms, matches_the_serial_reference) {
  test::sweep<TypeParam, collective::all_to_all>();
}

TYPED_TEST(all_to_all_algorithms, several_mib) {
  test::large<TypeParam, collective::all_to_all>(1u << 18);
}

TEST(all_to_all, rejects_sizes_not_divisible_by_the_ranks) {
  local::run(3, [](local::communicator& c) {
    std::vector<int> in(7), out(7);
    EXPECT_THROW(all_to_all(c, std::span<const int>(in), std::span(out)), error);
  });
}

} // namespace
