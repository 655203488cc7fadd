// The sharding slot holds an optimizer rule instead of a ZeRO stage.
// expected error: Sharding must be weft::optim::zero<0..3> or weft::optim::hybrid<zero<k>, zero<0>>
#include <weft/strategy.hpp>

template struct weft::strategy<weft::mesh<weft::tp<2>, weft::dp<2>>, weft::pipeline::one_f_one_b,
                               weft::optim::adamw, weft::layer::recompute::none>;
