// The control: a good composition, with every slot filled, which must compile, trainer and all
// (so a harness that fails every file, whatever it holds, fails this test).
// expected: compiles
#include <weft/comm/transport/local.hpp>
#include <weft/layer/llama.hpp>
#include <weft/strategy.hpp>

#include <cstdint>
#include <vector>

using good = weft::strategy<weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>,
                            weft::pipeline::interleaved<2>,
                            weft::optim::hybrid<weft::optim::zero<3>, weft::optim::zero<0>>,
                            weft::layer::recompute::selective, weft::layer::sequence_parallel>;
template struct weft::strategy<weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>,
                               weft::pipeline::interleaved<2>,
                               weft::optim::hybrid<weft::optim::zero<3>, weft::optim::zero<0>>,
                               weft::layer::recompute::selective, weft::layer::sequence_parallel>;

double train(weft::local::communicator& world, const std::vector<std::int32_t>& ids) {
  auto trainer =
      good::make(world,
                 {.model = {.vocab = 64, .hidden = 16, .heads = 4, .seq = 8, .layers = 4},
                  .micro_batch = 1,
                  .global_batch = 4},
                 weft::optim::adamw{});
  return trainer->train_step(ids, ids);
}

using good_llama =
    weft::strategy<weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>, weft::pipeline::one_f_one_b,
                   weft::optim::zero<3>, weft::layer::recompute::full,
                   weft::layer::sequence_parallel, weft::layer::llama_model>;

double train_llama(weft::local::communicator& world, const std::vector<std::int32_t>& ids) {
  auto trainer = good_llama::make(
      world,
      {.model = {.vocab = 64, .hidden = 16, .heads = 4, .kv_heads = 1, .seq = 8, .layers = 4},
       .global_batch = 4});
  return trainer->train_step(ids, ids);
}
