#pragma once
// weft's own host trainer as the simulator's device: weft::strategy<Mesh, Schedule, zero<k>,
// Recompute, SP, Model> (strategy.hpp) training layer::gpt_model or layer::llama_model in float32
// on the CPU. The host "device" is memory only: it has no FLOP/s, bandwidth or links, so nothing
// here is timed. What is predicted is what one rank (pp rank, tp rank) allocates, by the
// categories of the trainer's account (trainer::memory(), memory_account: each one's peak over a
// step), so that the two can be set side by side:
//
//   weights           the optimizer's parameter buffer, which the layers use: the padded buckets
//                     (zero<3>: this rank's shard of them)
//   gathered_weights  zero<3>: full buckets gathered at once, at most 1 + prefetch of them: the
//                     1 + prefetch largest (an upper bound)
//   gradients         the persistent gradient buffer: padded (zero<2>, <3>: the shard)
//   gradient_buckets  zero<2>, <3>: full-size buckets the backward accumulates into until they
//                     are reduced: all of them (an upper bound); gradient_sync every: a tied
//                     model's embedding and head units (whole over the step) and the two largest
//                     other units, the one whose backward runs and the one being reduced (an
//                     upper bound; with the reductions keeping up, the largest alone)
//   optimizer_state   slots x optim::slot_stride(shard) floats (AdamW: 2 slots, SGD: 0, with
//                     momentum 1); the gap between slots counts, as it is allocated
//   master_weights    0: float parameters need no fp32 copy
//   activations       the most stash bytes held at once: this pp rank's actions of the schedule
//                     (pipeline::generate) walked, each (microbatch, chunk) holding its blocks'
//                     stashes from its F to its B
//
// The rank's parameters form units, in the optimizer's order: [the embedding stage, pp rank 0],
// [the head stage, last pp rank], each block of chunk 0, of chunk 1, .... A bucket closes at a unit
// boundary once it holds bucket_elements (default optim::default_bucket_elements(dp); zero<3>, and
// zero<2> under gradient_sync every: one bucket per unit) and is padded to a multiple of the shard
// group (zero<0>: 1 rank, zero<1..3>: dp). The head holds its own output weight also when tied (a
// copy of the table, on the last stage, at pp = 1 too). Parameter elements per TP rank, with h
// hidden, d = h / heads, a = heads / tp, g the rank's kv heads (kv / tp, or 1 where tp > kv:
// replicated), W = (a + 2g) d (GPT: 3 a d) and split_range's shares V_r of the vocabulary and f_r
// of the FFN:
//
//   GPT block    4h (two LayerNorms) + W h + W (q, k, v) + a d h + h (output; its bias replicated)
//                + f_r h + f_r + h f_r + h (MLP)            tp = 1, f = 4h: 12 h^2 + 13 h
//   Llama block  2h (two RMSNorms) + W h + a d h + 3 h f_r (gate, up, down; no biases)
//   embedding    V_r h (+ seq h of learned positions, GPT)
//   head         V_r h + 2h (GPT's LayerNorm) or + h (Llama's RMSNorm)
//
// Stash bytes of one block for one microbatch of T = micro_batch x seq tokens, R = T / tp rows
// under sequence parallelism (else T), float 4 bytes; the norms keep x-hat and 1/std in double:
//
//   both norms              2 x 8 R (h + 1)
//   attention               4 T (h + W + a d)     its input (gathered), q k v, and the output
//                                                 projection's input (the context)
//     + probabilities       4 b a s^2             unless selective recompute (b = micro_batch)
//   GPT MLP                 4 T (h + 2 f_r)       its input (gathered), fc1's output, fc2's input
//   Llama MLP               4 T (h + 3 f_r)       its input (gathered), gate's and up's outputs,
//                                                 down's input
//   full recompute          4 R h                 the block's input only
//
// and the embedding stage's (pp rank 0, chunk 0) the T token ids, 4 T. The column-parallel
// layers keep their gathered input, so sequence parallelism shrinks the norms' share only. Not
// predicted: the account's scratch (the optimizer's communication staging) and the layers' own
// work buffers, which every microbatch reuses (the head's logits among them).
#include <weft/core/error.hpp>
#include <weft/layer/init.hpp>
#include <weft/optim/optimizers.hpp>
#include <weft/optim/param_set.hpp>
#include <weft/optim/sharding.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/layout.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/sim/model.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::sim {

