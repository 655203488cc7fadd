#pragma once
// The 3D planner: every TP x PP x DP mesh of a cluster that fits in memory, ranked by the
// simulated step, with the reasons for the top ones.
//
//   for each mesh tp * pp * dp = GPUs   (tp a power of two dividing the heads, up to twice a
//                                        node, so that TP across nodes is seen and explained;
//                                        pp dividing the layers; dp dividing the batch)
//     for each micro-batch and schedule (1F1B, interleaved with 2, 3 or 4 chunks, ZB-H1)
//       every recomputation with every ZeRO stage that fits: neither dominates (less
//       recomputation may fit only under ZeRO-2 or 3, whose collectives every micro-batch cost
//       more than the recomputation saves; ZeRO adds communication but shards the optimizer
//       step); ZeRO-3 in each of its modes (zero3_mode: what it keeps whole between the
//       forward and the backward and across micro-batches trades memory for collectives);
//       memory is checked (estimate_memory) before anything is simulated
//       simulate the step (step.hpp)
//     keep the mesh's fastest variant (with search_options::runnable_only, the fastest that
//     weft::strategy runs as is: strategy_refusal)
//   rank the meshes by step time
//
// strategy_refusal says whether weft::strategy (weft/strategy.hpp) runs a layout as is, and why
// not; strategy_type spells the weft::strategy<...> that does, strategy_config_of the configuration
// it takes and launch_line the command that starts it.
#include <weft/core/error.hpp>
#include <weft/mesh/mesh.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/sim/calibration.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/memory.hpp>
#include <weft/sim/model.hpp>
#include <weft/sim/step.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace weft::sim {

/// How a ZeRO-3 layout gathers: layout::reshard_after_forward and layout::sync.
struct zero3_mode {
  bool reshard_after_forward = true;
  shard_sync sync = shard_sync::every;
};

struct search_options {
  int global_batch = 0;    // sequences per step (required)
  double memory_limit = 0; // bytes per GPU; 0: the GPU's HBM
  std::vector<int> micro_batches = {1, 2, 4};
  std::vector<pipeline::schedule_kind> schedules = {pipeline::schedule_kind::one_f_one_b,
                                                    pipeline::schedule_kind::interleaved,
                                                    pipeline::schedule_kind::zero_bubble_h1};
  std::vector<int> chunks = {2, 3, 4}; // model chunks per rank of the interleaved schedule
  std::vector<recompute> recomputes = {recompute::none, recompute::selective, recompute::full};
  int max_zero = 3; // ZeRO stages 0..max_zero (with DP > 1)
  int max_tp = 0;   // 0: twice the devices of a node
  int cp = 1;       // context parallelism of every mesh (layout::cp): the search takes it as given
  bool sequence_parallel = true;              // with TP > 1
  bool tp_overlap = false;                    // layout::tp_overlap of every variant
  double grad_accumulation_bytes = 0;         // layout::grad_accumulation_bytes of every variant
  precision gemm_precision = precision::bf16; // layout::gemm_precision of every variant
  // layout::optimizer_bytes of every variant
  double optimizer_bytes = adam_state_bytes;
  double grad_bytes = 2;                              // layout::grad_bytes of every variant
  pipeline_engine engine = pipeline_engine::megatron; // of every variant with PP > 1 (DeepSpeed's
      // runs only 1F1B under ZeRO 0 or 1; PP 1 runs no pipeline engine)
  bool runnable_only = false; // only variants weft::strategy runs as is (strategy_refusal)
  // ZeRO-3 also as HSDP (PyTorch FSDP's HYBRID_SHARD, weft::optim::hybrid<zero<3>, zero<0>>):
  // sharded over the DP ranks of one node, replicated across the nodes (detail::node_shard_group).
  bool hybrid_sharding = true;
  // ZeRO-1 also with the distributed optimizer's overlapped parameter gather (Megatron-core's
  // --overlap-param-gather; layout::overlap_param_gather); not with engine DeepSpeed, whose ZeRO-1
  // has no such overlap (PP 1 meshes included).
  bool overlap_param_gather = true;
  // ZeRO-3's modes: FSDP's FULL_SHARD and SHARD_GRAD_OP reduce-scattering every micro-batch,
  // FULL_SHARD under no_sync, and gathering once a step (weft::optim::zero<3> runs FULL_SHARD
  // either way: config.gradient_sync every or last). What
  // each keeps whole counts in memory (memory.hpp's zero3_gather_bytes). SHARD_GRAD_OP under
  // no_sync is left out: as FSDP2 runs it, it keeps what gathering once a step keeps and gathers
  // more often; FSDP1 runs it as gathering once a step (layout::cadence).
  std::vector<zero3_mode> zero3_modes = {{true, shard_sync::every},
                                         {false, shard_sync::every},
                                         {true, shard_sync::last},
                                         {true, shard_sync::once}};
  // The variants of a mesh are every micro-batch, schedule, recompute and ZeRO stage 0..3 above,
  // ZeRO-1 with and without the overlapped parameter gather, ZeRO-3 in each of zero3_modes
  // (those that differ with the step's micro-batches), over the whole DP group or, with
  // hybrid_sharding, a node's part of it.
};

/// One mesh's fastest variant.
struct ranked_layout {
  layout l;
  step_result r;
  std::string refusal; // why weft::strategy does not run `l` as is ("" where it does)
};

