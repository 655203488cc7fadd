// The schedule slot holds a sharding policy.
// expected error: Schedule must be a pipeline schedule policy
#include <weft/strategy.hpp>

template struct weft::strategy<weft::mesh<weft::pp<2>>, weft::optim::zero<1>, weft::optim::zero<1>,
                               weft::layer::recompute::none>;
