#pragma once
// How a model is cut and how it trains: tensor, pipeline and data parallel extents, the
// micro-batches, the schedule, ZeRO, recomputation, and how the step's communication runs.
//
// Placement: ranks are numbered TP fastest, then DP, then PP (Megatron-LM's order), so a TP
// group of 8 fills one DGX; tp_across_nodes numbers TP slowest instead, one TP rank per node
// when dp * pp >= 8, which is the mistake the planner warns of. The numbering is a
// weft::mesh_layout (layout::mesh): the simulator takes its groups from there.
#include <weft/core/error.hpp>
#include <weft/mesh/mesh.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/model.hpp>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace weft::sim {

/// Whose software shards the model states of a layout (layout::sharding), where one is named.
///   none              the ZeRO stage of layout::zero, by its number alone
///   deepspeed_zero3   DeepSpeed's ZeRO stage 3
///   fsdp              PyTorch FSDP1: FULL_SHARD, or with layout::shard_group HYBRID_SHARD (HSDP)
///   fsdp2             PyTorch FSDP2 (fully_shard), HSDP over a 2-D mesh with a shard group
///   megatron_distopt  Megatron-core's distributed optimizer: ZeRO-1, the optimizer state sharded
///                     over the DP group, the gradients reduce-scattered, the weights whole
/// sharded.hpp's use_shard_engine sets a layout to an engine's ZeRO stage and its gathering.
enum class shard_engine : std::uint8_t { none, deepspeed_zero3, fsdp, fsdp2, megatron_distopt };

[[nodiscard]] constexpr std::string_view name_of(shard_engine e) noexcept {
  switch (e) {
    case shard_engine::none: return "none";
    case shard_engine::deepspeed_zero3: return "deepspeed-zero3";
    case shard_engine::fsdp: return "fsdp";
    case shard_engine::fsdp2: return "fsdp2";
    case shard_engine::megatron_distopt: return "megatron-distopt";
  }
  return "?";
}

/// The engine named `s` ("deepspeed-zero3", "fsdp", "fsdp2" or "megatron-distopt").
[[nodiscard]] inline shard_engine shard_engine_named(std::string_view s) {
  for (shard_engine e : {shard_engine::deepspeed_zero3, shard_engine::fsdp, shard_engine::fsdp2,
                         shard_engine::megatron_distopt})
    if (name_of(e) == s) return e;
  throw error("weft: sim: unknown sharding engine '" + std::string(s) +
              "': expected deepspeed-zero3, fsdp, fsdp2 or megatron-distopt");
}

/// The ZeRO stage engine `e` runs (0 for none: the layout's own stage).
[[nodiscard]] constexpr int zero_stage_of(shard_engine e) noexcept {
  switch (e) {
    case shard_engine::none: return 0;
    case shard_engine::megatron_distopt: return 1;
    case shard_engine::deepspeed_zero3:
    case shard_engine::fsdp:
    case shard_engine::fsdp2: return 3;
  }
  return 0;
}

/// The number format of a layout's GEMMs (layer_cost.hpp prices each).
///   bf16        every GEMM in bf16
///   fp8         Transformer Engine's FP8 with delayed scaling, as Megatron-core and NeMo run it
///               (`fp8: hybrid`): the three GEMMs of each transformer Linear (forward, input
///               gradient, weight gradient) in FP8, E4M3 for the forward's operands and E5M2 for
///               the gradients; the attention core, the output layer and the rest in bf16. Each
///               tensor is scaled by an amax of earlier steps, so a cast is one pass; the weights'
///               FP8 copies are made on a step's first micro-batch and kept for the others
///   fp8_cs      the same GEMMs with Transformer Engine's current scaling: each tensor's own amax,
///               one more read of it before the cast, and no cast fused into the layer norm
///   fp8_linear  torchao's float8 nn.Linear (tensorwise dynamic scaling, as torchtitan runs it):
///               the same GEMMs and the output layer's in FP8, each operand scaled by its own
///               amax; the weights are cast again on every forward
enum class precision : std::uint8_t { bf16, fp8, fp8_cs, fp8_linear };