/// The model family the host trainer builds (model.hpp's model_family): layer::gpt_model
/// (LayerNorm, GELU MLP, biases, learned positions) or layer::llama_model (RMSNorm, SwiGLU, no
/// biases, rotary, grouped-query).
using host_family = model_family;

/// The model, as layer::gpt_config or layer::llama_config gives it.
struct host_model {
  host_family family = host_family::gpt;
  std::size_t vocab = 0;
  std::size_t hidden = 0;
  std::size_t heads = 0;
  std::size_t kv_heads = 0; // llama: key/value heads, 0: as many as heads; gpt: 0
  std::size_t ffn = 0;      // 0: the family's default (llama_config::ffn_size(); GPT 4 hidden)
  std::size_t seq = 0;
  std::size_t layers = 0;
  bool tied = false; // tie_embeddings

  /// The MLP's width: as given, or GPT's 4 hidden, or Llama's (model.hpp's llama_ffn).
  [[nodiscard]] constexpr std::size_t ffn_size() const noexcept {
    if (ffn != 0) return ffn;
    if (family == host_family::gpt) return 4 * hidden;
    return static_cast<std::size_t>(llama_ffn(static_cast<int>(hidden)));
  }
  [[nodiscard]] constexpr std::size_t kv() const noexcept {
    return kv_heads == 0 ? heads : kv_heads;
  }
};

/// The strategy's mesh, schedule, sharding and policies, and the optimizer's options.
struct host_layout {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int chunks = 1; // V: pipeline::interleaved<V>
  pipeline::schedule_kind schedule = pipeline::schedule_kind::one_f_one_b;
  int micro_batch = 1;  // sequences per microbatch
  int global_batch = 0; // sequences per step over the DP ranks; 0: one microbatch per DP rank
  int zero = 0;         // optim::zero<0..3>
  recompute recomputation = recompute::none;
  bool sequence_parallel = false;
  std::size_t bucket_elements = 0; // 0: the optimizer's default (see the header comment)
  int prefetch = 1;                // zero<3>: units gathered ahead of the one in use
  optim::gradient_sync gradient_sync = optim::gradient_sync::last; // zero<2>/<3>'s
  int slots = 2;                          // the rule's state per element: adamw 2, sgd 0 or 1
  std::vector<int> blocks_per_stage = {}; // per virtual stage (V x pp); empty: an even split

  [[nodiscard]] int batch() const noexcept {
    return global_batch > 0 ? global_batch : dp * micro_batch;
  }
  [[nodiscard]] int microbatches() const noexcept { return batch() / (dp * micro_batch); }
};

/// Bytes one rank allocates, by category (see the header comment).
struct host_memory {
  std::size_t weights = 0;
  std::size_t gathered_weights = 0;
  std::size_t gradients = 0;
  std::size_t gradient_buckets = 0;
  std::size_t optimizer_state = 0;
  std::size_t master_weights = 0;
  std::size_t activations = 0;
  /// Every category at its peak at once: an upper bound of the rank's peak.
  [[nodiscard]] std::size_t total() const noexcept {
    return weights + gathered_weights + gradients + gradient_buckets + optimizer_state +
           master_weights + activations;
  }
};

/// Elements of one TP rank's slice of each part of the model.
struct host_parameters {
  std::size_t embedding = 0;
  std::size_t block = 0;
  std::size_t head = 0;
};

/// Bytes one microbatch's stash holds: a block's, and the embedding stage's.
struct host_stash {
  std::size_t block = 0;
  std::size_t embedding = 0;
};

