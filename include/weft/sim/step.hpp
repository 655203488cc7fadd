#pragma once
// One training step of a TP x PP x DP layout, simulated: what it costs in time and memory.
//
//   per micro-batch, per pipeline rank (the busiest TP rank of it):
//     F  = its layers' forward: GEMMs (calibration.hpp's efficiency model), the attention
//          core, elementwise kernels at HBM speed, and 2 TP collectives per layer (all-reduce;
//          all-gather + reduce-scatter with sequence parallelism) priced by the cost model on
//          the rank's slowest TP group (one per replica; where tp does not divide a node's
//          GPUs some straddle two nodes); the last rank adds the logits, cross-entropy
//     B  = twice the forward's GEMMs and elementwise work, 2 TP collectives per layer (with
//          tp_overlap, as Megatron-LM since late 2021, the column-parallel linears' ones run
//          behind their GEMMs and only the excess shows), and the forward again under full
//          recompute (under selective the attention core: QK^T, AV, softmax and dropout);
//          with tp_comm_overlap (Megatron-core with Transformer Engine) every TP collective of
//          the forward and backward is pipelined with the GEMM beside it and only its excess
//          over the GEMM, and one chunk, shows;
//          split schedules (zb-h1) run it as B (input gradient) and W (weight gradient);
//          where the weight-gradient GEMMs do not accumulate into the step's gradients, a
//          pass over the rank's weights at HBM speed adds them (grad_accumulation_bytes);
//          FP8 (layout::gemm_precision) prices the Linears' GEMMs and casts as layer_cost.hpp says
//   the step = the pipeline schedule of weft::pipeline's generators run with those costs,
//          activations sent between stages over the slowest link each hop crosses (each TP
//          rank sends 1/t of it, SC21's scatter/gather), then the exposed part of the slowest
//          DP group's gradient reduction (bucketed: all but the last bucket overlaps the last
//          backward),
//          then the optimizer step at HBM speed.
//   ZeRO-3   (FSDP, HSDP) runs each micro-batch's forward and backward as sharded.hpp's passes
//          over the rank's blocks: each layer's weights gathered over the shard group before
//          its forward and again before its backward (reshard_after_forward), prefetch blocks
//          ahead (backward_prefetch in the backward), its gradient reduce-scattered after its
//          backward (with HSDP then all-reduced across the replica group); what no compute
//          covers lengthens the pass. Gathered once a step (sync once), the first
//          forward gathers and the last backward reduce-scatters, spread over the micro-batches;
//          under no_sync (sync last) every micro-batch gathers and only the last
//          one's backward reduce-scatters.
//   ZeRO-1   the gradients' reduce-scatter behind the last backward, the updated 16-bit weights'
//          all-gather after the optimizer step, where it shows whole; with
//          overlap_param_gather (Megatron-LM's distributed optimizer) behind the next step's
//          first forward.
//   prices   the collectives by collective_price.hpp, each layer's compute by layer_cost.hpp,
//          the memory by memory.hpp; the layout and its rank numbering are layout.hpp's, the
//          engine presets pipeline_engine.hpp's. This header includes them all.
#include <weft/core/error.hpp>
#include <weft/mesh/mesh.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stats.hpp>
#include <weft/pipeline/validate.hpp>
#include <weft/sim/calibration.hpp>
#include <weft/sim/collective_price.hpp>
#include <weft/sim/cost_model.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/layer_cost.hpp>
#include <weft/sim/layout.hpp>
#include <weft/sim/memory.hpp>
#include <weft/sim/model.hpp>
#include <weft/sim/pipeline_engine.hpp>
#include <weft/sim/sharded.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::sim {

/// Time of one axis' communication over a step, as one GPU sees it.
struct axis_time {
  double seconds = 0;    // on the critical path of the busiest rank (TP, PP) or in all (DP)
  double per_call_s = 0; // one collective / message
  std::string_view link; // "nvlink", "ib", ... or "none"
};

struct step_result {
  int microbatches = 0;
  double step_time_s = 0;
  double tflops_per_gpu = 0;       // SC21 Eq. 3 convention (full recompute counted)
  double model_tflops_per_gpu = 0; // model FLOPs only (MFU's numerator)
  double mfu = 0;                  // model FLOPs / (peak * step time * GPUs)
  double bubble = 0;               // pipeline bubble over ideal compute
  double idle_fraction = 0;
  double pipeline_s = 0; // the schedule's makespan
  double forward_s = 0;  // per micro-batch on the busiest rank, TP comm included
  double backward_s = 0;
  double weight_s = 0; // split schedules only
  axis_time tp, pp, dp;
  axis_time cp; // context parallelism's key-value ring: what it sends on the busiest rank, one
                // message (a step of the ring), and the link; its exposed part is in the passes
  double dp_exposed_s = 0;    // after the pipeline: the DP reduction no backward covers
  double shard_exposed_s = 0; // ZeRO-3: the gathers and reduce-scatters no compute covers
                              // (inside pipeline_s: they hold the passes that wait on them)
  double cp_exposed_s = 0;    // context parallelism: the ring's messages no attention covers, on
                              // the busiest rank (inside pipeline_s, as above)
  double optimizer_s = 0;
  double weight_cast_s = 0;    // FP8 (Transformer Engine): the weights' casts, once a step
  state_memory states;         // bytes per GPU on the rank holding the most
  double activation_bytes = 0; // ZeRO-3's buffer_bytes included
  double buffer_bytes = 0;     // ZeRO-3's whole weights and gradients (memory.hpp)
  [[nodiscard]] double memory_bytes() const noexcept { return states.total() + activation_bytes; }
  pipeline::schedule schedule; // the simulated step, for traces
  pipeline::timeline timeline;
};

