#pragma once
// Sharding policies for data parallelism (the ZeRO stages), as empty tag types:
//
//   zero<0>   everything replicated; gradients all-reduced               (plain DDP)
//   zero<1>   optimizer state and fp32 master weights sharded: gradients reduce-scattered,
//             each rank updates its shard, parameters all-gathered
//   zero<2>   gradients sharded too: each bucket is reduce-scattered as soon as it is complete
//             and its full-size buffer freed (over several micro-batches a bucket completes after
//             the last by default, so it is full all step: gradient_sync every reduces it after
//             each micro-batch instead, as DeepSpeed's stage 2 does)
//   zero<3>   parameters sharded too: a bucket's parameters are all-gathered before use (with
//             the next bucket prefetched) and freed after
//   hybrid<zero<k>, zero<0>>   zero<k> inside a node, replicated across nodes (HSDP): the
//             shards are reduced across the nodes' replicas with an all-reduce
//
// gradient_sync says when a step of several micro-batches reduces zero<2>/<3>'s gradients.
#include <concepts>
#include <cstdint>
#include <type_traits>

namespace weft::optim {

template <int Stage>
struct zero {
  static_assert(Stage >= 0 && Stage <= 3, "weft::optim::zero<Stage>: Stage must be 0, 1, 2 or 3");
  static constexpr int stage = Stage;
  static constexpr bool is_hybrid = false;
};

template <class Inner, class Outer>
struct hybrid {
  static_assert(Inner::stage >= 1 && !Inner::is_hybrid,
                "weft::optim::hybrid<Inner, Outer>: Inner must be zero<1>, zero<2> or zero<3> (the "
                "sharding inside a node)");
  static_assert(std::is_same_v<Outer, zero<0>>,
                "weft::optim::hybrid<Inner, Outer>: Outer must be zero<0> (replication across "
                "nodes); sharding across "
                "nodes too is plain zero<Stage> over the whole data-parallel group");
  static constexpr int stage = Inner::stage;
  static constexpr bool is_hybrid = true;
};

/// When zero<2>/<3> reduce the gradients of a step of several micro-batches (a trainer's
/// basic_strategy_config::gradient_sync; data_parallel::reduce_bucket does `every`'s reductions):
///   last   each unit's whole gradients accumulate over the step in full-size buckets and are
///          reduce-scattered once, after its last backward: one reduction a step, whole
///          gradients held meanwhile (PyTorch FSDP under no_sync, Megatron-core's overlapped
///          reduce-scatter)
///   every  each micro-batch's gradients are reduce-scattered after the unit's backward and
///          added into this rank's shard, so only the shard is kept between micro-batches: one
///          reduction a micro-batch (DeepSpeed's ZeRO stage 2 and 3, FSDP outside no_sync)
enum class gradient_sync : std::uint8_t { last, every };

template <class P>
concept sharding_policy = requires {
  { P::stage } -> std::convertible_to<int>;
  { P::is_hybrid } -> std::convertible_to<bool>;
};

} // namespace weft::optim