namespace detail {

inline constexpr zero3_mode default_mode{};

/// Whether one of `before`, in place of `l`'s mode, gathers and reduce-scatters as `l` does
/// (with one micro-batch a step FSDP's no_sync changes nothing, and gathering once a step is
/// keeping the forward's weights for the backward): the search simulates each cadence once.
[[nodiscard]] inline bool same_cadence_before(const layout& l, std::span<const zero3_mode> before) {
  layout other = l;
  return std::any_of(before.begin(), before.end(), [&](const zero3_mode& x) {
    other.reshard_after_forward = x.reshard_after_forward;
    other.sync = x.sync;
    return other.cadence() == l.cadence();
  });
}

/// Why the TP groups of `l` cannot stay inside nodes of `cluster` ("" where each does):
/// make_comms' strict placement, which weft::strategy uses, refuses a TP group across nodes.
[[nodiscard]] inline std::string tp_placement_refusal(const layout& l,
                                                      const topology::cluster& cluster) {
  if (l.tp < 2) return "";
  const mesh_layout mesh = l.mesh();
  for (int r = 0; r < l.gpus() && r < cluster.size(); ++r) {
    const std::vector<int> group = mesh.group(axis::tp, r);
    if (group.front() != r) continue; // each group once, from its first rank
    for (int q : group)
      if (q >= cluster.size() || cluster.node_of(q) != cluster.node_of(r))
        return "its TP group of " + std::to_string(l.tp) + " ranks spans nodes (ranks " +
               std::to_string(r) + " and " + std::to_string(q) +
               "), which make_comms' strict placement refuses";
  }
  return "";
}

/// HSDP's shard group on `cluster` for the mesh of `l`: the DP ranks of one pipeline rank that
/// share a node (weft::optim::hybrid's default inner group, and HYBRID_SHARD's usual one), or 0
/// where that is no proper part of the DP group: TP groups that straddle nodes, a DP group on
/// one node, or nodes that split it unevenly. The rank order is layout::mesh()'s, TP fastest
/// then DP, so a node holds devices_on(0) / tp consecutive DP ranks.
[[nodiscard]] inline int node_shard_group(const layout& l, const topology::cluster& cluster) {
  const int per_node = cluster.devices_on(0);
  if (l.tp_across_nodes || l.cp > 1 || per_node % l.tp != 0) return 0;
  const int group = per_node / l.tp;
  if (group < 2 || group >= l.dp || l.dp % group != 0) return 0;
  return group;
}

/// Why weft::strategy's hybrid<zero<3>, zero<0>> does not shard as `l` does ("" where it does,
/// or where `l` shards over the whole DP group): it shards over the DP ranks of a node.
[[nodiscard]] inline std::string hybrid_group_refusal(const layout& l,
                                                      const topology::cluster& cluster) {
  if (l.zero == 0 || l.shards() >= l.dp) return "";
  if (l.zero != 3)
    return "ZeRO-" + std::to_string(l.zero) + " over groups of " + std::to_string(l.shards()) +
           ": the simulator prices shard groups under ZeRO-3 only";
  const int node = node_shard_group(l, cluster);
  if (l.shards() != node)
    return "shard groups of " + std::to_string(l.shards()) +
           " DP ranks: weft::optim::hybrid shards over the DP ranks of a node (" +
           (node > 0 ? std::to_string(node) : std::string("here, none smaller than the group")) +
           ")";
  return "";
}

} // namespace detail

