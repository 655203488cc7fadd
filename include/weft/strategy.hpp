#pragma once
// weft::strategy<Mesh, Schedule, Sharding, Recompute, SequenceParallel, Model>: the whole 3D
// composition. Model is any weft model (weft/layer/model.hpp: an embedding stage, blocks, a head
// stage): layer::gpt_model by default, layer::llama_model, or a user's own; the same parameters
// from the same seed as layer::sequential<Model> on one rank, trained over a TP x PP x DP mesh:
//
//   using S = weft::strategy<weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>,
//                            weft::pipeline::interleaved<2>, weft::optim::zero<1>,
//                            weft::layer::recompute::selective>;
//   weft::local::run(S::size, [&](weft::local::communicator& world) {
//     auto trainer = S::make(
//         world, {.model = {.vocab = 1000, .hidden = 256, .heads = 8, .seq = 64, .layers = 4},
//                 .micro_batch = 2, .global_batch = 16},
//         weft::optim::adamw{.lr = 1e-3f});
//     double loss = trainer->train_step(ids, targets);  // the global batch, the same on every rank
//   });
//
// What it wires, per rank (make_comms<Mesh> gives the tp, pp and dp communicators):
//   tp  the layers (weft/layer/): every block, the embedding, the head and the loss split over it
//   pp  a pipeline::executor<Schedule> over the virtual stages: V * pp of them (V = the
//       schedule's chunks), virtual stage v = chunk * pp + rank as in Megatron's interleaving.
//       Stage 0 holds the embedding stage, the last the head stage (norm, output, loss); the blocks
//       split evenly, or as config::layout says (blocks per virtual stage, or a layout string,
//       pipeline_layout::parse). Each microbatch in flight keeps its own activations (the
//       layers' stash()/restore()), so the recompute policy holds per microbatch.
//   dp  an optim::data_parallel<Sharding> over this rank's parameters (its TP slice of its
//       stages' layers): each DP rank takes global_batch / dp samples of the batch in
//       global_batch / (dp * micro_batch) microbatches; the gradients are summed over the
//       microbatches and the DP group. Weight decay applies where each parameter says
//       (parameter::decay: not to biases and norms), in every ZeRO stage.
// The loss is the mean over the global batch's counted targets (targets equal to the head's
// ignore_index do not count): every microbatch's loss and gradient is its counted tokens' sum
// divided by the whole batch's count, which every rank knows from the targets it is given, so
// microbatches and replicas that count different numbers of tokens weigh each token the same.
// A tied model (layer::tied) keeps a copy of the embedding table as the head's weight on the
// last stage (the first stage's values, sent there at construction) and the two gradients are
// summed between the first and the last pipeline stage before the optimizer, so the copies stay
// equal (Megatron's embedding group).
//
// Gradient clipping (config.optimizer.max_grad_norm) scales by the norm over the whole model:
// the squared partials all-reduced once over the ranks holding one replica of every shard (TP x
// PP, and DP under zero<1..3>), tensor-replicated parameters counted on TP rank 0 only and the
// tied head not at all (the embedding table carries the same gradient), as Megatron counts them.
//
// The loss train_step returns is the mean counted-token loss over the global batch, on every
// rank.
//
// Memory. The layers compute in the optimizer's flat buffers: each layer matrix (a weight, a
// bias, a fused QKV weight) is bound (matrix::bind) to its stretch of a bucket, found from the
// parameters' storage homes (layer::parameter::value_home, grad_home), so nothing is copied
// between layers and optimizer. The optimizer's tensors are grouped in units, each the
// parameters of one stage part (the embedding stage, the head stage, each block):
//   zero<0..2>  the layers' parameters are the parameter buffer (zero<1>/<2>: a unit waits for its
//               bucket's all-gather from the last step before it runs); gradients accumulate over
//               the microbatches in the gradient buffer (zero<2>: in the bucket, which is
//               reduce-scattered and freed once every unit in it has finished its last backward)
//   zero<3>     as FSDP wraps each block: a unit's parameters are gathered just before its forward
//               and again before its backward, and freed after each; the next config.prefetch
//               units in the order the schedule runs them (default 1) are gathered meanwhile on
//               the progress thread, so a rank holds its shard plus at most 1 + prefetch units'
//               full parameters. Each unit is its own bucket (unless optimizer.bucket_elements
//               says otherwise); its gradients accumulate unsharded over the step's microbatches
//               (FSDP without gradient sync on the accumulation steps) and are reduce-scattered
//               after its last backward. hybrid<zero<3>, zero<0>> likewise, sharded in the group.
// A unit's gradients are final after its last microbatch's backward: the sequence-parallel
// partial sums are reduced over TP then and its tensors marked ready, so the DP reductions start
// during the pipeline's remaining backward work (a tied model's embedding and head after the
// pipeline, once the embedding group has summed them). memory() counts what the rank holds, by
// category (memory_account): the optimizer's buffers, the gathered units, the gradient buckets,
// the communication scratch, and the stashes of the microbatches in flight, each stash as its
// bytes() says.
//
// Compile-time errors name what to change (a model that lacks a part, a mesh that is no
// weft::mesh or has context/expert axes, zero_bubble_h1 whose split backward the layers do not
// provide, sequence parallelism without tensor parallelism, V > 1 chunks on one pipeline stage);
// run-time errors (weft::error) name the bad value: a world that does not match the mesh, layers
// that do not split as asked, heads or vocabulary against the TP size, batches that do not divide,
// a TP group across nodes.
//
// The pieces, in weft/strategy/: config.hpp (the configuration and the memory account),
// trainer.hpp (the trainer's body, shared by every mesh), weights.hpp (the weights files),
// snapshot.hpp, traits.hpp (what the strategy reads of its parameters at compile time).
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/core/error.hpp>
#include <weft/io/safetensors.hpp>
#include <weft/layer/block.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/cross_entropy.hpp>
#include <weft/layer/embedding.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/layer/layer_norm.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/model.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>
#include <weft/layer/recompute.hpp>
#include <weft/layer/weights.hpp>
#include <weft/mesh/make_comms.hpp>
#include <weft/mesh/mesh.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/optim/optimizers.hpp>
#include <weft/optim/param_set.hpp>
#include <weft/optim/sharding.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/layout.hpp>
#include <weft/strategy/config.hpp>
#include <weft/strategy/trainer.hpp>
#include <weft/strategy/traits.hpp>
#include <weft/topology/topology.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft {

