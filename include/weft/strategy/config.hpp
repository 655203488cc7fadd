#pragma once
// weft::strategy's configuration (what it trains and how the batch is cut) and its memory
// account, by category (weft/strategy.hpp).
#include <weft/layer/gpt.hpp>
#include <weft/optim/data_parallel.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace weft {

/// What the strategy trains and how the batch is cut.
template <class ModelConfig>
struct basic_strategy_config {
  ModelConfig model = {};
  std::size_t micro_batch = 1;  // sequences per microbatch
  std::size_t global_batch = 0; // sequences per step, over all DP ranks
  std::uint64_t seed = 1;       // the model's initialisation (layer/init.hpp)
  /// Blocks per virtual stage (V * pp entries); empty: an even split (layers % (V * pp) == 0).
  std::vector<int> layout = {};
  /// The cluster, for make_comms's placement check (a TP group must stay inside a node).
  std::optional<topology::cluster> cluster = std::nullopt;
  optim::data_parallel_options optimizer = {};
  /// zero<3>: how many units (blocks, the embedding and head stages) are gathered ahead of the
  /// one in use, in the order the schedule uses them; unset: 1. Not for zero<0..2>.
  std::optional<int> prefetch = std::nullopt;
  /// zero<2>/<3> over several microbatches: each unit's gradients reduce-scattered once a step,
  /// after its last backward (last), or after every backward, only the shard kept between
  /// microbatches (every; optim::gradient_sync). Not for zero<0>/<1>.
  optim::gradient_sync gradient_sync = optim::gradient_sync::last;
};

/// What a trainer holds on this rank, by category: now (current) and the most at once during
/// the last step (peak). Bytes. (strategy<...>::trainer::memory())
struct memory_account {
  struct amount {
    std::size_t current = 0;
    std::size_t peak = 0;
  };
  amount
      weights; // the optimizer's parameter buffer, which the layers compute in (zero<3>: the shard)
  amount gathered_weights; // zero<3>: units' full parameters, gathered for use or prefetched
  amount gradients;        // the optimizer's gradient buffer (zero<2>/<3>: the shard)
  amount gradient_buckets; // zero<2>/<3>: full buckets the backward accumulates into until reduced
  amount optimizer_state;  // the rule's state (Adam: two floats per element of the shard)
  amount master_weights;   // fp32 copies of 16-bit parameters (none: the strategy trains in float)
  amount activations;      // the stashes of the microbatches in flight (saved for their backward)
  bool activations_counted = true; // false: the model's stashes have no bytes() to count
  amount scratch;                  // the optimizer's communication staging
  amount workspace; // the layers' other host buffers: a block's scratch, the logits, a
                    // microbatch's activations until they are stashed
  /// Every category's current bytes.
  [[nodiscard]] std::size_t total() const noexcept {
    return weights.current + gathered_weights.current + gradients.current +
           gradient_buckets.current + optimizer_state.current + master_weights.current +
           activations.current + scratch.current + workspace.current;
  }
  /// All parameter bytes at their most: the buffer and the gathered units.
  [[nodiscard]] std::size_t peak_parameters() const noexcept {
    return weights.peak + gathered_weights.peak;
  }
};
/// The configuration of a strategy that trains layer::gpt_model.
using strategy_config = basic_strategy_config<layer::gpt_config>;

} // namespace weft
