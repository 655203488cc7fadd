#include <weft/comm/transport/local.hpp>
#include <weft/strategy.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

using mesh = weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>; // 8 ranks
using strategy = weft::strategy<mesh, weft::pipeline::interleaved<2>, weft::optim::zero<1>,
                                weft::layer::recompute::selective>;

int main() {
  const weft::strategy_config config{
      .model = {.vocab = 1000, .hidden = 256, .heads = 8, .seq = 64, .layers = 4},
      .micro_batch = 2,
      .global_batch = 16};
  // A learnable pattern: each token is the one before plus 1. The global batch, on every rank.
  std::vector<std::int32_t> ids(16 * 64), targets(16 * 64);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int32_t>((i * 7 + i / 64) % 1000);
    targets[i] = (ids[i] + 1) % 1000;
  }
  weft::local::run(strategy::size, [&](weft::local::communicator& world) { // or weft::mpi
    auto trainer = strategy::make(world, config, weft::optim::adamw{.lr = 2e-3f});
    for (int step = 0; step < 10; ++step) {
      const double loss = trainer->train_step(ids, targets); // every rank gets the loss
      if (world.rank() == 0) std::printf("step %d: loss %.4f\n", step + 1, loss);
    }
  });
}
