#include "support/collective_suite.hpp"

namespace {

using namespace weft;

template <class Algo>
class broadcast_algorithms : public ::testing::Test {};
using algorithms = ::testing::Types<algo::ring, algo::tree, algo::direct, algo::automatic>;
TYPED_TEST_SUITE(broadcast_algorithms, algorithms);

TYPED_TEST(broadcast_algorithms, matches_the_serial_reference) {
  test::sweep<TypeParam, collective::broadcast>();
}

TYPED_TEST(broadcast_algorithms, several_mib) {
  test::large<TypeParam, collective::broadcast>(3u << 20);
}

TEST(broadcast, rejects_a_root_outside_the_communicator) {
  local::run(3, [](local::communicator& c) {
    std::vector<int> v(4);
    try {
      broadcast(c, std::span(v), 3);
      ADD_FAILURE() << "root 3 of 3 must be rejected";
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("root 3 outside"), std::string::npos) << e.what();
    }
    EXPECT_THROW(broadcast(c, std::span(v), -1), error);
  });
}

} // namespace