[[nodiscard]] constexpr std::string_view name_of(precision p) noexcept {
  switch (p) {
    case precision::bf16: return "bf16";
    case precision::fp8: return "fp8";
    case precision::fp8_cs: return "fp8_cs";
    case precision::fp8_linear: return "fp8_linear";
  }
  return "?";
}

/// The precision named `s` ("bf16", "fp8", "fp8_cs" or "fp8_linear").
[[nodiscard]] inline precision precision_named(std::string_view s) {
  for (precision p : {precision::bf16, precision::fp8, precision::fp8_cs, precision::fp8_linear})
    if (name_of(p) == s) return p;
  throw error("weft: sim: unknown precision '" + std::string(s) +
              "': expected bf16, fp8, fp8_cs or fp8_linear");
}

/// How a ZeRO-3 layout's collectives run across the micro-batches of a step (layout::sync).
///   every  every micro-batch gathers each block and reduce-scatters its gradients (DeepSpeed's
///          stage 3; FSDP and FSDP2 by default)
///   last   every micro-batch gathers, only the step's last reduce-scatters; the others
///          accumulate whole gradients (FSDP1's no_sync, FSDP2's
///          set_requires_gradient_sync(False), weft::optim::zero<3> under weft::strategy by
///          default; its config.gradient_sync every runs `every`)
///   once   the first forward gathers and the weights stay whole until the last backward,
///          whose gradients are reduce-scattered once (FSDP2 with reshard_after_forward False,
///          set_reshard_after_backward(False) and set_requires_gradient_sync(False) on all
///          micro-batches but the last)
enum class shard_sync : std::uint8_t { every, last, once };

[[nodiscard]] constexpr std::string_view name_of(shard_sync s) noexcept {
  switch (s) {
    case shard_sync::every: return "every";
    case shard_sync::last: return "last";
    case shard_sync::once: return "once";
  }
  return "?";
}

/// The synchronisation named `s` ("every", "last" or "once").
[[nodiscard]] inline shard_sync shard_sync_named(std::string_view s) {
  for (shard_sync x : {shard_sync::every, shard_sync::last, shard_sync::once})
    if (name_of(x) == s) return x;
  throw error("weft: sim: unknown micro-batch synchronisation '" + std::string(s) +
              "': expected every, last or once");
}

/// How often a ZeRO-3 layout gathers and reduce-scatters, per micro-batch as averaged over a
/// step's m (layout::cadence, from sync and reshard_after_forward).
struct shard_cadence {
  double every = 1;     // the share of micro-batches whose passes gather: 1, or 1/m once a step
  bool regather = true; // the backward gathers each block again
  double reducing = 1;  // of those, the share whose backward reduce-scatters: 1, or 1/m under
                        // no_sync
  /// Passes that gather each block, per micro-batch.
  [[nodiscard]] double gathers() const noexcept { return every * (regather ? 2.0 : 1.0); }
  /// Backwards that reduce-scatter each block, per micro-batch.
  [[nodiscard]] double reduces() const noexcept { return every * reducing; }
  friend bool operator==(const shard_cadence&, const shard_cadence&) = default;
};