template <class Mesh, class Schedule, class Sharding, class Recompute,
          class SequenceParallel = layer::no_sequence_parallel, class Model = layer::gpt_model>
struct strategy {
  static_assert(detail::is_mesh_v<Mesh>,
                "weft::strategy<Mesh, ...>: Mesh must be a weft::mesh<...> of tp, pp and dp axes, "
                "e.g. weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>");
  static_assert(
      detail::mesh_has_only_tp_pp_dp<Mesh>(),
      "weft::strategy: the mesh may have only tp, pp and dp axes; context (cp) and expert (ep) "
      "parallelism are not part of the strategy: drop those axes");
  static_assert(pipeline::schedule_policy<Schedule>,
                "weft::strategy<Mesh, Schedule, ...>: Schedule must be a pipeline schedule policy: "
                "weft::pipeline::gpipe, one_f_one_b or interleaved<V>");
  static_assert(
      !detail::splits_backward<Schedule>(),
      "weft::strategy: the schedule splits the backward into input and weight gradients "
      "(zero_bubble_h1), which weft's layers compute together: use weft::pipeline::gpipe, "
      "one_f_one_b or interleaved<V>");
  static_assert(
      optim::sharding_policy<Sharding>,
      "weft::strategy<Mesh, Schedule, Sharding, ...>: Sharding must be weft::optim::zero<0..3> or "
      "weft::optim::hybrid<zero<k>, zero<0>>");
  static_assert(layer::recompute::policy<Recompute>,
                "weft::strategy<..., Recompute>: Recompute must be weft::layer::recompute::none, "
                "selective or full");
  static_assert(
      layer::sequence_policy<SequenceParallel>,
      "weft::strategy<..., SequenceParallel>: must be weft::layer::no_sequence_parallel or "
      "weft::layer::sequence_parallel");

  static constexpr int tp_size = detail::static_extent<Mesh, axis::tp>();
  static constexpr int pp_size = detail::static_extent<Mesh, axis::pp>();
  static constexpr int dp_size = detail::static_extent<Mesh, axis::dp>();
  static constexpr int chunks = detail::schedule_chunks<Schedule>();

  static_assert(
      !detail::sequence_parallel_enabled<SequenceParallel>() || tp_size != 1,
      "weft::strategy: sequence parallelism splits the tokens over the tensor-parallel group, "
      "and this mesh has tp<1>: use weft::layer::no_sequence_parallel or a tp axis of 2 or more");
  static_assert(
      chunks == 1 || pp_size != 1,
      "weft::strategy: an interleaved schedule with V > 1 chunks needs a pipeline of 2 or more "
      "stages; with pp<1> use weft::pipeline::one_f_one_b (or interleaved<1>)");

  /// The mesh's ranks (0 when an axis is weft::dynamic).
  static constexpr int size = detail::static_size<Mesh>();

  using config = basic_strategy_config<typename layer::detail::config_of<Model>::type>;

  template <class Rule, communicator Comm>
  class trainer;

  /// Collective over `world`: splits it by the mesh and builds this rank's part of the model
  /// and its optimizer (see the header comment).
  template <class Rule = optim::adamw, communicator Comm>
  static std::unique_ptr<trainer<Rule, Comm>> make(Comm& world, config cfg, Rule rule = {}) {
    return std::make_unique<trainer<Rule, Comm>>(world, std::move(cfg), rule);
  }
};

template <class Mesh, class Schedule, class Sharding, class Recompute, class SP, class Model>
template <class Rule, communicator Comm>
class strategy<Mesh, Schedule, Sharding, Recompute, SP, Model>::trainer
    : public detail::strategy_trainer<Schedule, Sharding, Recompute, SP, Model, Rule, Comm> {
public:
  trainer(Comm& world, config cfg, Rule rule)
      : detail::strategy_trainer<Schedule, Sharding, Recompute, SP, Model, Rule, Comm>(
            world, std::move(cfg), rule, &split) {}

private:
  static axis_comms<Comm> split(Comm& world, const config& c) {
    if constexpr (Mesh::size > 0) {
      if (world.size() != Mesh::size) {
        throw error("strategy", world.rank(), error::unknown,
                    "the mesh has " + std::to_string(Mesh::size) + " ranks but the world has " +
                        std::to_string(world.size()));
      }
    }
    return c.cluster ? make_comms<Mesh>(world, *c.cluster) : make_comms<Mesh>(world);
  }
};

} // namespace weft