/// Why weft::strategy does not run `l` of `m` on `mc` as is ("" where it does): the rules of
/// weft/strategy.hpp's static_asserts and of its trainer's and layers' checks at construction.
///   - the schedule: gpipe, 1F1B or interleaved; not ZB-H1, whose split backward weft's layers
///     do not compute (static_assert); interleaving needs pp >= 2 (static_assert)
///   - the model: layer::gpt_model (learned positions, GELU MLP, as many key-value heads as
///     heads) or layer::llama_model (rotary positions, SwiGLU MLP, any key-value heads that
///     divide the heads); nothing else (ALiBi, an ungated MLP with rotary positions)
///   - TP: divides the heads, and the key-value heads divide it or it them (parallel_attention);
///     sequence parallelism only with tp >= 2 (static_assert) and a micro-batch's tokens
///     dividing over TP (trainer)
///   - PP: the layers split evenly over pp * chunks virtual stages (pipeline::even_layout; an
///     uneven split needs config.layout, which strategy_config_of does not write)
///   - the batch: a multiple of dp * micro_batch (trainer)
///   - placement: every TP group inside a node (make_comms, strict)
///   - HSDP: a shard group smaller than the DP group is the DP ranks of a node
///     (optim::hybrid<zero<3>, zero<0>>; detail::hybrid_group_refusal)
///   - ZeRO-3: as optim::zero<3> runs it under the trainer, each unit gathered for every forward
///     and backward (the layout's reshard_after_forward true, sync last or every: its gradients
///     reduce-scattered once a step or every micro-batch, config.gradient_sync);
///     ZeRO-1 with overlap_param_gather (optim::zero<1> waits for each bucket's gather where the
///     next forward first uses it);
///     ZeRO-2 as the simulator prices it, a reduce-scatter every micro-batch (gradient_sync every)
/// ZeRO 0..3 and every recompute policy run. What strategy_refusal does not judge: weft::strategy
/// trains in float32 with host BLAS (layer::cblas), so it runs the layout's composition, not
/// the mixed-precision GPU step the simulator prices; and it runs weft's pipeline executor,
/// whatever engine the layout's sends were priced for.
namespace detail {

/// strategy_refusal's rules but the placement's, which depend on the mesh alone.
[[nodiscard]] inline std::string strategy_refusal_in_place(const model_spec& m, const layout& l) {
  if (l.cp > 1)
    return "context parallelism: weft's layers compute attention over a whole sequence, and "
           "weft::strategy has no CP axis";
  if (l.schedule == pipeline::schedule_kind::zero_bubble_h1)
    return "zb-h1 splits the backward into input and weight gradients, which weft's layers "
           "compute together (weft::strategy takes gpipe, 1f1b or interleaved)";
  if (l.chunks > 1 && l.pp < 2)
    return "an interleaved schedule of " + std::to_string(l.chunks) +
           " chunks needs pp >= 2, not pp " + std::to_string(l.pp);
  const bool gpt_shape =
      m.learned_positions && !m.gated && (m.kv_heads == 0 || m.kv_heads == m.heads);
  const bool llama_shape = !m.learned_positions && m.gated;
  if (!gpt_shape && !llama_shape)
    return std::string(
               "weft has no model of this shape: layer::gpt_model has learned positions, "
               "a GELU MLP and no grouped-query attention, layer::llama_model rotary "
               "positions and a SwiGLU MLP; this one has ") +
           (m.learned_positions ? "learned" : "rotary or ALiBi") + " positions, " +
           (m.gated ? "a gated" : "an ungated") + " MLP and " +
           std::to_string(m.kv_heads > 0 ? m.kv_heads : m.heads) + " key-value heads for " +
           std::to_string(m.heads);
  if (m.hidden % m.heads != 0)
    return "hidden " + std::to_string(m.hidden) + " does not divide into " +
           std::to_string(m.heads) + " heads";
  const int kv = m.kv_heads > 0 ? m.kv_heads : m.heads;
  if (m.heads % kv != 0)
    return std::to_string(m.heads) + " heads do not divide into groups of " + std::to_string(kv) +
           " key-value heads";
  if (m.heads % l.tp != 0 || (kv % l.tp != 0 && l.tp % kv != 0))
    return "tp " + std::to_string(l.tp) + " does not divide the " + std::to_string(m.heads) +
           " heads and " + std::to_string(kv) + " key-value heads as parallel_attention needs";
  if (l.sequence_parallel && l.tp < 2) return "sequence parallelism needs tp >= 2";
  if (l.sequence_parallel && (static_cast<long long>(l.micro_batch) * m.seq) % l.tp != 0)
    return "sequence parallelism: a micro-batch of " +
           std::to_string(static_cast<long long>(l.micro_batch) * m.seq) +
           " tokens does not split over tp " + std::to_string(l.tp);
  if (m.layers % (l.pp * l.chunks) != 0)
    return std::to_string(m.layers) +
           " layers do not split evenly over pp * chunks = " + std::to_string(l.pp * l.chunks) +
           " virtual stages (config.layout would set them)";
  if (l.batch() % (l.dp * l.micro_batch) != 0)
    return "a global batch of " + std::to_string(l.batch()) + " is not a multiple of dp * " +
           "micro_batch = " + std::to_string(l.dp * l.micro_batch);
  if (l.tp_across_nodes && l.tp > 1)
    return "TP across nodes: make_comms' strict placement refuses a TP group that spans nodes";
  // weft::optim::zero<1> and <2> start the updated weights' all-gathers after the optimizer
  // step and wait for each bucket's where the next forward first uses it
  // (data_parallel.hpp's bucket_parameters).
  if (l.zero == 1 && l.dp > 1 && !l.overlap_param_gather)
    return "ZeRO-1 gathering the updated weights after the optimizer step: "
           "weft::optim::zero<1> gathers them behind the next step's first forward "
           "(--overlap-param-gather)";
  if (l.zero == 3) {
    // weft::optim::zero<3> under the trainer: each unit gathered before every forward and
    // every backward (strategy/trainer.hpp's enter and leave), its gradients reduce-scattered
    // after its last backward or after every one (strategy_gradient_sync).
    const shard_cadence k = l.cadence();
    if (k.every < 1)
      return "ZeRO-3 gathering once a step: weft::optim::zero<3> gathers each unit before every "
             "forward and backward";
    if (!k.regather)
      return "ZeRO-3 keeping the forward's gathered weights for the backward: "
             "weft::optim::zero<3> frees them after each unit's forward and gathers them again";
  }
  return "";
}

} // namespace detail

/// Whether weft::strategy runs `l` with config.gradient_sync every: ZeRO-2 over several
/// micro-batches (the simulator prices DeepSpeed's stage 2, a reduce-scatter every micro-batch)
/// and ZeRO-3 reduce-scattering every micro-batch; otherwise last, the default.
[[nodiscard]] inline bool strategy_gradient_sync_every(const layout& l) {
  if (l.microbatches() < 2) return false;
  return l.zero == 2 || (l.zero == 3 && l.cadence().reducing == 1);
}

[[nodiscard]] inline std::string strategy_refusal(const model_spec& m, const machine& mc,
                                                  const layout& l) {
  std::string why = detail::strategy_refusal_in_place(m, l);
  if (why.empty()) why = detail::tp_placement_refusal(l, mc.cluster);
  return why.empty() ? detail::hybrid_group_refusal(l, mc.cluster) : why;
}