/// How the model is spread, and how it trains.
struct layout {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int cp = 1; // context parallelism (Megatron-core's --context-parallel-size): each sequence split
              // over cp ranks, which run every layer on their part of it, exchanging keys and
              // values in a ring inside attention; the gradients are reduced over dp * cp
  int chunks = 1;       // V: model chunks per pipeline rank (interleaved schedule)
  int micro_batch = 1;  // sequences per micro-batch
  int global_batch = 0; // sequences per step; 0: one micro-batch per DP rank
  pipeline::schedule_kind schedule = pipeline::schedule_kind::one_f_one_b;
  int zero = 0; // ZeRO stage 0..3 over the DP group
  // Whose software runs the ZeRO stage, where the layout names it (sharded.hpp's use_shard_engine).
  shard_engine sharding = shard_engine::none;
  bool sequence_parallel = false; // Korthikanti et al.: layer norms and dropout split over TP
  recompute recomputation = recompute::none;
  precision gemm_precision = precision::bf16; // the transformer Linears' GEMMs and their casts
  bool tp_across_nodes = false;               // number TP slowest: its ranks on different nodes
  bool overlap_dp = true;                     // DP reduction overlaps the last backward (bucketed)
  int dp_buckets = 4;                         // gradient buckets per pipeline rank
  bool p2p_scatter_gather = true;             // each TP rank sends 1/tp of an activation (SC21 4.1)
  bool p2p_blocking = false;    // sends and receives hold the rank (DeepSpeed's pipeline
                                // engine) instead of overlapping its compute (Megatron-LM)
  bool tp_overlap = false;      // the backward's TP collectives run during GEMMs (Megatron-LM
                                // since late 2021: a column-parallel linear's input-gradient
                                // all-reduce, or reduce-scatter with SP, during its
                                // weight-gradient GEMM, SP's re-gather of its input during
                                // its input-gradient GEMM); false: on the critical path
  bool tp_comm_overlap = false; // TP communication pipelined with the GEMMs in forward and
                                // backward (Megatron-core with Transformer Engine,
                                // --tp-comm-overlap; needs sequence parallelism): each all-gather
                                // in chunks under the column-parallel GEMM that consumes it, each
                                // reduce-scatter under the row-parallel GEMM that makes it; the
                                // backward's likewise. A collective shows by its excess over its
                                // GEMM, plus one chunk (1/tp) of the shorter of the two
  double grad_bytes = 2;        // bytes per gradient element in the DP reduction
  // Optimizer state per parameter before sharding: 12 for Adam's fp32 master weights, momentum
  // and variance; optimizer_state_named gives the others.
  double optimizer_bytes = adam_state_bytes;
  // Sharded data parallelism (zero 3: ZeRO-3, FSDP; sharded.hpp's use_shard_engine sets the
  // gathering: reshard_after_forward, sync, prefetch, backward_prefetch).
  // Each block (a transformer layer; the embedding and output layer as one more) is gathered
  // before its forward and, with reshard_after_forward, again before its backward; its gradient
  // is reduce-scattered after its backward.
  int shard_group = 0;               // GPUs a set of shards spans: 0 the whole DP group (ZeRO-3,
                                     // FSDP FULL_SHARD); a divisor of dp for HSDP (HYBRID_SHARD):
                                     // sharded inside consecutive groups of it, replicated across
                                     // them (each block's reduce-scattered gradient then
                                     // all-reduced across the replicas)
  bool reshard_after_forward = true; // the backward gathers each block again (ZeRO-3, FSDP
                                     // FULL_SHARD, FSDP2's default); false: the forward's gathered
                                     // weights stay until the backward (SHARD_GRAD_OP)
  shard_sync sync = shard_sync::every; // across a step's micro-batches (shard_sync)
  // ZeRO-3: HBM bytes per weight and micro-batch that the engine copies besides its collectives
  // (FSDP1's flat gradient, FSDP2's gather copy-out and reduce copy-in); unset: the engine's,
  // from sharding and grad_bytes (sharded.hpp's shard_copy_bytes_of).
  std::optional<double> shard_copy_bytes = std::nullopt;
  double optimizer_traffic_bytes = 0; // HBM bytes per weight of its shard the optimizer step
                                      // moves; 0: a fused step's, reading and writing its state
                                      // once (2 optimizer_bytes + 8)
  int prefetch = 1;                   // blocks whose gather may start ahead: block i's gather
                                      // starts when block i - prefetch's compute starts; 0: when
                                      // block i - 1's ends (no overlap); the forward's
  int backward_prefetch = 1;          // the same for the backward's gathers (ZeRO-3): FSDP1's
                                      // BACKWARD_PRE 1, BACKWARD_POST 0 (the next gather issued
                                      // after the current block's gradient computation)
  bool overlap_param_gather = false;  // ZeRO-1 (Megatron-LM's distributed optimizer): the updated
                                      // weights' all-gather runs behind the next step's first
                                      // forward, in dp_buckets buckets; false: after the
                                      // optimizer, with the reduce-scatter as one all-reduce
  double grad_accumulation_bytes = 0; // HBM bytes per weight and micro-batch to add its
                                      // gradient to the accumulated one outside the GEMM: 0 when
                                      // the weight-gradient GEMM accumulates into it (Megatron-LM's
                                      // gradient accumulation fusion, by early 2022); 6 for a
                                      // separate 16-bit add (read both, write one), 10 for 16-bit
                                      // into fp32; charged every micro-batch (autograd skips the
                                      // first one's add: one pass in m too many)

