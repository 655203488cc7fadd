// Mesh is not a weft::mesh: a bare axis.
// expected error: Mesh must be a weft::mesh<...> of tp, pp and dp axes
#include <weft/strategy.hpp>

template struct weft::strategy<weft::tp<2>, weft::pipeline::one_f_one_b, weft::optim::zero<1>,
                               weft::layer::recompute::none>;
