#pragma once
// Activation recompute, a policy per transformer block: what the forward keeps for the backward.
//
//   none       everything the backward reads (each layer's inputs, the attention probabilities)
//   selective  all but the attention probabilities (batch x heads x seq x seq, the largest and
//              cheapest to recompute: two GEMMs and a softmax per head), recomputed in backward
//   full       only the block's input; the backward runs the block's forward again first
//              (its communication too), then its backward
//
//   weft::layer::transformer_block<float, Comm, cblas, no_sequence_parallel, recompute::selective>
//       b(...);

#include <concepts>

namespace weft::layer::recompute {

struct none {};
struct selective {};
struct full {};

template <class P>
concept policy = std::same_as<P, none> || std::same_as<P, selective> || std::same_as<P, full>;

} // namespace weft::layer::recompute