  [[nodiscard]] int gpus() const noexcept { return tp * cp * pp * dp; }
  /// The ranks a weight's gradient is reduced over: the DP group, with context parallelism the
  /// DP and CP ranks together (Megatron-core's data-parallel group with CP).
  [[nodiscard]] int grad_ranks() const noexcept { return dp * cp; }
  [[nodiscard]] int batch() const noexcept {
    return global_batch > 0 ? global_batch : dp * micro_batch;
  }
  [[nodiscard]] int microbatches() const noexcept { return batch() / (dp * micro_batch); }
  /// How often ZeRO-3 gathers and reduce-scatters (shard_cadence).
  [[nodiscard]] shard_cadence cadence() const noexcept {
    const double m = microbatches() > 1 ? microbatches() : 1;
    // FSDP1 frees SHARD_GRAD_OP's gathered weights only in a backward that reduces the
    // gradients (_should_free_in_backward), so under no_sync they stay whole from the first
    // forward to the last backward: once a step.
    const bool once =
        sync == shard_sync::once ||
        (sharding == shard_engine::fsdp && !reshard_after_forward && sync == shard_sync::last);
    return {.every = once ? 1.0 / m : 1.0,
            .regather = reshard_after_forward && !once,
            .reducing = !once && sync == shard_sync::last ? 1.0 / m : 1.0};
  }
  /// GPUs one set of shards spans under ZeRO-3: shard_group, or the whole DP group (with CP,
  /// grad_ranks()).
  [[nodiscard]] int shards() const noexcept { return shard_group > 0 ? shard_group : grad_ranks(); }
  /// GPUs each model state is divided over: the ZeRO stage's states over shards() (the DP
  /// group, or HSDP's shard group), the others whole.
  [[nodiscard]] state_shards shard_groups() const { return zero_shards(zero, shards()); }

  /// The rank numbering as a mesh: TP fastest, then CP, then DP, then PP (Megatron-core's
  /// order); with tp_across_nodes DP fastest, then CP, PP and TP. Rank r runs on device r of
  /// the cluster.
  [[nodiscard]] mesh_layout mesh() const {
    if (tp_across_nodes)
      return cp > 1 ? mesh_layout{{axis::dp, dp}, {axis::cp, cp}, {axis::pp, pp}, {axis::tp, tp}}
                    : mesh_layout{{axis::dp, dp}, {axis::pp, pp}, {axis::tp, tp}};
    return cp > 1 ? mesh_layout{{axis::tp, tp}, {axis::cp, cp}, {axis::dp, dp}, {axis::pp, pp}}
                  : mesh_layout{{axis::tp, tp}, {axis::dp, dp}, {axis::pp, pp}};
  }

  /// Device of the rank at (tp index, pp index, dp index, cp index).
  [[nodiscard]] int device(int t, int p, int d, int c = 0) const {
    return mesh().rank({.tp = t, .pp = p, .dp = d, .cp = c});
  }
};

