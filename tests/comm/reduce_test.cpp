#include "support/collective_suite.hpp"

namespace {

using namespace weft;

template <class Algo>
class reduce_algorithms : public ::testing::Test {};
using algorithms = ::testing::Types<algo::ring, algo::tree, algo::direct, algo::automatic>;
TYPED_TEST_SUITE(reduce_algorithms, algorithms);

TYPED_TEST(reduce_algorithms, matches_the_serial_reference) {
  test::sweep<TypeParam, collective::reduce>();
}

TYPED_TEST(reduce_algorithms, several_mib) { test::large<TypeParam, collective::reduce>(3u << 20); }

TEST(reduce, root_output_must_match_and_others_may_be_empty) {
  local::run(3, [](local::communicator& c) {
    std::vector<int> in(5, c.rank() + 1), out(c.rank() == 1 ? 5 : 0);
    reduce(c, std::span<const int>(in), std::span(out), 1);
    if (c.rank() == 1) {
      EXPECT_EQ(out, std::vector<int>(5, 6));
    }
    std::vector<int> bad(4);
    if (c.rank() == 0) {
      EXPECT_THROW(reduce(c, std::span<const int>(in), std::span(bad), 0), error);
    }
  });
}

} // namespace
