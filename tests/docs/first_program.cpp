#include <weft/weft.hpp>

#include <cstdio>
#include <span>
#include <vector>

// 8 ranks; tp varies fastest.
using mesh = weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>;
using hierarchical = weft::algo::hierarchical<weft::algo::ring, weft::algo::tree>;

int main() {
  // 2 nodes of 4 ranks: the ranks are threads of this process, the nodes emulated.
  auto topo = weft::topology::parse("2x4,intra=shm:20GB/s:1us,inter=net:2GB/s:20us");
  weft::local::run(topo, [&](weft::local::communicator& world) {
    // One communicator per axis, their placement checked against the topology.
    auto comms = weft::make_comms<mesh>(world, topo);
    std::vector<float> grad(1 << 20, 1.0f);
    weft::all_reduce(comms.dp(), std::span(grad)); // the cost model's algorithm, sum
    weft::all_reduce<weft::algo::ring>(comms.dp(), std::span(grad), weft::op::max{});
    weft::all_reduce<hierarchical>(world, std::span(grad)); // across the nodes
    if (world.rank() == 0) {
      std::printf("grad[0] = %g\n", grad[0]); // 2 summed, max'd, then 8 summed: 16
    }
  });
}