/// The weft::strategy<...> that runs `l` of `m`, spelt as C++ (with weft:: in full): the mesh in
/// the simulator's rank order (TP fastest, then DP, then PP), the schedule, ZeRO as
/// optim::zero<k> (optim::hybrid<zero<3>, zero<0>> for HSDP), the recompute policy, sequence
/// parallelism and, for a Llama-shaped model, layer::llama_model. Throws weft::error with
/// strategy_refusal's reason where it does not run.
[[nodiscard]] inline std::string strategy_type(const model_spec& m, const machine& mc,
                                               const layout& l) {
  if (const std::string why = strategy_refusal(m, mc, l); !why.empty())
    throw error("weft: sim: weft::strategy does not run " + std::string(m.name) +
                " as laid out: " + why);
  std::string schedule = "weft::pipeline::";
  switch (l.schedule) {
    case pipeline::schedule_kind::gpipe: schedule += "gpipe"; break;
    case pipeline::schedule_kind::one_f_one_b: schedule += "one_f_one_b"; break;
    case pipeline::schedule_kind::interleaved:
      schedule += "interleaved<" + std::to_string(l.chunks) + ">";
      break;
    case pipeline::schedule_kind::zero_bubble_h1: break; // refused above
  }
  const std::string zero = "weft::optim::zero<" + std::to_string(l.zero) + ">";
  const std::string sharding = l.zero > 0 && l.shards() < l.dp
                                   ? "weft::optim::hybrid<" + zero + ", weft::optim::zero<0>>"
                                   : zero;
  std::string s = "weft::strategy<weft::mesh<weft::tp<" + std::to_string(l.tp) + ">, weft::dp<" +
                  std::to_string(l.dp) + ">, weft::pp<" + std::to_string(l.pp) + ">>, " + schedule +
                  ", " + sharding +
                  ", weft::layer::recompute::" + std::string(name_of(l.recomputation)) +
                  (l.sequence_parallel ? ", weft::layer::sequence_parallel"
                                       : ", weft::layer::no_sequence_parallel");
  if (!m.learned_positions) s += ", weft::layer::llama_model";
  return s + ">";
}

/// The configuration strategy_type's S::make takes for `l` of `m`, as a C++ initializer.
[[nodiscard]] inline std::string strategy_config_of(const model_spec& m, const layout& l) {
  std::string model = "{.vocab = " + std::to_string(m.vocab) +
                      ", .hidden = " + std::to_string(m.hidden) +
                      ", .heads = " + std::to_string(m.heads);
  if (!m.learned_positions && m.kv_heads > 0)
    model += ", .kv_heads = " + std::to_string(m.kv_heads);
  // The simulator's FFN width: 0 means 4 h there and in layer::gpt_config, but Llama's rule in
  // layer::llama_config, so a Llama-shaped model always spells it.
  if (m.ffn > 0 || !m.learned_positions)
    model += ", .ffn = " + std::to_string(m.ffn > 0 ? m.ffn : 4 * m.hidden);
  model += ", .seq = " + std::to_string(m.seq) + ", .layers = " + std::to_string(m.layers);
  if (m.tied_embeddings) model += ", .tie_embeddings = true";
  return "{.model = " + model + "}, .micro_batch = " + std::to_string(l.micro_batch) +
         ", .global_batch = " + std::to_string(l.batch()) +
         (strategy_gradient_sync_every(l) ? ", .gradient_sync = weft::optim::gradient_sync::every}"
                                          : "}");
}

/// The command that starts `program` on every rank of `l` over `mc`: one MPI process per GPU,
/// `per_node` to a node, in rank order (rank r on device r, as the layout numbers them).
[[nodiscard]] inline std::string launch_line(const machine& mc, const layout& l,
                                             const std::string& program) {
  return "mpirun -n " + std::to_string(l.gpus()) +
         " --map-by ppr:" + std::to_string(mc.cluster.devices_on(0)) + ":node " + program;
}

struct search_result {
  std::vector<ranked_layout> ranked; // fastest first, one per (tp, pp, dp)
  int simulated = 0;                 // step simulations run
  int meshes = 0;                    // meshes that divide the cluster, the layers and the batch
  int out_of_memory = 0;             // meshes with no variant that fits in memory
  int unschedulable = 0;             // meshes no schedule runs with this batch (micro-batches)
  int unrunnable = 0; // runnable_only: meshes whose variants that fit weft::strategy refuses
  std::optional<ranked_layout> best_runnable; // the fastest variant of any mesh that
                                              // weft::strategy runs as is (none: no such fits)
};

