// Model is not a weft model: a configuration struct where the model family belongs.
// expected error: weft: a model names its configuration: using config = ...
#include <weft/comm/transport/local.hpp>
#include <weft/strategy.hpp>

using S =
    weft::strategy<weft::mesh<weft::tp<1>, weft::pp<1>, weft::dp<1>>, weft::pipeline::one_f_one_b,
                   weft::optim::zero<1>, weft::layer::recompute::none,
                   weft::layer::no_sequence_parallel, weft::layer::gpt_config>;

void train(weft::local::communicator& world) { (void)S::make(world, {}); }