/// layout::grad_accumulation_bytes of a software's gradient accumulation by name: "fused" (0),
/// "fp16" (6: a 16-bit add reads both gradients and writes one) or "fp32" (10: into fp32).
[[nodiscard]] inline double grad_accumulation_named(std::string_view s) {
  if (s == "fused") return 0;
  if (s == "fp16") return 6;
  if (s == "fp32") return 10;
  throw error("weft: sim: unknown gradient accumulation '" + std::string(s) +
              "': expected fused, fp16 or fp32");
}

/// layout::optimizer_bytes of an optimizer's state by name: "fp32" (12: Adam's fp32 master
/// weights, momentum and variance: Megatron-core's distributed optimizer, DeepSpeed),
/// "remainders" (10: the 16 bits that, with a bf16 weight, make its fp32 master, and fp32
/// moments: Apex's DistributedFusedAdam, NeMo's distributed_fused_adam with an fp32 state) or
/// "bf16" (4: bf16 moments and no master copy: the same with its optimizer dtype bf16).
[[nodiscard]] inline double optimizer_state_named(std::string_view s) {
  if (s == "fp32") return adam_state_bytes;
  if (s == "remainders") return 10;
  if (s == "bf16") return 4;
  throw error("weft: sim: unknown optimizer state '" + std::string(s) +
              "': expected fp32, remainders or bf16");
}