/// Ranks every mesh of `mc` for `m`; throws weft::error if no layout fits.
[[nodiscard]] inline search_result search(const model_spec& m, const machine& mc,
                                          const search_options& o, const calibration& cal) {
  m.check();
  if (o.global_batch < 1)
    throw error("weft: sim: search needs a global batch of at least 1, not " +
                std::to_string(o.global_batch));
  const int gpus = mc.cluster.size();
  const int per_node = mc.cluster.devices_on(0);
  const int max_tp = o.max_tp > 0 ? o.max_tp : 2 * per_node;
  const double limit = o.memory_limit > 0 ? o.memory_limit : mc.device.hbm_bytes;
  search_result out;
  schedule_memo memo; // the variants of a micro-batch size and schedule share theirs
  if (o.cp < 1)
    throw error("weft: sim: search: cp must be at least 1, not " + std::to_string(o.cp));
  if (o.cp > 1) {
    const auto refuse = [&](const std::string& why) {
      throw error("weft: sim: search: cp " + std::to_string(o.cp) + ": " + why);
    };
    if (m.seq % (2 * o.cp) != 0)
      refuse("splits each sequence into 2 * cp chunks: " + std::to_string(m.seq) +
             " tokens do not divide by " + std::to_string(2 * o.cp));
    if (o.cp > gpus) refuse("more ranks than the cluster's " + std::to_string(gpus) + " GPUs");
    if (!m.flash_attention)
      refuse("context parallelism runs the attention core fused, and the model's is unfused");
    if (o.engine == pipeline_engine::deepspeed)
      refuse(
          "context parallelism is priced as Megatron-core runs it, not under DeepSpeed's "
          "pipeline engine");
  }
  const int cp = o.cp;
  for (int tp = 1; tp <= max_tp && tp * cp <= gpus; tp *= 2) {
    if (m.heads % tp != 0 || (m.kv_heads > 0 && m.kv_heads % tp != 0)) continue;
    // With CP and sequence parallelism each CP rank's tokens of a sequence split over TP.
    if (cp > 1 && o.sequence_parallel && tp > 1 && (m.seq / cp) % tp != 0) continue;
    for (int pp = 1; pp <= m.layers && tp * cp * pp <= gpus; ++pp) {
      if (m.layers % pp != 0 || gpus % (tp * cp * pp) != 0) continue;
      const int dp = gpus / (tp * cp * pp);
      if (o.global_batch % dp != 0) continue;
      ++out.meshes;
      std::vector<ranked_layout> variants;
      bool schedulable = false, fits = false;
      std::string placement; // the mesh's, for every variant: strategy_refusal's last rule
      {
        layout mesh_only;
        mesh_only.tp = tp;
        mesh_only.cp = cp;
        mesh_only.pp = pp;
        mesh_only.dp = dp;
        placement = detail::tp_placement_refusal(mesh_only, mc.cluster);
      }
      const int hybrid =
          o.hybrid_sharding
              ? detail::node_shard_group(layout{.tp = tp, .pp = pp, .dp = dp, .cp = cp}, mc.cluster)
              : 0;
      for (int mb : o.micro_batches) {
        if (o.global_batch % (dp * mb) != 0) continue;
        const int micro = o.global_batch / (dp * mb);
        for (pipeline::schedule_kind kind : o.schedules) {
          for (int v :
               kind == pipeline::schedule_kind::interleaved ? o.chunks : std::vector<int>{1}) {
            layout l;
            l.tp = tp;
            l.cp = cp;
            l.pp = pp;
            l.dp = dp;
            l.micro_batch = mb;
            l.global_batch = o.global_batch;
            l.schedule = kind;
            l.sequence_parallel = o.sequence_parallel && tp > 1;
            l.tp_overlap = o.tp_overlap;
            l.grad_accumulation_bytes = o.grad_accumulation_bytes;
            l.gemm_precision = o.gemm_precision;
            l.optimizer_bytes = o.optimizer_bytes;
            l.grad_bytes = o.grad_bytes;
            if (kind == pipeline::schedule_kind::interleaved) {
              l.chunks = v;
              if (pp < 2 || v < 2 || m.layers % (v * pp) != 0 || micro % pp != 0) continue;
            }
            if (kind == pipeline::schedule_kind::zero_bubble_h1 && (pp < 2 || micro < pp)) continue;
            if (pp > 1 && o.engine == pipeline_engine::deepspeed &&
                kind != pipeline::schedule_kind::one_f_one_b)
              continue;
            schedulable = true;
            // Every recompute and ZeRO stage that fits: less recompute is not always faster (none
            // may fit only under ZeRO-2 or 3, whose collectives every micro-batch cost more than
            // selective recompute under ZeRO-1 does).
            const std::vector<int> peak =
                detail::peak_in_flight(pipeline::generate(kind, pp, micro, l.chunks));
            for (recompute rc : o.recomputes) {
              for (int zero = 0; zero <= (dp * cp > 1 ? o.max_zero : 0); ++zero) {
                // The shard groups: the whole DP group, and under ZeRO-3 a node's DP ranks (HSDP).
                const std::array<int, 2> groups{0, hybrid};
                const std::span<const zero3_mode> modes =
                    zero == 3 ? std::span<const zero3_mode>(o.zero3_modes)
                              : std::span<const zero3_mode>(&detail::default_mode, 1);
                // ZeRO-1 also as Megatron's distributed optimizer gathers the updated weights:
                // behind the next step's first forward.
                const int param_gathers =
                    zero == 1 && o.overlap_param_gather && o.engine == pipeline_engine::megatron
                        ? 2
                        : 1;
                for (int group : std::span(groups.data(), zero == 3 && hybrid > 0 ? 2 : 1)) {
                  for (std::size_t k = 0; k < modes.size() * param_gathers; ++k) {
                    l.recomputation = rc;
                    l.zero = zero;
                    l.shard_group = group;
                    l.overlap_param_gather = zero == 1 && k == 1;
                    const zero3_mode& mode = modes[zero == 3 ? k : 0];
                    l.reshard_after_forward = mode.reshard_after_forward;
                    l.sync = mode.sync;
                    if (zero == 3 && detail::same_cadence_before(l, modes.first(k))) continue;
                    if (pp > 1) {
                      if (!engine_refusal(l, o.engine).empty()) continue;
                      use_engine(l, o.engine);
                    }
                    if (estimate_memory(m, l, peak) > limit) continue;
                    fits = true;
                    std::string refusal = detail::strategy_refusal_in_place(m, l);
                    if (refusal.empty()) refusal = placement;
                    if (o.runnable_only && !refusal.empty()) continue;
                    ++out.simulated;
                    step_result r = simulate_step(m, mc, l, cal, &memo);
                    r.schedule = {}; // the ranking keeps figures, not timelines
                    r.timeline = {};
                    if (refusal.empty() &&
                        (!out.best_runnable || r.step_time_s < out.best_runnable->r.step_time_s))
                      out.best_runnable = ranked_layout{l, r, ""};
                    variants.push_back({l, std::move(r), std::move(refusal)});
                  }
                }
              }
            }
          }
        }
      }
      if (variants.empty()) {
        ++(!schedulable ? out.unschedulable : !fits ? out.out_of_memory : out.unrunnable);
        continue;
      }
      out.ranked.push_back(*std::min_element(
          variants.begin(), variants.end(),
          [](const auto& a, const auto& b) { return a.r.step_time_s < b.r.step_time_s; }));
    }
  }
  if (out.ranked.empty()) {
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f", limit / (1024.0 * 1024 * 1024));
    throw error("weft: sim: no layout of " + m.name + " on " + std::to_string(gpus) +
                " GPUs with a global batch of " + std::to_string(o.global_batch) + ": of " +
                std::to_string(out.meshes) + " meshes, " + std::to_string(out.out_of_memory) +
                " fit no variant in " + gib + " GiB per GPU, " + std::to_string(out.unschedulable) +
                " have no schedule for the batch" +
                (o.runnable_only ? " and " + std::to_string(out.unrunnable) +
                                       " fit only as layouts weft::strategy does not run"
                                 : std::string()));
  }
  std::sort(out.ranked.begin(), out.ranked.end(),
            [](const auto& a, const auto& b) { return a.r.step_time_s < b.r.step_time_s; });
  return out;
}