namespace detail {

/// Throws weft::error naming what the host trainer would refuse.
inline void check_host(const host_model& m, const host_layout& l) {
  const auto fail = [](const std::string& what) { throw error("weft: sim: host: " + what); };
  const auto positive = [&](const char* what, long long v) {
    if (v < 1) fail(std::string(what) + " must be at least 1, not " + std::to_string(v));
  };
  const auto n = [](std::size_t v) { return std::to_string(v); };
  positive("vocab", static_cast<long long>(m.vocab));
  positive("hidden", static_cast<long long>(m.hidden));
  positive("heads", static_cast<long long>(m.heads));
  positive("seq", static_cast<long long>(m.seq));
  positive("layers", static_cast<long long>(m.layers));
  positive("tp", l.tp);
  positive("pp", l.pp);
  positive("dp", l.dp);
  positive("chunks", l.chunks);
  positive("micro_batch", l.micro_batch);
  if (m.hidden % m.heads != 0)
    fail("hidden " + n(m.hidden) + " does not divide into " + n(m.heads) + " heads");
  const auto tp = static_cast<std::size_t>(l.tp);
  if (m.heads % tp != 0)
    fail(n(m.heads) + " heads do not divide over a tensor-parallel group of " + n(tp));
  if (m.family == host_family::gpt && m.kv_heads != 0 && m.kv_heads != m.heads)
    fail("GPT's attention has a key/value head per head; kv_heads " + n(m.kv_heads) +
         " applies to llama");
  if (m.family == host_family::llama) {
    if (m.heads % m.kv() != 0)
      fail(n(m.heads) + " query heads do not divide into groups over " + n(m.kv()) +
           " key/value heads");
    if (m.kv() % tp != 0 && tp % m.kv() != 0)
      fail(n(m.kv()) + " key/value heads and a tensor-parallel group of " + n(tp) +
           ": neither divides the other");
    if (m.hidden / m.heads % 2 != 0)
      fail("rotary positions pair the halves of a head, and head dimension " +
           n(m.hidden / m.heads) + " is odd");
  }
  if (l.zero < 0 || l.zero > 3)
    fail("ZeRO stage must be 0, 1, 2 or 3, not " + std::to_string(l.zero));
  if (l.prefetch < 0) fail("prefetch must not be negative, not " + std::to_string(l.prefetch));
  if (l.gradient_sync == optim::gradient_sync::every) { // the trainer's own refusals
    if (l.zero < 2) fail("gradient_sync every needs zero 2 or 3, not " + std::to_string(l.zero));
    if (l.bucket_elements > 1)
      fail("gradient_sync every runs a bucket per unit: bucket_elements 0 or 1, not " +
           n(l.bucket_elements));
  }
  if (l.slots < 0)
    fail("optimizer state slots must not be negative, not " + std::to_string(l.slots));
  if (l.schedule == pipeline::schedule_kind::zero_bubble_h1)
    fail(
        "the trainer computes the backward whole and does not run zb-h1: use gpipe, 1f1b or "
        "interleaved");
  if (l.sequence_parallel && l.tp == 1)
    fail("sequence parallelism splits the tokens over TP, and tp is 1");
  const auto per_step = static_cast<long long>(l.dp) * l.micro_batch;
  if (l.batch() % per_step != 0)
    fail("a global batch of " + std::to_string(l.batch()) + " sequences does not split into " +
         std::to_string(l.dp) + " data-parallel ranks x microbatches of " +
         std::to_string(l.micro_batch));
  const std::size_t tokens = static_cast<std::size_t>(l.micro_batch) * m.seq;
  if (l.sequence_parallel && tokens % tp != 0)
    fail("sequence parallelism: a microbatch of " + n(tokens) + " tokens does not split over " +
         n(tp) + " ranks");
}

/// Blocks per virtual stage (pipeline/layout.hpp's checks and errors).
inline std::vector<int> host_stage_blocks(const host_model& m, const host_layout& l) {
  const int stages = l.pp * l.chunks, layers = static_cast<int>(m.layers);
  if (l.blocks_per_stage.empty()) return pipeline::even_layout(layers, stages);
  pipeline::check_layout(l.blocks_per_stage, layers, stages);
  return l.blocks_per_stage;
}

inline void check_rank(const host_layout& l, int pp_rank, int tp_rank) {
  if (pp_rank < 0 || pp_rank >= l.pp || tp_rank < 0 || tp_rank >= l.tp)
    throw error("weft: sim: host: no rank (pp " + std::to_string(pp_rank) + ", tp " +
                std::to_string(tp_rank) + ") in a mesh of pp " + std::to_string(l.pp) + " x tp " +
                std::to_string(l.tp));
}

/// The widths TP rank `tp_rank` holds: its query heads', its q, k and v columns (its kv heads as
/// layer/attention.hpp's place_kv_heads places them: a split where tp divides them, else one,
/// replicated), its FFN and vocabulary shares (split_range, as every layer splits).
struct host_widths {
  std::size_t ad = 0, qkv = 0, ffn = 0, vocab = 0;
};
[[nodiscard]] inline host_widths widths_of(const host_model& m, int tp, int tp_rank) {
  const auto t = static_cast<std::size_t>(tp);
  const std::size_t d = m.hidden / m.heads, kv = m.kv() % t == 0 ? m.kv() / t : 1;
  host_widths w;
  w.ad = m.heads / t * d;
  w.qkv = w.ad + 2 * kv * d;
  w.ffn = layer::split_range(m.ffn_size(), tp, tp_rank).size();
  w.vocab = layer::split_range(m.vocab, tp, tp_rank).size();
  return w;
}

} // namespace detail

