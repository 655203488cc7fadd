// An expert-parallel axis, which the strategy does not wire.
// expected error: context (cp) and expert (ep) parallelism are not part of the strategy
#include <weft/strategy.hpp>

template struct weft::strategy<weft::mesh<weft::pp<2>, weft::ep<2>>, weft::pipeline::one_f_one_b,
                               weft::optim::zero<0>, weft::layer::recompute::none>;
