// Two chunks per stage with a single pipeline stage.
// expected error: an interleaved schedule with V > 1 chunks needs a pipeline of 2 or more stages
#include <weft/strategy.hpp>

template struct weft::strategy<weft::mesh<weft::tp<2>, weft::pp<1>, weft::dp<2>>,
                               weft::pipeline::interleaved<2>, weft::optim::zero<1>,
                               weft::layer::recompute::none>;