/// Elements of TP rank `tp_rank`'s slice of the embedding stage, of one block and of the head.
[[nodiscard]] inline host_parameters host_parameters_of(const host_model& m, int tp, int tp_rank) {
  detail::check_host(m, host_layout{.tp = tp});
  detail::check_rank(host_layout{.tp = tp}, 0, tp_rank);
  const detail::host_widths w = detail::widths_of(m, tp, tp_rank);
  const std::size_t h = m.hidden, ad = w.ad, width = w.qkv, f = w.ffn, v = w.vocab;
  host_parameters p;
  if (m.family == host_family::gpt) {
    p.block = 2 * 2 * h                // ln1, ln2: gamma and beta
              + width * h + width      // qkv, column-parallel, with its bias
              + h * ad + h             // out, row-parallel: its bias replicated
              + f * h + f + h * f + h; // fc1 (column), fc2 (row)
    p.embedding = v * h + m.seq * h;   // token table, positions (replicated)
    p.head = 2 * h + v * h;            // final LayerNorm, output layer
  } else {
    p.block = 2 * h + width * h + h * ad + 3 * h * f;
    p.embedding = v * h;
    p.head = h + v * h;
  }
  return p;
}

/// Bytes of one microbatch's stash on TP rank `tp_rank`: a block's, and the embedding stage's.
[[nodiscard]] inline host_stash host_stash_of(const host_model& m, const host_layout& l,
                                              int tp_rank) {
  detail::check_host(m, l);
  detail::check_rank(l, 0, tp_rank);
  constexpr std::size_t f4 = sizeof(float), f8 = sizeof(double);
  const detail::host_widths w = detail::widths_of(m, l.tp, tp_rank);
  const std::size_t h = m.hidden, t = static_cast<std::size_t>(l.tp);
  const std::size_t b = static_cast<std::size_t>(l.micro_batch), a = m.heads / t;
  const std::size_t T = b * m.seq, R = l.sequence_parallel ? T / t : T;
  host_stash s;
  s.embedding = T * sizeof(std::int32_t);
  if (l.recomputation == recompute::full) {
    s.block = R * h * f4;
    return s;
  }
  const std::size_t norms = 2 * (R * h + R) * f8;
  const std::size_t probabilities =
      l.recomputation == recompute::selective ? 0 : b * a * m.seq * m.seq;
  const std::size_t attention = (T * h + T * w.qkv + T * w.ad + probabilities) * f4;
  const std::size_t mlp = (T * h + (m.family == host_family::gpt ? 2 : 3) * T * w.ffn) * f4;
  s.block = norms + attention + mlp;
  return s;
}

