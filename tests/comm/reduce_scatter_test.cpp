#include "support/collective_suite.hpp"

namespace {

using namespace weft;

template <class Algo>
class reduce_scatter_algorithms : public ::testing::Test {};
using algorithms =
    ::testing::Types<algo::ring, algo::halving_doubling, algo::direct, algo::automatic>;
TYPED_TEST_SUITE(reduce_scatter_algorithms, algorithms);

TYPED_TEST(reduce_scatter_algorithms, matches_the_serial_reference) {
  test::sweep<TypeParam, collective::reduce_scatter>();
}

TYPED_TEST(reduce_scatter_algorithms, several_mib) {
  test::large<TypeParam, collective::reduce_scatter>(1u << 19);
}

TEST(reduce_scatter, rejects_sizes_that_do_not_match) {
  local::run(3, [](local::communicator& c) {
    std::vector<float> in(10), out(3);
    EXPECT_THROW(reduce_scatter(c, std::span<const float>(in), std::span(out)), error);
    std::vector<float> ok(9);
    EXPECT_THROW(reduce_scatter(c, std::span<const float>(ok), std::span(ok.data() + 3, 3)),
                 error); // overlap
  });
}

} // namespace
