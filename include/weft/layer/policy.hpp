#pragma once
// Sequence parallelism as a policy of the tensor-parallel layers. Without it, the regions between
// the tensor-parallel layers (LayerNorm, residuals, dropout) hold every token on every rank of the
// TP group, and a column/row-parallel pair costs an all-reduce each way. With it those regions are
// split along the tokens (rows): the row-parallel layer's all-reduce becomes a reduce-scatter to
// the rank's rows and the column-parallel layer starts with an all-gather of them, the same bytes
// on the wire and 1/tp of the activation memory in between.
//
//   weft::layer::column_parallel_linear<float, Comm, cblas, weft::layer::sequence_parallel>
//       fc(...);
//
// Under sequence_parallel the number of tokens must divide by the TP size (else weft::error).

#include <concepts>

namespace weft::layer {

struct no_sequence_parallel {
  static constexpr bool enabled = false;
};
struct sequence_parallel {
  static constexpr bool enabled = true;
};

template <class P>
concept sequence_policy = requires {
  { P::enabled } -> std::convertible_to<bool>;
};

} // namespace weft::layer
