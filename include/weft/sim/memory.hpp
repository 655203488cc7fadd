#pragma once
// The memory account of a layout: the layers and weights each pipeline rank holds, the model
// states and activations of the fullest rank, and the micro-batches a schedule keeps in flight.
//
//   per pipeline rank r, per TP rank:
//     states       2 bytes of weights, grad_bytes of gradients, optimizer_bytes of optimizer state
//                  per weight the rank holds, each divided by the GPUs it is sharded over
//                  (layout::shard_groups: ZeRO-1 the optimizer state over the DP group, ZeRO-2
//                  the gradients too, ZeRO-3 the weights too; HSDP the same over its shard group)
//     activations  Korthikanti's per-layer bytes (model.hpp) x the rank's layers x the
//                  (micro-batch, chunk) pairs it holds at its peak / chunks; the first rank adds
//                  the token ids (and the embedding's dropout mask), the last the fp32 logits of
//                  one micro-batch; full recompute one layer's activations while it reruns
//     buffers      ZeRO-3's gathered weights: two layers', or all of the rank's where the
//                  forward's gathers stay for the backward, and its whole gradients where they
//                  accumulate across micro-batches (zero3_gather_bytes)
//   the layout's memory: the rank with the most of both together.
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/sim/layout.hpp>
#include <weft/sim/model.hpp>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace weft::sim {