namespace detail {

inline void check_layout(const model_spec& m, const machine& mc, const layout& l) {
  const auto fail = [&](const std::string& what) { throw error("weft: sim: layout: " + what); };
  for (auto [name, v] : {std::pair{"tp", l.tp},
                         {"pp", l.pp},
                         {"dp", l.dp},
                         {"cp", l.cp},
                         {"chunks", l.chunks},
                         {"micro_batch", l.micro_batch}}) {
    if (v < 1) fail(std::string(name) + " must be at least 1, not " + std::to_string(v));
  }
  // Products in 64 bits: flags near INT_MAX must not wrap into a small or zero divisor.
  const std::int64_t gpus = std::int64_t{l.tp} * l.cp * l.pp * l.dp;
  if (gpus > mc.cluster.size()) {
    std::string what = l.cp > 1 ? "tp * cp * pp * dp = " : "tp * pp * dp = ";
    what += std::to_string(gpus) + " GPUs, more than the cluster's " +
            std::to_string(mc.cluster.size());
    fail(what);
  }
  // Each CP rank takes two of 2 cp chunks of a sequence (one from each end, which balances the
  // causal mask's work: Megatron-core's load balancing).
  if (l.cp > 1 && m.seq % (2 * l.cp) != 0)
    fail("cp " + std::to_string(l.cp) + " splits each sequence into 2 * cp chunks: " +
         std::to_string(m.seq) + " tokens do not divide by " + std::to_string(2 * l.cp));
  if (l.cp > 1) {
    if (l.shard_group > 0) fail("shard_group (HSDP) with context parallelism is not modelled");
    // Transformer Engine runs its ring attention in its flash and fused backends only.
    if (!m.flash_attention)
      fail(
          "context parallelism runs the attention core fused (Transformer Engine's ring "
          "attention): the model's core is unfused");
    // The ring priced is Megatron-core's; FSDP and DeepSpeed split sequences otherwise.
    if (l.sharding == shard_engine::fsdp || l.sharding == shard_engine::fsdp2 ||
        l.sharding == shard_engine::deepspeed_zero3)
      fail(
          "context parallelism is priced as Megatron-core runs it (Transformer Engine's ring), "
          "not under sharding " +
          std::string(name_of(l.sharding)));
    if (l.p2p_blocking)
      fail(
          "context parallelism is priced as Megatron-core runs it, not under DeepSpeed's "
          "pipeline engine");
    // Sequence parallelism splits each rank's s / cp tokens of a sequence over TP.
    if (l.sequence_parallel && (m.seq / l.cp) % l.tp != 0)
      fail("sequence parallelism splits the " + std::to_string(m.seq / l.cp) +
           " tokens a CP rank holds of each sequence over tp " + std::to_string(l.tp) +
           ": they do not divide");
  }
  const std::int64_t per_microbatch = std::int64_t{l.dp} * l.micro_batch;
  if (l.global_batch < 0 || (l.global_batch > 0 && l.global_batch % per_microbatch != 0))
    fail("global batch " + std::to_string(l.global_batch) +
         " is not a multiple of dp * micro_batch = " + std::to_string(per_microbatch));
  if (m.heads % l.tp != 0)
    fail("tp " + std::to_string(l.tp) + " does not divide the " + std::to_string(m.heads) +
         " heads");
  if (m.kv_heads > 0 && m.kv_heads % l.tp != 0) // Megatron-core splits the key-value groups over TP
    fail("tp " + std::to_string(l.tp) + " does not divide the " + std::to_string(m.kv_heads) +
         " key-value heads (grouped-query attention)");
  const std::int64_t model_chunks = std::int64_t{l.pp} * l.chunks;
  if (m.layers < model_chunks)
    fail(std::to_string(m.layers) +
         " layers cannot fill pp * chunks = " + std::to_string(model_chunks) + " model chunks");
  if (l.zero < 0 || l.zero > 3) fail("zero must be 0..3, not " + std::to_string(l.zero));
  if (l.dp_buckets < 1) fail("dp_buckets must be at least 1");
  if (l.shard_group < 0 || (l.shard_group > 0 && l.dp % l.shard_group != 0))
    fail("shard_group " + std::to_string(l.shard_group) + " must be 0 or divide dp " +
         std::to_string(l.dp));
  if (l.shard_group > 0 && l.zero != 3)
    fail("shard_group (HSDP) shards the weights: it needs zero 3, not " + std::to_string(l.zero));
  if (l.sharding != shard_engine::none && l.zero != zero_stage_of(l.sharding))
    fail("sharding " + std::string(name_of(l.sharding)) + " runs ZeRO-" +
         std::to_string(zero_stage_of(l.sharding)) + ", not zero " + std::to_string(l.zero));
  for (auto [name, v] : {std::pair{"optimizer_bytes", l.optimizer_bytes},
                         {"optimizer_traffic_bytes", l.optimizer_traffic_bytes},
                         {"grad_accumulation_bytes", l.grad_accumulation_bytes},
                         {"shard_copy_bytes", l.shard_copy_bytes.value_or(0)}}) {
    if (!(v >= 0)) {
      char bytes[32];
      std::snprintf(bytes, sizeof bytes, "%g", v);
      fail(std::string(name) + " must be at least 0, not " + bytes);
    }
  }
  if (l.shard_copy_bytes && l.zero != 3)
    fail("shard_copy_bytes are ZeRO-3's copies: they need zero 3, not " + std::to_string(l.zero));
  if (l.tp_comm_overlap && !l.sequence_parallel)
    fail(
        "tp_comm_overlap pipelines sequence parallelism's all-gathers and reduce-scatters: it "
        "needs sequence_parallel");
  if (l.prefetch < 0) fail("prefetch must be at least 0, not " + std::to_string(l.prefetch));
  if (l.backward_prefetch < 0)
    fail("backward_prefetch must be at least 0, not " + std::to_string(l.backward_prefetch));
  if (l.overlap_param_gather && l.zero != 1)
    fail("overlap_param_gather is the distributed optimizer's (zero 1), not zero " +
         std::to_string(l.zero) + "'s");
  if (l.chunks > 1 && l.schedule != pipeline::schedule_kind::interleaved)
    fail("chunks > 1 needs the interleaved schedule");
  if (l.gemm_precision != precision::bf16 && !(mc.device.fp8_flops > 0))
    fail("precision " + std::string(name_of(l.gemm_precision)) + " runs FP8 GEMMs, which GPU '" +
         std::string(mc.device.name) + "' has no tensor cores for");
}

} // namespace detail

} // namespace weft::sim
