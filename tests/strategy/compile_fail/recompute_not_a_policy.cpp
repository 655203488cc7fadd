// The recompute slot holds a sequence-parallel policy (the two last arguments swapped).
// expected error: Recompute must be weft::layer::recompute::none, selective or full
#include <weft/strategy.hpp>

template struct weft::strategy<weft::mesh<weft::tp<2>, weft::dp<2>>, weft::pipeline::one_f_one_b,
                               weft::optim::zero<1>, weft::layer::sequence_parallel,
                               weft::layer::recompute::selective>;
