// zero_bubble_h1 splits the backward into input and weight gradients; the layers do not.
// expected error: (zero_bubble_h1), which weft's layers compute together
#include <weft/strategy.hpp>

template struct weft::strategy<weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>,
                               weft::pipeline::zero_bubble_h1, weft::optim::zero<1>,
                               weft::layer::recompute::none>;