namespace detail {

/// Layers of each pipeline rank: as even as possible, the extra ones on the middle ranks (the
/// first holds the embedding, the last the logits).
inline std::vector<int> layers_per_rank(const model_spec& m, int p) {
  std::vector<int> layers_of(static_cast<std::size_t>(p), m.layers / p);
  for (int extra = m.layers % p, i = 0; extra > 0; ++i, --extra)
    ++layers_of[static_cast<std::size_t>((p / 2 + (i % 2 == 0 ? i / 2 : -(i + 1) / 2) + p) % p)];
  return layers_of;
}

/// The weights each pipeline rank holds, per TP rank (the first adds the embedding, the last the
/// output layer).
inline std::vector<double> weights_per_rank(const model_spec& m, const layout& l,
                                            const std::vector<int>& layers_of) {
  const double input =
      static_cast<double>(m.vocab) * m.h() + (m.learned_positions ? m.seq * m.h() : 0.0);
  // The output layer: its own weights, or, tied, the embedding; with pp > 1 the last stage keeps a
  // copy of a tied embedding (Megatron-LM's, its gradient summed with the first stage's), so the
  // last stage holds vocab x hidden either way.
  const double output = static_cast<double>(m.vocab) * m.h();
  std::vector<double> w(layers_of.size());
  for (std::size_t r = 0; r < w.size(); ++r) {
    w[r] = layers_of[r] * m.layer_parameters();
    if (r == 0) w[r] += input;
    if (r + 1 == w.size() && (l.pp > 1 || !m.tied_embeddings)) w[r] += output;
    w[r] /= l.tp;
  }
  return w;
}

/// Weights held by the pipeline rank with the most of them, per TP rank.
inline double rank_parameters(const model_spec& m, const layout& l,
                              const std::vector<int>& layers_of) {
  const std::vector<double> w = weights_per_rank(m, l, layers_of);
  return *std::max_element(w.begin(), w.end());
}

/// ZeRO-3's whole (gathered) weights and gradients in 16 bits beside the shards, on a pipeline
/// rank holding `weights` per TP rank (0 below ZeRO-3). Resharding each block after its forward
/// and reduce-scattering every micro-batch, two blocks' weights: the one in use and the next,
/// prefetched. Every block's weights when the forward's gathers serve the backward
/// (reshard_after_forward false) or the step (sync once); every block's gradients
/// besides when some micro-batch's backward does not reduce-scatter them, so that they accumulate
/// whole until the step's last (sync last or once, over more
/// than one micro-batch): FSDP2 accumulates them in its reduce dtype (grad_bytes; FSDPParam's
/// unsharded_accumulated_grad), the others in 16 bits. Counted with the activations; explain()
/// shows it as buffers.
inline double zero3_gather_bytes(const model_spec& m, const layout& l, double weights) {
  if (l.zero < 3) return 0.0;
  const shard_cadence cadence = l.cadence();
  const bool whole_weights = !cadence.regather;
  const bool whole_gradients = cadence.reduces() < 1;
  const double gradient_bytes = l.sharding == shard_engine::fsdp2 ? l.grad_bytes : 2.0;
  return (whole_weights ? 2.0 * weights : 2.0 * 2.0 * m.layer_parameters() / l.tp) +
         (whole_gradients ? gradient_bytes * weights : 0.0);
}

/// The memory of the fullest rank (the most of all three together).
struct rank_memory {
  state_memory states;
  double activations = 0; // the activations alone
  double buffers = 0;     // ZeRO-3's whole weights and gradients (zero3_gather_bytes)
  [[nodiscard]] double total() const noexcept { return states.total() + activations + buffers; }
};

/// Model states, activations and ZeRO-3's buffers of the fullest rank, given how many
/// (micro-batch, chunk) pairs each pipeline rank holds at its peak (a chunk's pair holds 1/V of
/// the rank's layers).
inline rank_memory memory_of(const model_spec& m, const layout& l,
                             const std::vector<int>& layers_of, const std::vector<int>& peak) {
  const int t = l.tp, p = l.pp;
  // With context parallelism a rank holds 1/cp of each sequence's tokens (b / cp sequences'
  // worth), and its attention's queries against the whole sequence.
  const double b = static_cast<double>(l.micro_batch) / l.cp, T = b * m.seq, h = m.h(),
               v = l.chunks;
  const std::vector<double> weights = weights_per_rank(m, l, layers_of);
  const double per_layer =
      activation_bytes_per_layer(m, b, t, l.sequence_parallel, l.recomputation);
  rank_memory worst{};
  for (int r = 0; r < p; ++r) {
    const double held = peak[static_cast<std::size_t>(r)];
    double a = per_layer * layers_of[static_cast<std::size_t>(r)] * held / v;
    if (l.recomputation == recompute::full) // one layer's activations live while recomputed
      a += activation_bytes_per_layer(m, b, t, l.sequence_parallel, recompute::none);
    // The first stage keeps each micro-batch's token ids (int64) for the embedding's backward
    // and, with dropout, the embedding dropout's 1-byte mask (split over TP by sequence
    // parallelism); the embedding's output is the first layer's input, counted with the layer
    // (Korthikanti et al. 2022, section 4.3; Megatron-LM's theoretical_memory_usage.py: 8sb and
    // sbh per micro-batch in flight).
    if (r == 0)
      a += (8.0 * T + (m.dropout ? T * h / (l.sequence_parallel ? t : 1) : 0.0)) * held / v;
    if (r == p - 1) a += 4.0 * T * m.vocab / t; // fp32 logits
    const rank_memory here{state_memory_of(weights[static_cast<std::size_t>(r)], l.shard_groups(),
                                           l.grad_bytes, l.optimizer_bytes),
                           a, zero3_gather_bytes(m, l, weights[static_cast<std::size_t>(r)])};
    if (r == 0 || here.total() > worst.total()) worst = here;
  }
  return worst;
}

/// The most (micro-batch, chunk) pairs each rank of `s` holds at once: from its F until its
/// B (W when the backward is split).
inline std::vector<int> peak_in_flight(const pipeline::schedule& s) {
  std::vector<int> peak(static_cast<std::size_t>(s.stages), 0);
  for (int r = 0; r < s.stages; ++r) {
    int held = 0;
    auto& top = peak[static_cast<std::size_t>(r)];
    for (const pipeline::action& a : s.ranks[static_cast<std::size_t>(r)]) {
      if (a.kind == pipeline::action_kind::forward)
        top = std::max(top, ++held);
      else if (a.kind ==
               (s.split_backward ? pipeline::action_kind::weight : pipeline::action_kind::backward))
        --held;
    }
  }
  return peak;
}

} // namespace detail

/// Bytes per GPU of `l` (model states and activations) without simulating the step: what the
/// planner checks before it simulates.
/// `peak`: the (micro-batch, chunk) pairs each pipeline rank holds at most
/// (detail::peak_in_flight of the layout's schedule), when the caller has it.
[[nodiscard]] inline double estimate_memory(const model_spec& m, const layout& l,
                                            const std::vector<int>& peak) {
  return detail::memory_of(m, l, detail::layers_per_rank(m, l.pp), peak).total();
}

[[nodiscard]] inline double estimate_memory(const model_spec& m, const layout& l) {
  return estimate_memory(
      m, l,
      detail::peak_in_flight(pipeline::generate(l.schedule, l.pp, l.microbatches(), l.chunks)));
}

} // namespace weft::sim
