// The umbrella header, exercised with the example on the README's first screen.
#include <weft/weft.hpp>

#include <gtest/gtest.h>

namespace {

TEST(weft, the_readme_example_runs_and_gives_the_expected_values) {
  using mesh = weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>; // first axis varies fastest
  static_assert(mesh::size == 8);
  static_assert(mesh::coords(5) == mesh::coord{.tp = 1, .pp = 0, .dp = 1});

  auto topo = weft::topology::parse("2x4,intra=shm:20GB/s:1us,inter=net:2GB/s:20us");

  weft::local::run(topo, [&](weft::local::communicator& world) {
    auto comms = weft::make_comms<mesh>(world, topo);
    EXPECT_EQ(comms.dp().size(), 2);
    std::vector<float> grad(1 << 20, 1.0f);
    weft::all_reduce(comms.dp(), std::span(grad)); // 1 + 1
    EXPECT_EQ(grad.front(), 2.0f);
    EXPECT_EQ(grad.back(), 2.0f);
    grad[7] = static_cast<float>(world.rank());
    weft::all_reduce<weft::algo::ring>(comms.dp(), std::span(grad), weft::op::max{});
    // dp partner of rank r is r +- 4 (tp and pp vary faster): the max of the two ranks
    EXPECT_EQ(grad[7], static_cast<float>(world.rank() % 4 + 4));
    weft::all_reduce<weft::algo::hierarchical<weft::algo::ring, weft::algo::tree>>(world,
                                                                                   std::span(grad));
    EXPECT_EQ(grad.front(), 16.0f);
    EXPECT_EQ(grad[7], 2.0f * (4 + 5 + 6 + 7)); // each value on two ranks
  });
}

} // namespace