/// The bytes rank (pp_rank, tp_rank) of the host trainer allocates, by category.
[[nodiscard]] inline host_memory host_memory_of(const host_model& m, const host_layout& l,
                                                int pp_rank, int tp_rank) {
  detail::check_host(m, l);
  detail::check_rank(l, pp_rank, tp_rank);
  const std::vector<int> blocks = detail::host_stage_blocks(m, l);
  const host_parameters part = host_parameters_of(m, l.tp, tp_rank);
  const host_stash stash = host_stash_of(m, l, tp_rank);
  const auto blocks_of = [&](int chunk) {
    return static_cast<std::size_t>(blocks[static_cast<std::size_t>(chunk * l.pp + pp_rank)]);
  };

  // The units, in the optimizer's order, into buckets closed at unit boundaries.
  std::vector<std::size_t> units;
  if (pp_rank == 0) units.push_back(part.embedding);
  if (pp_rank == l.pp - 1) units.push_back(part.head);
  const std::size_t deferred_units = m.tied ? units.size() : 0; // tied: whole over the step
  for (int c = 0; c < l.chunks; ++c)
    units.insert(units.end(), blocks_of(c), part.block);
  const bool every = l.zero >= 2 && l.gradient_sync == optim::gradient_sync::every;
  const std::size_t close_at = l.bucket_elements != 0 ? l.bucket_elements
                               : l.zero == 3 || every ? 1
                                                      : optim::default_bucket_elements(l.dp);
  const std::size_t group = l.zero == 0 ? 1 : static_cast<std::size_t>(l.dp);
  const auto padded_to_group = [&](std::size_t n) { return (n + group - 1) / group * group; };
  std::vector<std::size_t> buckets; // padded elements
  std::size_t open = 0;
  for (std::size_t u : units) {
    open += u;
    if (open >= close_at) {
      buckets.push_back(padded_to_group(open));
      open = 0;
    }
  }
  if (open > 0) buckets.push_back(padded_to_group(open));
  std::size_t padded = 0;
  for (std::size_t x : buckets)
    padded += x;
  const std::size_t shard = padded / group;

  constexpr std::size_t f4 = sizeof(float);
  host_memory out;
  out.weights = (l.zero == 3 ? shard : padded) * f4;
  out.gradients = (l.zero >= 2 ? shard : padded) * f4;
  out.optimizer_state =
      l.slots > 0 ? optim::slot_stride(shard) * static_cast<std::size_t>(l.slots) * f4 : 0;
  if (every) { // a bucket per unit, in the units' order
    std::vector<std::size_t> others(buckets.begin() + static_cast<std::ptrdiff_t>(deferred_units),
                                    buckets.end());
    for (std::size_t i = 0; i < deferred_units; ++i)
      out.gradient_buckets += buckets[i] * f4;
    std::sort(others.begin(), others.end(), std::greater<>{});
    for (std::size_t i = 0; i < std::min<std::size_t>(2, others.size()); ++i)
      out.gradient_buckets += others[i] * f4;
  } else if (l.zero >= 2) {
    out.gradient_buckets = padded * f4;
  }
  if (l.zero == 3) {
    std::sort(buckets.begin(), buckets.end(), std::greater<>{});
    const auto gathered = std::min(buckets.size(), static_cast<std::size_t>(l.prefetch) + 1);
    for (std::size_t i = 0; i < gathered; ++i)
      out.gathered_weights += buckets[i] * f4;
  }

  // The stashes: a (microbatch, chunk) holds its chunk's from its F to its B.
  std::vector<std::size_t> chunk_bytes(static_cast<std::size_t>(l.chunks));
  for (int c = 0; c < l.chunks; ++c)
    chunk_bytes[static_cast<std::size_t>(c)] =
        blocks_of(c) * stash.block + (c == 0 && pp_rank == 0 ? stash.embedding : 0);
  const pipeline::schedule s = pipeline::generate(l.schedule, l.pp, l.microbatches(), l.chunks);
  std::size_t held = 0;
  for (const pipeline::action& x : s.ranks[static_cast<std::size_t>(pp_rank)]) {
    if (x.kind == pipeline::action_kind::forward) {
      held += chunk_bytes[static_cast<std::size_t>(x.chunk)];
      out.activations = std::max(out.activations, held);
    } else if (x.kind == pipeline::action_kind::backward) {
      held -= chunk_bytes[static_cast<std::size_t>(x.chunk)];
    }
  }
  return out;
}

} // namespace weft::sim