[[nodiscard]] inline search_result search(const model_spec& m, const machine& mc,
                                          const search_options& o) {
  return search(m, mc, o, calibration_of(mc.device));
}

namespace detail {

inline std::string format(const char* fmt, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d);
  return buf;
}

} // namespace detail

/// "tp 8 pp 35 dp 8, micro-batch 1, 1f1b, recompute full, ZeRO-1" (", DeepSpeed's pipeline engine"
/// last where it runs). The ZeRO stage names the engine that runs it where the layout has one
/// ("ZeRO-1 (megatron-distopt)", "ZeRO-3 (fsdp2)"), and a shard group smaller than the DP group
/// ("ZeRO-3 (hsdp: fsdp over groups of 8, 16 replicas)"); an optimizer state other than Adam's
/// 12 fp32 bytes follows it.
[[nodiscard]] inline std::string describe(const layout& l) {
  std::string s = "tp " + std::to_string(l.tp);
  if (l.cp > 1) s += " cp " + std::to_string(l.cp);
  s += " pp " + std::to_string(l.pp) + " dp " + std::to_string(l.dp) + ", micro-batch " +
       std::to_string(l.micro_batch) + ", " + std::string(pipeline::name_of(l.schedule));
  if (l.chunks > 1) s += "<" + std::to_string(l.chunks) + ">";
  s += ", recompute " + std::string(name_of(l.recomputation));
  if (l.zero > 0) {
    s += ", ZeRO-" + std::to_string(l.zero);
    const std::string engine(name_of(l.sharding));
    const bool groups = l.shards() < l.dp;
    const std::string over = "over groups of " + std::to_string(l.shards()) + ", " +
                             std::to_string(l.dp / std::max(1, l.shards())) + " replicas";
    const bool hsdp =
        groups && (l.sharding == shard_engine::fsdp || l.sharding == shard_engine::fsdp2);
    if (hsdp)
      s += " (hsdp: " + engine + " " + over + ")";
    else if (l.sharding != shard_engine::none)
      s += " (" + engine + (groups ? " " + over : "") + ")";
    else if (groups)
      s += " " + over;
    if (l.zero == 1 && l.overlap_param_gather)
      s += ", parameter gather overlapped with the next forward";
    if (l.zero == 3 && l.backward_prefetch != 1)
      s += ", backward prefetch " + std::to_string(l.backward_prefetch);
    if (l.zero == 3 && l.sync == shard_sync::once)
      s += ", gathered once a step";
    else if (l.zero == 3 && !l.reshard_after_forward)
      s += ", weights kept from forward to backward";
    if (l.zero == 3 && l.sync == shard_sync::last)
      s += ", gradients reduce-scattered on the last micro-batch";
  }
  if (l.grad_bytes != 2) {
    char bytes[32];
    std::snprintf(bytes, sizeof bytes, "%g", l.grad_bytes);
    s += ", " + std::string(bytes) + "-byte gradient reduction";
  }
  if (l.optimizer_bytes != adam_state_bytes) {
    char bytes[32];
    std::snprintf(bytes, sizeof bytes, "%g", l.optimizer_bytes);
    s += ", " + std::string(bytes) + "-byte optimizer state";
  }
  if (l.gemm_precision != precision::bf16)
    s += ", " + std::string(name_of(l.gemm_precision)) + " GEMMs";
  if (l.sequence_parallel) s += ", sequence parallel";
  if (l.tp_across_nodes) s += ", TP across nodes";
  if (engine_of(l) == pipeline_engine::deepspeed) s += ", DeepSpeed's pipeline engine";
  return s;
}

/// Where a step's time goes, on the busiest pipeline rank: the parts add up to the step.
struct time_split {
  double compute = 0;    // forward, backward and recomputation, with blocking sends
  double tp_exposed = 0; // TP collectives on the critical path
  double cp_exposed = 0; // context parallelism's ring messages no attention covers
  double bubble = 0;     // the pipeline's fill and drain, with the sends it waits on
  double dp_exposed = 0; // DP reduction (ZeRO's gathers) not hidden behind the backward
  double optimizer = 0;  // the optimizer step
  double pp_sends = 0;   // PP sends and receives in all (inside compute or the bubble, not added)
};