/// A pipeline schedule simulate_step generated and validated, kept for later calls whose layout
/// yields the same one (the planner simulates many variants of a mesh that share a schedule):
/// a call that finds its schedule here neither generates nor validates it, and its
/// step_result::schedule stays empty (the memo holds it). A call that does not replaces it.
struct schedule_memo {
  pipeline::schedule schedule;
  std::vector<int> peak; // detail::peak_in_flight(schedule)
  pipeline::schedule_kind kind{};
  int stages = 0, microbatches = 0, chunks = 0;
  std::size_t message_bytes = 0;
  bool held = false;
};

/// Simulates one step of `m` on `mc` laid out as `l`, with the constants `cal` (and `memo`, a
/// schedule kept from an earlier call, or none). Throws weft::error naming what is wrong with
/// the layout or schedule.
[[nodiscard]] inline step_result simulate_step(const model_spec& m, const machine& mc,
                                               const layout& l, const calibration& cal,
                                               schedule_memo* memo = nullptr) {
  m.check();
  detail::check_layout(m, mc, l);
  const gpu& g = mc.device;
  const topology::cluster net = detail::achieved(mc.cluster, cal);
  const int t = l.tp, p = l.pp, G = l.grad_ranks();
  // Sequences per micro-batch on a rank: with context parallelism each rank holds 1/cp of each
  // sequence's tokens for every layer, and computes attention for its queries against the
  // whole sequence (1/cp of the core's work), which b / cp prices.
  const double b = static_cast<double>(l.micro_batch) / l.cp;
  const double T = b * m.seq, h = m.h();
  step_result out;
  out.microbatches = l.microbatches();

  // --- communication prices --------------------------------------------------------------
  // Every TP group (one per pipeline rank and replica), pipeline hop and DP group is priced
  // where it lies, and each stage takes its slowest: where tp does not divide a node's GPUs
  // some TP groups straddle two nodes, and where tp * dp does not fill a node some hops stay
  // inside one. Groups whose members share nodes in the same pattern are priced once.
  // Ranks, groups and their order come from the layout's mesh_layout: rank r is device r.
  const mesh_layout mesh = l.mesh();
  const auto device = [&](int i, int r, int d, int c = 0) {
    return mesh.rank({.tp = i, .pp = r, .dp = d, .cp = c});
  };
  // The ranks a weight's gradient is reduced over (layout::grad_ranks): those of `dev`'s DP
  // group, and with context parallelism of its CP groups too, in rank order.
  const auto grad_group = [&](int dev) {
    if (l.cp == 1) return mesh.group(axis::dp, dev);
    const mesh_coord at = mesh.coords(dev);
    std::vector<int> members;
    for (int d = 0; d < l.dp; ++d)
      for (int c = 0; c < l.cp; ++c)
        members.push_back(device(at.tp, at.pp, d, c));
    std::sort(members.begin(), members.end());
    return members;
  };
  // How many TP, CP and DP groups have members on one node (the first) and others elsewhere:
  // they run their collectives at once and share its NICs (a group inside the node uses none).
  int tp_sharing = 0, cp_sharing = 0, dp_sharing = 0;
  for (const axis a : {axis::tp, axis::cp, axis::dp}) {
    const auto group_of = [&](int dev) {
      return a == axis::dp ? grad_group(dev) : mesh.group(a, dev);
    };
    // The groups with a member on the first node, each once, named by its first member.
    std::vector<int> firsts;
    const int first_node = std::min(mc.cluster.devices_on(0), l.gpus());
    for (int dev = 0; dev < first_node; ++dev)
      firsts.push_back(group_of(dev).front());
    std::sort(firsts.begin(), firsts.end());
    firsts.erase(std::unique(firsts.begin(), firsts.end()), firsts.end());
    int& sharing = a == axis::tp ? tp_sharing : a == axis::cp ? cp_sharing : dp_sharing;
    for (const int first : firsts) {
      const std::vector<int> members = group_of(first);
      if (std::any_of(members.begin(), members.end(),
                      [&](int d) { return mc.cluster.node_of(d) != 0; }))
        ++sharing;
    }
  }
  const topology::cluster tp_net = detail::nic_share(net, tp_sharing);
  const topology::cluster cp_net = detail::nic_share(net, cp_sharing);
  const topology::cluster dp_net = detail::nic_share(net, dp_sharing);
  const auto act = static_cast<std::size_t>(T * h);
  // One of a layer's two TP collectives per pass: an all-reduce, or with sequence parallelism
  // an all-gather before the block and a reduce-scatter after it; per pipeline rank, its
  // slowest group's.
  struct tp_price {
    double call = 0, gather = 0, scatter = 0;
    std::string_view link = "none";
  };
  std::vector<tp_price> tp_of(static_cast<std::size_t>(p));
  if (t > 1) {
    std::map<std::vector<int>, tp_price> priced;
    for (int r = 0; r < p; ++r) {
      for (int d = 0; d < l.dp * l.cp; ++d) {
        const std::vector<int> members = mesh.group(axis::tp, device(0, r, d / l.cp, d % l.cp));
        auto [it, fresh] = priced.try_emplace(detail::node_pattern(members, mc.cluster));
        tp_price& q = it->second;
        if (fresh) {
          if (l.sequence_parallel) {
            q.gather = detail::price_group(collective::all_gather, members,
                                           act / static_cast<std::size_t>(t), 2, tp_net);
            q.scatter = detail::price_group(collective::reduce_scatter, members,
                                            act / static_cast<std::size_t>(t), 2, tp_net);
            q.call = q.gather + q.scatter;
          } else {
            q.call = detail::price_group(collective::all_reduce, members, act, 2, tp_net);
          }
          q.link = detail::link_name(members, mc.cluster);
        }
        if (q.call > tp_of[static_cast<std::size_t>(r)].call)
          tp_of[static_cast<std::size_t>(r)] = q;
      }
    }
  }
  const tp_price tp_worst =
      *std::max_element(tp_of.begin(), tp_of.end(),
                        [](const tp_price& a, const tp_price& x) { return a.call < x.call; });
  out.tp = {0, tp_worst.call, tp_worst.link};

  // Context parallelism's ring (Megatron-core with Transformer Engine's ring attention,
  // AttnFuncWithCPAndKVP2P): in each of a layer's forward steps but the last the rank sends the
  // keys and values it holds (its T tokens, 2 kv width / tp 16-bit values each) to the next CP
  // rank while it computes attention against them. The backward sends the same way: the keys and
  // values on its first step, their gradients on its last, both together (twice the bytes) on
  // the cp - 2 between. Priced on the slowest CP group's slowest hop.
  double cp_message = 0, cp_double = 0; // keys and values; keys, values and their gradients
  std::string_view cp_link = "none";
  if (l.cp > 1) {
    const double bytes = 2.0 * T * (m.qkv_width() - h) / t;
    for (int r = 0; r < p; ++r) {
      for (int d = 0; d < l.dp; ++d) {
        for (int i = 0; i < t; ++i) {
          const std::vector<int> ring = mesh.group(axis::cp, device(i, r, d));
          for (std::size_t k = 0; k < ring.size(); ++k) {
            const topology::link& lk = cp_net.link_between(ring[k], ring[(k + 1) % ring.size()]);
            const double x = lk.latency + bytes / lk.bandwidth;
            if (x > cp_message) {
              cp_message = x;
              cp_double = lk.latency + 2.0 * bytes / lk.bandwidth;
              cp_link = topology::name_of(lk.kind);
            }
          }
        }
      }
    }
  }

  // Activation messages between pipeline neighbours: hop r joins rank r to rank r + 1 (the
  // last to the first, for the interleaved schedule's next chunk), on the slowest link any
  // replica's TP ranks cross there.
  const std::size_t msg_bytes =
      static_cast<std::size_t>(2.0 * T * h / (l.p2p_scatter_gather && t > 1 ? t : 1));
  std::vector<const topology::link*> hop(static_cast<std::size_t>(p), nullptr);
  std::vector<double> hop_s(static_cast<std::size_t>(p), 0.0);
  double p2p_call = 0;
  std::string_view p2p_link = "none";
  for (int r = 0; r < p && p > 1; ++r) {
    if (r == p - 1 && l.chunks == 1) break;
    const topology::link* slowest = nullptr;
    for (int d = 0; d < l.dp * l.cp; ++d) {
      for (int i = 0; i < t; ++i) {
        const int dd = d / l.cp, c = d % l.cp;
        const topology::link& lk =
            net.link_between(device(i, r, dd, c), device(i, (r + 1) % p, dd, c));
        if (slowest == nullptr || lk.bandwidth < slowest->bandwidth ||
            (lk.bandwidth == slowest->bandwidth && lk.latency > slowest->latency))
          slowest = &lk;
      }
    }
    hop[static_cast<std::size_t>(r)] = slowest;
    hop_s[static_cast<std::size_t>(r)] =
        slowest->latency + static_cast<double>(msg_bytes) / slowest->bandwidth;
    if (hop_s[static_cast<std::size_t>(r)] > p2p_call) {
      p2p_call = hop_s[static_cast<std::size_t>(r)];
      p2p_link = topology::name_of(slowest->kind);
    }
  }
  out.pp = {0, p2p_call, p2p_link};

  // --- compute per micro-batch per rank ----------------------------------------------------
  const bool split = l.schedule == pipeline::schedule_kind::zero_bubble_h1;
  const layer_cost fwd = layer_forward(m, b, t, l.sequence_parallel, g, cal, l.gemm_precision);
  // One layer's forward and backward with a pipeline rank's TP prices. The backward's TP
  // collectives: two, like the forward's, on the critical path; with tp_overlap the two
  // column-parallel linears' collectives run during their GEMMs (only what outlasts a GEMM
  // shows), and with SP the gathers of the gradient before the two row-parallel linears
  // remain. A split schedule runs the weight-gradient GEMMs apart.
  // The backward: input-gradient GEMMs (as many FLOPs as the forward's), the attention core and
  // the elementwise kernels twice over, under FP8 the output gradients' casts, the TP
  // collectives, and what is recomputed (full: the
  // whole forward; selective: the attention core, its QK^T and AV GEMMs and its softmax and
  // dropout); the weight-gradient GEMMs (W) as many FLOPs as the forward's again.
  struct layer_times {
    double f, b_input, tp_backward;
  };
  // What the CP ring shows beyond the attention it runs beside, message by message: each beside
  // a step of the rank's attention core as priced (1/cp of it, no causal saving), the backward's
  // twice the forward's.
  const double cp_step = fwd.attention_s / l.cp;
  const auto beyond = [](double message, double step) { return std::max(0.0, message - step); };
  const double cp_forward = (l.cp - 1) * beyond(cp_message, cp_step);
  const double cp_backward = l.cp > 1 ? 2.0 * beyond(cp_message, 2.0 * cp_step) +
                                            (l.cp - 2) * beyond(cp_double, 2.0 * cp_step)
                                      : 0.0;
  const auto layer_with = [&](const tp_price& q) {
    layer_times lt{};
    lt.f = fwd.total() + 2.0 * q.call + cp_forward;
    lt.tp_backward = 2.0 * q.call;
    if (l.tp_overlap && !split && t > 1) {
      const auto shows = [](double comm, double gemm) { return std::max(0.0, comm - gemm); };
      lt.tp_backward = l.sequence_parallel
                           ? 2.0 * q.gather + shows(q.gather, fwd.qkv_gemm_s) +
                                 shows(q.scatter, fwd.qkv_gemm_s) + shows(q.gather, fwd.up_gemm_s) +
                                 shows(q.scatter, fwd.up_gemm_s)
                           : shows(q.call, fwd.qkv_gemm_s) + shows(q.call, fwd.up_gemm_s);
    }
    lt.b_input = fwd.gemm_s + 2.0 * (fwd.attention_s + fwd.elementwise_s) + fwd.grad_cast_s +
                 lt.tp_backward + cp_backward;
    if (l.tp_comm_overlap && t > 1) {
      // Pipelined in tp chunks: the excess over the GEMM shows, and one chunk of the shorter.
      const auto piped = [t](double comm, double gemm) {
        return std::max(0.0, comm - gemm) + std::min(comm, gemm) / t;
      };
      lt.f = fwd.total() + piped(q.gather, fwd.qkv_gemm_s) + piped(q.scatter, fwd.proj_gemm_s) +
             piped(q.gather, fwd.up_gemm_s) + piped(q.scatter, fwd.down_gemm_s) + cp_forward;
      // The output gradients' gathers under the row-parallel input-gradient GEMMs; the inputs'
      // re-gathers and the input gradients' reduce-scatters under the column-parallel ones'
      // input- and weight-gradient GEMMs (a split schedule runs those apart: there they show).
      lt.tp_backward =
          piped(q.gather, fwd.proj_gemm_s) + piped(q.gather, fwd.down_gemm_s) +
          (split ? 2.0 * q.call
                 : piped(q.gather, fwd.qkv_gemm_s) + piped(q.scatter, fwd.qkv_gemm_s) +
                       piped(q.gather, fwd.up_gemm_s) + piped(q.scatter, fwd.up_gemm_s));
      lt.b_input = fwd.gemm_s + 2.0 * (fwd.attention_s + fwd.elementwise_s) + fwd.grad_cast_s +
                   lt.tp_backward + cp_backward;
    }
    if (l.recomputation == recompute::full) lt.b_input += lt.f;
    if (l.recomputation == recompute::selective)
      lt.b_input += fwd.attention_s + fwd.core_elementwise_s + cp_forward;
    return lt;
  };
  const double layer_b_weight = fwd.gemm_s;

  // The logits and the cross-entropy (fp32, read and written three times) on the last rank.
  // The output layer's GEMMs are FP8 under torchao's float8 (torchtitan converts every Linear
  // whose sides divide by 16, and filters none by default), with the casts of its input and
  // weight in the forward and of its output gradient in the backward; bf16 otherwise
  // (Megatron-core's output layer is not a Transformer Engine module).
  const precision logit_precision =
      l.gemm_precision == precision::fp8_linear ? l.gemm_precision : precision::bf16;
  const double logit_gemm =
      detail::gemm_time(T, m.vocab / static_cast<double>(t), h, 1, g, cal, logit_precision);
  const double logit_f =
      logit_gemm + 3.0 * 4.0 * T * m.vocab / t / (g.hbm_bandwidth * cal.hbm_fraction);
  const double logit_w = logit_gemm;
  const double cast_per_element =
      detail::cast_bytes(logit_precision) / (g.hbm_bandwidth * cal.hbm_fraction);
  const double logit_cast = cast_per_element * (T * h + h * m.vocab / t);
  const double logit_grad_cast = cast_per_element * T * m.vocab / t;

  const std::vector<int> layers_of = detail::layers_per_rank(m, p);
  const std::vector<double> rank_weights = detail::weights_per_rank(m, l, layers_of);

  // --- sharded data parallelism (ZeRO-3): each block's gather and reduce-scatter ---------------
  // Priced on each pipeline rank's slowest shard group (inner) and, with HSDP, replica group
  // (outer): a layer's weights per TP rank, and the rank's embedding and output layer as one
  // more block. The groups crossing nodes from the first node share its NICs.
  struct shard_price {
    double gather = 0, reduce = 0; // a layer's
    double root_gather = 0, root_reduce = 0;
  };
  std::vector<shard_price> shard_of(static_cast<std::size_t>(p));
  std::string_view shard_link = "none";
  const int S = l.shards();
  if (l.zero == 3 && G > 1) {
    const auto inner_of = [&](const std::vector<int>& dp_group, int d) {
      const auto first = dp_group.begin() + (d / S) * S;
      return std::vector<int>(first, first + S);
    };
    const auto outer_of = [&](const std::vector<int>& dp_group, int d) {
      std::vector<int> g;
      for (int k = d % S; k < G; k += S)
        g.push_back(dp_group[static_cast<std::size_t>(k)]);
      return g;
    };
    // NIC sharing of the replica groups: those with a member on the first node that cross nodes.
    int outer_sharing = 0;
    if (S < G) {
      std::vector<int> firsts;
      const int first_node = std::min(mc.cluster.devices_on(0), l.gpus());
      for (int dev = 0; dev < first_node; ++dev) {
        const std::vector<int> g = grad_group(dev);
        const int d = static_cast<int>(std::find(g.begin(), g.end(), dev) - g.begin());
        const std::vector<int> o = outer_of(g, d);
        if (std::any_of(o.begin(), o.end(), [&](int x) { return mc.cluster.node_of(x) != 0; }))
          firsts.push_back(o.front());
      }
      std::sort(firsts.begin(), firsts.end());
      outer_sharing = static_cast<int>(std::unique(firsts.begin(), firsts.end()) - firsts.begin());
    }
    const topology::cluster inner_net = S < G ? net : dp_net;
    const topology::cluster outer_net = detail::nic_share(net, outer_sharing);
    const double layer_weights = m.layer_parameters() / t;
    // Groups whose members share nodes in the same pattern cost the same: priced once per
    // pattern and block size.
    std::map<std::pair<std::vector<int>, std::size_t>, std::pair<double, double>> priced;
    for (int r = 0; r < p; ++r) {
      const double root = rank_weights[static_cast<std::size_t>(r)] -
                          layers_of[static_cast<std::size_t>(r)] * layer_weights;
      for (int i = 0; i < t; ++i) {
        const std::vector<int> group = grad_group(device(i, r, 0));
        const std::vector<int> pattern = detail::node_pattern(group, mc.cluster);
        const auto price = [&](double weights) {
          const auto n = static_cast<std::size_t>(weights / S);
          auto [it, fresh] = priced.try_emplace({pattern, n});
          if (fresh) {
            const std::vector<int> inner = inner_of(group, 0), outer = outer_of(group, 0);
            const auto bytes = static_cast<std::size_t>(l.grad_bytes);
            it->second.first = detail::price_group(collective::all_gather, inner, n, 2, inner_net);
            it->second.second =
                detail::price_group(collective::reduce_scatter, inner, n, bytes, inner_net) +
                (outer.size() > 1
                     ? detail::price_group(collective::all_reduce, outer, n, bytes, outer_net)
                     : 0.0);
          }
          return it->second;
        };
        const auto [g, rs] = price(layer_weights);
        const auto [rg, rrs] = price(root);
        shard_price& q = shard_of[static_cast<std::size_t>(r)];
        if (g + rs > q.gather + q.reduce) q = {g, rs, rg, rrs};
      }
    }
    const std::vector<int> group0 = grad_group(device(0, 0, 0));
    shard_link = detail::link_name(S < G ? group0 : inner_of(group0, 0), mc.cluster);
  }
  // One micro-batch's exposed gathers and reduce-scatters on a rank whose forward is `f`
  // (`f_layer` per layer) and backward `b` (`b_layer`): the two passes run; averaged over the
  // micro-batches where only the first gathers and the last reduce-scatters.
  struct shard_exposure {
    double forward = 0, backward = 0, communication = 0;
  };
  const auto shard_exposed = [&](int r, double f, double f_layer, double b, double b_layer) {
    shard_exposure e;
    if (l.zero != 3 || G == 1) return e;
    const shard_price& q = shard_of[static_cast<std::size_t>(r)];
    const int L = layers_of[static_cast<std::size_t>(r)];
    const shard_cadence cadence = l.cadence();
    std::vector<shard_block> fwd_blocks{{0.0, q.root_gather, 0.0}};
    for (int k = 0; k < L; ++k)
      fwd_blocks.push_back({f_layer, q.gather, 0.0});
    fwd_blocks.back().compute_s += f - L * f_layer; // the logits, the messages
    // The backward with its reduce-scatters (`reduce` 1) or without (0: a micro-batch under
    // no_sync, when only the last one of the step reduces).
    const auto backward = [&](double reduce) {
      std::vector<shard_block> bwd_blocks{{b - L * b_layer, 0.0, 0.0}};
      for (int k = 0; k < L; ++k)
        bwd_blocks.push_back({b_layer, cadence.regather ? q.gather : 0.0, reduce * q.reduce});
      bwd_blocks.push_back({0.0, 0.0, reduce * q.root_reduce});
      return run_sharded_pass(bwd_blocks, l.backward_prefetch, cal.overlap_slowdown).exposed_s;
    };
    const double every = cadence.every, reducing = cadence.reducing;
    e.forward = every * run_sharded_pass(fwd_blocks, l.prefetch, cal.overlap_slowdown).exposed_s;
    e.backward =
        every * (reducing * backward(1) + (reducing < 1 ? (1 - reducing) * backward(0) : 0));
    e.communication = cadence.gathers() * (L * q.gather + q.root_gather) +
                      cadence.reduces() * (L * q.reduce + q.root_reduce);
    return e;
  };

  struct rank_cost {
    double f, b, w;
    shard_exposure shard;
  };
  std::vector<rank_cost> cost(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    const double L = layers_of[static_cast<std::size_t>(r)];
    const layer_times lt = layer_with(tp_of[static_cast<std::size_t>(r)]);
    rank_cost& c = cost[static_cast<std::size_t>(r)];
    c.f = L * lt.f;
    c.b = L * lt.b_input;
    c.w = L * layer_b_weight;
    if (l.p2p_blocking && p > 1) { // each F receives and sends an activation, each B a gradient
      const double messages = (r > 0 ? hop_s[static_cast<std::size_t>(r - 1)] : 0.0) +
                              (r < p - 1 ? hop_s[static_cast<std::size_t>(r)] : 0.0);
      c.f += messages * l.chunks;
      c.b += messages * l.chunks;
    }
    if (r == p - 1) {
      c.f += logit_f + logit_cast;
      c.b += logit_w + 2.0 * (logit_f - logit_w) + logit_grad_cast;
      c.w += logit_w;
    }
    // Adding this micro-batch's weight gradients to the step's, unless the GEMMs do it, and
    // under ZeRO-3 the engine's own copies (sharded.hpp's shard_copy_bytes_of).
    const double copies = l.grad_accumulation_bytes + shard_copy_bytes_of(l);
    c.w +=
        rank_weights[static_cast<std::size_t>(r)] * copies / (g.hbm_bandwidth * cal.hbm_fraction);
    // ZeRO-3: the gathers and reduce-scatters no compute covers, in the passes that run them.
    const double accumulation =
        m.layer_parameters() / t * copies / (g.hbm_bandwidth * cal.hbm_fraction);
    c.shard = shard_exposed(r, c.f, lt.f, c.b + c.w, lt.b_input + layer_b_weight + accumulation);
    c.f += c.shard.forward;
    c.b += c.shard.backward;
    if (!split) {
      c.b += c.w;
      c.w = 0;
    }
  }
  const auto busiest = std::max_element(
      cost.begin(), cost.end(),
      [](const rank_cost& a, const rank_cost& x) { return a.f + a.b + a.w < x.f + x.b + x.w; });
  out.forward_s = busiest->f;
  out.backward_s = busiest->b;
  out.weight_s = busiest->w;

  // --- the pipeline ------------------------------------------------------------------------
  const bool kept = memo != nullptr && memo->held && memo->kind == l.schedule &&
                    memo->stages == p && memo->microbatches == out.microbatches &&
                    memo->chunks == l.chunks && memo->message_bytes == msg_bytes;
  if (!kept) {
    pipeline::options po;
    po.activation_bytes = msg_bytes;
    po.gradient_bytes = msg_bytes;
    out.schedule = pipeline::generate(l.schedule, p, out.microbatches, l.chunks, po);
    pipeline::validate(out.schedule);
    if (memo != nullptr) {
      *memo = {.schedule = std::move(out.schedule),
               .peak = {},
               .kind = l.schedule,
               .stages = p,
               .microbatches = out.microbatches,
               .chunks = l.chunks,
               .message_bytes = msg_bytes,
               .held = true};
      memo->peak = detail::peak_in_flight(memo->schedule);
      out.schedule = {};
    }
  }
  const pipeline::schedule& s = memo != nullptr ? memo->schedule : out.schedule;
  const double v = s.chunks;
  auto times = pipeline::detail::run(
      s, "simulating schedule " + s.name,
      [&](int r, const pipeline::action& a) {
        const rank_cost& c = cost[static_cast<std::size_t>(r)];
        switch (a.kind) {
          case pipeline::action_kind::forward: return c.f / v;
          case pipeline::action_kind::backward: return c.b / v;
          case pipeline::action_kind::weight: return c.w / v;
          default: return 0.0;
        }
      },
      [&](const pipeline::action& a) {
        if (l.p2p_blocking) return 0.0; // already in the compute actions' costs
        // the hop the message crosses: a send's rank is one before its peer (activations) or
        // one after it (gradients)
        const int from = a.kind == pipeline::action_kind::send_activation ? (a.peer - 1 + p) % p
                                                                          : (a.peer + 1) % p;
        const topology::link* lk = hop[static_cast<std::size_t>(
            a.kind == pipeline::action_kind::send_activation ? from : a.peer)];
        return lk == nullptr ? 0.0 : lk->latency + static_cast<double>(a.bytes) / lk->bandwidth;
      });
  out.timeline = pipeline::timeline{std::move(times.start), std::move(times.end), 0.0};
  double busiest_busy = 0;
  double idle = 0;
  std::vector<double> busy(static_cast<std::size_t>(p), 0.0);
  for (int r = 0; r < p; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const auto& ends = out.timeline.end[ur];
    if (!ends.empty()) out.timeline.step_time = std::max(out.timeline.step_time, ends.back());
    busy[ur] = out.microbatches * (cost[ur].f + cost[ur].b + cost[ur].w);
    busiest_busy = std::max(busiest_busy, busy[ur]);
  }
  out.pipeline_s = out.timeline.step_time;
  for (double x : busy)
    idle += out.pipeline_s - x;
  // (clamped: with one stage the two differ by rounding only)
  out.bubble =
      busiest_busy > 0 ? std::max(0.0, (out.pipeline_s - busiest_busy) / busiest_busy) : 0.0;
  out.idle_fraction = out.pipeline_s > 0 ? idle / (p * out.pipeline_s) : 0.0;
  const auto busiest_rank = static_cast<std::size_t>(busiest - cost.begin());
  out.tp.seconds =
      t > 1 ? out.microbatches * layers_of[busiest_rank] *
                  (tp_of[busiest_rank].call * (l.recomputation == recompute::full ? 4.0 : 2.0) +
                   layer_with(tp_of[busiest_rank]).tp_backward)
            : 0.0;
  out.pp.seconds = p > 1 ? 2.0 * out.microbatches * s.chunks * p2p_call : 0.0;
  // The ring's messages on the busiest rank: the forward's (again where its attention is
  // recomputed) and the backward's.
  const double forwards = l.recomputation == recompute::none ? 1.0 : 2.0;
  const double layer_messages =
      l.cp > 1 ? forwards * (l.cp - 1) * cp_message + 2.0 * cp_message + (l.cp - 2) * cp_double
               : 0.0;
  out.cp = {out.microbatches * layers_of[busiest_rank] * layer_messages, cp_message, cp_link};
  out.cp_exposed_s =
      out.microbatches * layers_of[busiest_rank] * (forwards * cp_forward + cp_backward);

  // --- data parallelism and the optimizer ---------------------------------------------------
  const double rank_params = detail::rank_parameters(m, l, layers_of);
  const auto grad_elems = static_cast<std::size_t>(rank_params);
  const auto grad_size = static_cast<std::size_t>(l.grad_bytes);
  double dp_time = 0;
  double dp_scatter = 0, dp_gather = 0; // ZeRO-1's two halves, the slowest group's each
  std::string_view dp_link = "none";
  if (G > 1) {
    // ZeRO-0 all-reduces the gradients once a step. ZeRO-1 reduce-scatters them and all-gathers
    // the updated 16-bit weights once a step, priced apart (each shows behind different
    // compute, below). ZeRO-2 keeps 1/dp of the gradients, so each micro-batch's are
    // reduce-scattered as its backward makes them (m reduce-scatters, then the all-gather).
    // ZeRO-3 keeps 1/dp of the weights too and gathers them for every micro-batch's forward and
    // backward: 2m all-gathers and m reduce-scatters (DeepSpeed's stages 2 and 3 under gradient
    // accumulation). The slowest group's.
    const double micro = out.microbatches;
    const auto shard = grad_elems / static_cast<std::size_t>(G);
    struct group_price {
      double total = 0, scatter = 0, gather = 0;
    };
    std::map<std::vector<int>, group_price> priced;
    for (int r = 0; r < p; ++r) {
      for (int i = 0; i < t; ++i) {
        const std::vector<int> members = grad_group(device(i, r, 0));
        auto [it, fresh] = priced.try_emplace(detail::node_pattern(members, mc.cluster));
        group_price& x = it->second;
        if (fresh) {
          const auto price = [&](collective c, std::size_t n, std::size_t bytes) {
            return detail::price_group(c, members, n, bytes, dp_net);
          };
          if (l.zero == 0) {
            x.total = price(collective::all_reduce, grad_elems, grad_size);
          } else if (l.zero == 1) {
            x.scatter = price(collective::reduce_scatter, shard, grad_size);
            x.gather = price(collective::all_gather, shard, 2);
            x.total = x.scatter + x.gather;
          } else if (l.zero == 2) {
            x.total = price(collective::all_reduce, grad_elems, grad_size) +
                      (micro - 1) * price(collective::reduce_scatter, shard, grad_size);
          } // ZeRO-3: per block, in the passes (above)
        }
        dp_scatter = std::max(dp_scatter, x.scatter);
        dp_gather = std::max(dp_gather, x.gather);
        if (x.total > dp_time || dp_link == "none") {
          dp_time = x.total;
          dp_link = detail::link_name(members, mc.cluster);
        }
      }
    }
  }
  out.dp = {dp_time, dp_time, dp_link};
  if (l.zero == 3 && G > 1) {
    // Its exposed part is already in the passes (pipeline_s); dp says what it sends.
    const rank_cost& c = *busiest;
    out.dp = {c.shard.communication * out.microbatches, shard_of[busiest_rank].gather, shard_link};
    out.shard_exposed_s = (c.shard.forward + c.shard.backward) * out.microbatches;
    out.dp_exposed_s = 0;
  } else if (l.zero == 1 && G > 1) {
    // ZeRO-1: the gradients' reduce-scatter behind the last backward, in buckets; the updated
    // weights' all-gather after the optimizer step, where nothing hides it, or with
    // overlap_param_gather (the distributed optimizer's) behind the next step's first forward,
    // in buckets.
    const double rs = dp_scatter, ag = dp_gather;
    const double backward = out.backward_s + out.weight_s;
    const double buckets = l.dp_buckets;
    out.dp = {rs + ag, rs + ag, dp_link};
    out.dp_exposed_s = (l.overlap_dp ? std::max(rs / buckets, rs - backward) : rs) +
                       (l.overlap_param_gather ? std::max(ag / buckets, ag - out.forward_s) : ag);
  } else if (l.overlap_dp) {
    // The last micro-batch's backward; ZeRO-2 communicates under every micro-batch's backward.
    const double backward = out.backward_s + out.weight_s;
    const double window = l.zero == 0 ? backward : out.microbatches * backward;
    out.dp_exposed_s = std::max(dp_time / l.dp_buckets, dp_time - window);
  } else {
    out.dp_exposed_s = dp_time;
  }
  // A fused optimizer reads and writes its state and moves 8 bytes of gradient and 16-bit weight
  // besides, per weight of its shard: 32 bytes in all for Adam's 12 of fp32 state; an unfused
  // one what layout::optimizer_traffic_bytes says.
  const double optimizer_traffic =
      l.optimizer_traffic_bytes > 0 ? l.optimizer_traffic_bytes : 2.0 * l.optimizer_bytes + 8.0;
  out.optimizer_s = rank_params / l.shard_groups().optimizer * optimizer_traffic /
                    (g.hbm_bandwidth * cal.hbm_fraction);
  // FP8 under Transformer Engine: each layer's weights cast once a step, as the first
  // micro-batch's forward reaches it; that forward crosses every layer in turn.
  out.weight_cast_s = m.layers * fwd.weight_cast_s;
  out.step_time_s = out.pipeline_s + out.dp_exposed_s + out.optimizer_s + out.weight_cast_s;

  // --- throughput ----------------------------------------------------------------------------
  const double gpus = l.gpus();
  const double batch = l.batch();
  out.tflops_per_gpu = m.hardware_flops(batch, recompute::full) / (out.step_time_s * gpus) / 1e12;
  out.model_tflops_per_gpu = m.model_flops(batch) / (out.step_time_s * gpus) / 1e12;
  out.mfu = out.model_tflops_per_gpu * 1e12 / g.peak_flops;

  // --- memory ----------------------------------------------------------------------------
  std::vector<int> own_peak;
  if (memo == nullptr) own_peak = detail::peak_in_flight(s);
  const std::vector<int>& peak = memo != nullptr ? memo->peak : own_peak;
  const auto mem = detail::memory_of(m, l, layers_of, peak);
  out.states = mem.states;
  out.activation_bytes = mem.activations + mem.buffers;
  out.buffer_bytes = mem.buffers;
  return out;
}

[[nodiscard]] inline step_result simulate_step(const model_spec& m, const machine& mc,
                                               const layout& l) {
  return simulate_step(m, mc, l, calibration_of(mc.device));
}

} // namespace weft::sim