// Sequence parallelism splits the tokens over the TP group, and tp<1> has none to split over.
// expected error: and this mesh has tp<1>: use weft::layer::no_sequence_parallel
#include <weft/strategy.hpp>

template struct weft::strategy<weft::mesh<weft::tp<1>, weft::pp<2>, weft::dp<2>>,
                               weft::pipeline::one_f_one_b, weft::optim::zero<1>,
                               weft::layer::recompute::none, weft::layer::sequence_parallel>;