[[nodiscard]] inline time_split split_time(const step_result& r) {
  time_split t;
  const double busy = r.pipeline_s / (1 + r.bubble); // the busiest rank's work
  // ZeRO-3's gathers and reduce-scatters that no compute covers sit inside the busiest rank's
  // forwards and backwards (step.hpp): counted as exposed DP communication, not compute.
  const double shard = std::min(r.shard_exposed_s, std::max(0.0, busy - r.tp.seconds));
  t.tp_exposed = r.tp.seconds;
  t.cp_exposed = std::min(r.cp_exposed_s, std::max(0.0, busy - r.tp.seconds - shard));
  t.compute = busy - r.tp.seconds - shard - t.cp_exposed;
  t.bubble = r.pipeline_s - busy;
  t.dp_exposed = r.dp_exposed_s + shard;
  t.optimizer = r.optimizer_s;
  t.pp_sends = r.pp.seconds;
  return t;
}

/// Where a GPU's memory goes, on the fullest rank: the parts add up to step_result::memory_bytes.
struct memory_split {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0;
  double buffers = 0; // ZeRO-3's gathered weights and whole gradients
};

[[nodiscard]] inline memory_split split_memory(const step_result& r) {
  memory_split s;
  s.parameters = r.states.weights;
  s.gradients = r.states.gradients;
  s.optimizer = r.states.optimizer;
  s.buffers = r.buffer_bytes;
  s.activations = r.activation_bytes - s.buffers;
  return s;
}

/// Why the winner wins: the time and memory splits of the search's #1 beside its #2 and, where
/// given, a reference layout (a published run's), one column each.
[[nodiscard]] inline std::string explain_winner(const search_result& s,
                                                const ranked_layout* given = nullptr,
                                                const std::string& given_name = "given") {
  std::vector<std::pair<std::string, const ranked_layout*>> cols;
  cols.emplace_back("#1", &s.ranked.front());
  if (s.ranked.size() > 1) cols.emplace_back("#2", &s.ranked[1]);
  if (given != nullptr) cols.emplace_back(given_name, given);
  const double gib = 1024.0 * 1024 * 1024;
  const auto row = [&](const char* name, auto value, double scale, const char* unit) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %-28s", name);
    std::string line = buf;
    for (const auto& c : cols) {
      std::snprintf(buf, sizeof buf, " %10.2f", value(*c.second) / scale);
      line += buf;
    }
    return line + " " + unit + "\n";
  };
  std::string out = "Why #1 wins, per step and per GPU:\n";
  for (const auto& c : cols)
    out += "  " + c.first + ": " + describe(c.second->l) + "\n";
  char head[64];
  std::snprintf(head, sizeof head, "  %-28s", "");
  out += head;
  for (const auto& c : cols) {
    std::snprintf(head, sizeof head, " %10s", c.first.c_str());
    out += head;
  }
  out += "\n";
  const auto t = [](auto field) {
    return [field](const ranked_layout& x) { return split_time(x.r).*field; };
  };
  const auto mem = [&](auto field) {
    return [field](const ranked_layout& x) { return split_memory(x.r).*field; };
  };
  out += row(
      "step", [](const ranked_layout& x) { return x.r.step_time_s; }, 1, "s");
  out += row("  compute", t(&time_split::compute), 1, "s");
  out += row("  bubble (with PP waits)", t(&time_split::bubble), 1, "s");
  out += row("  exposed TP communication", t(&time_split::tp_exposed), 1, "s");
  if (std::any_of(cols.begin(), cols.end(), [](const auto& c) { return c.second->l.cp > 1; }))
    out += row("  exposed CP communication", t(&time_split::cp_exposed), 1, "s");
  out += row("  exposed DP communication", t(&time_split::dp_exposed), 1, "s");
  out += row("  optimizer step", t(&time_split::optimizer), 1, "s");
  out += row("  (PP sends in all)", t(&time_split::pp_sends), 1, "s");
  out += row(
      "memory", [](const ranked_layout& x) { return x.r.memory_bytes(); }, gib, "GiB");
  out += row("  parameters", mem(&memory_split::parameters), gib, "GiB");
  out += row("  gradients", mem(&memory_split::gradients), gib, "GiB");
  out += row("  optimizer state", mem(&memory_split::optimizer), gib, "GiB");
  out += row("  activations", mem(&memory_split::activations), gib, "GiB");
  out += row("  buffers (ZeRO-3 gathers)", mem(&memory_split::buffers), gib, "GiB");
  // The largest difference in time between #1 and each other column, in words.
  const time_split w = split_time(s.ranked.front().r);
  for (std::size_t i = 1; i < cols.size(); ++i) {
    const time_split o = split_time(cols[i].second->r);
    const std::pair<const char*, double> parts[] = {
        {"compute", o.compute - w.compute},
        {"bubble", o.bubble - w.bubble},
        {"exposed TP communication", o.tp_exposed - w.tp_exposed},
        {"exposed CP communication", o.cp_exposed - w.cp_exposed},
        {"exposed DP communication", o.dp_exposed - w.dp_exposed},
        {"optimizer step", o.optimizer - w.optimizer}};
    const auto most =
        std::max_element(std::begin(parts), std::end(parts),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    const double gap = cols[i].second->r.step_time_s - s.ranked.front().r.step_time_s;
    out += "  #1 is " + detail::format("%.2f s", gap) + " a step faster than " + cols[i].first;
    if (gap > 0 && most->second > 0)
      out += ", most of it in " + std::string(most->first) +
             detail::format(" (%.2f s less)", most->second);
    out += ".\n";
  }
  return out;
}

/// Why the top `n` layouts rank where they do: per layout its throughput, where its
/// communication goes and what its bubble costs; then the rules of thumb, each with the
/// numbers of this search behind it.
[[nodiscard]] inline std::string explain(const search_result& s, const machine& mc,
                                         std::size_t n = 5) {
  std::string out;
  const int per_node = mc.cluster.devices_on(0);
  const double gib = 1024.0 * 1024 * 1024;
  for (std::size_t i = 0; i < std::min(n, s.ranked.size()); ++i) {
    const auto& [l, r, refusal] = s.ranked[i];
    out += "#" + std::to_string(i + 1) + "  " + describe(l) + "\n";
    out += detail::format(
        "    %.1f TFLOP/s per GPU (SC21), %.1f model TFLOP/s (MFU %.0f%%), step %.2f s\n",
        r.tflops_per_gpu, r.model_tflops_per_gpu, 100 * r.mfu, r.step_time_s);
    const memory_split mem = split_memory(r);
    out += detail::format("    memory %.1f GiB per GPU (states %.1f, activations %.1f",
                          r.memory_bytes() / gib, r.states.total() / gib, mem.activations / gib) +
           (mem.buffers > 0 ? detail::format(", ZeRO-3 buffers %.1f", mem.buffers / gib) : "") +
           ")\n";
    if (l.tp > 1)
      out += detail::format("    TP %.0f on ", l.tp) + std::string(r.tp.link) +
             detail::format(": %.2f s per step (%.0f%% of it)\n", r.tp.seconds,
                            100 * r.tp.seconds / r.step_time_s);
    if (l.pp > 1)
      out += detail::format(
          "    PP %.0f stages, %.0f micro-batches: bubble %.1f%% of ideal compute (1F1B's (p-1)/m "
          "= %.1f%%)\n",
          l.pp, r.microbatches, 100 * r.bubble, 100.0 * (l.pp - 1) / r.microbatches);
    if (l.cp > 1)
      out += detail::format("    CP %.0f on ", l.cp) + std::string(r.cp.link) +
             detail::format(": %.2f s of key-value ring messages per step\n", r.cp.seconds);
    if (l.grad_ranks() > 1)
      out += detail::format("    DP %.0f", l.dp) +
             (l.cp > 1 ? detail::format(" (gradients over DP x CP, %.0f ranks)", l.grad_ranks())
                       : std::string()) +
             " on " + std::string(r.dp.link) +
             detail::format(": %.2f s of collectives, %.2f s not hidden behind compute\n",
                            r.dp.seconds, split_time(r).dp_exposed);
    out +=
        "    weft::strategy runs it: " + (refusal.empty() ? std::string("yes") : "no, " + refusal) +
        "\n";
  }
  const ranked_layout& best = s.ranked.front();
  // Why TP stays inside a node: the best mesh whose TP group leaves the node.
  const auto across = std::find_if(s.ranked.begin(), s.ranked.end(),
                                   [&](const ranked_layout& x) { return x.l.tp > per_node; });
  if (best.l.tp <= per_node && across != s.ranked.end()) {
    out +=
        detail::format(
            "Why TP stays inside a node: the best layout with TP %.0f (over %.0f GPUs per node) "
            "ranks #",
            across->l.tp, per_node) +
        std::to_string(across - s.ranked.begin() + 1) +
        detail::format(" and is %.0f%% slower; its TP collectives cross ",
                       100 * (across->r.step_time_s / best.r.step_time_s - 1)) +
        std::string(topology::name_of(mc.cluster.inter().kind)) +
        detail::format(" at %.0f GB/s per NIC instead of ", mc.cluster.inter().bandwidth / 1e9) +
        std::string(topology::name_of(mc.cluster.intra().kind)) +
        detail::format(" at %.0f GB/s: %.2f s of TP communication per step against %.2f s.\n",
                       mc.cluster.intra().bandwidth / 1e9, across->r.tp.seconds, best.r.tp.seconds);
  }
  if (best.l.pp > 1) {
    out += detail::format(
               "What the bubble costs: #1 idles %.1f%% of its ideal compute (%.2f s per step) "
               "while its pipeline fills and drains; ",
               100 * best.r.bubble, best.r.bubble / (1 + best.r.bubble) * best.r.pipeline_s) +
           "fewer stages would shrink it but need more memory per GPU or more TP.\n";
  }
  std::size_t close = 1;
  while (close < s.ranked.size() && s.ranked[close].r.step_time_s <= 1.05 * best.r.step_time_s)
    ++close;
  if (close > 1)
    out +=
        "#1 to #" + std::to_string(close) +
        " are within 5% of each other, inside the simulator's error on published runs (up to 10%): "
        "take them as equals and choose by what the model leaves out (software, schedules "
        "available, headroom in memory).\n";
  out += "Searched " + std::to_string(s.meshes) + " meshes (" + std::to_string(s.out_of_memory) +
         " fit no variant in memory" +
         (s.unschedulable > 0
              ? ", " + std::to_string(s.unschedulable) + " have no schedule for the batch"
              : "") +
         (s.unrunnable > 0 ? ", " + std::to_string(s.unrunnable) +
                                 " fit only as layouts weft::strategy does not run"
                           : "") +
         "), simulated " + std::to_string(s.simulated) + " layouts.\n";
  return out;
}

} // namespace weft::sim
