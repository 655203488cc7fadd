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
//          split schedules (zb-h1) run it as B (input gradient) and W (weight gradient);
//          where the weight-gradient GEMMs do not accumulate into the step's gradients, a
//          pass over the rank's weights at HBM speed adds them (grad_accumulation_bytes)
//   the step = the pipeline schedule of weft::pipeline's generators run with those costs,
//          activations sent between stages over the slowest link each hop crosses (each TP
//          rank sends 1/t of it, SC21's scatter/gather), then the exposed part of the slowest
//          DP group's gradient reduction (bucketed: all but the last bucket overlaps the last
//          backward),
//          then the optimizer step at HBM speed.
//   links    the node's links at the calibrated share a collective library reaches, the plans'
//          bytes on them plus one link latency per round of the plan (a library streams a
//          ring's chunks; the cost model alone charges the latency per chunk); the TP
//          (or DP) groups with members on one node run their collectives at once and split
//          its NICs; groups over 64 ranks and messages over 64 MiB per rank are priced from
//          smaller plans and extrapolated (price_group), so a search stays fast.
//
// Placement: ranks are numbered TP fastest, then DP, then PP (Megatron-LM's order), so a TP
// group of 8 fills one DGX; tp_across_nodes numbers TP slowest instead, one TP rank per node
// when dp * pp >= 8, which is the mistake the planner warns of.
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/schedule.hpp>
#include <weft/pipeline/stats.hpp>
#include <weft/pipeline/validate.hpp>
#include <weft/sim/calibration.hpp>
#include <weft/sim/cost_model.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/model.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace weft::sim {

/// How the model is spread, and how it trains.
struct layout {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int chunks = 1;        // V: model chunks per pipeline rank (interleaved schedule)
  int micro_batch = 1;   // sequences per micro-batch
  int global_batch = 0;  // sequences per step; 0: one micro-batch per DP rank
  pipeline::schedule_kind schedule = pipeline::schedule_kind::one_f_one_b;
  int zero = 0;                   // ZeRO stage 0..3 over the DP group
  bool sequence_parallel = false; // Korthikanti et al.: layer norms and dropout split over TP
  recompute recomputation = recompute::none;
  bool tp_across_nodes = false;   // number TP slowest: its ranks on different nodes
  bool overlap_dp = true;         // DP reduction overlaps the last backward (bucketed)
  int dp_buckets = 4;             // gradient buckets per pipeline rank
  bool p2p_scatter_gather = true; // each TP rank sends 1/tp of an activation (SC21 4.1)
  bool p2p_blocking = false;      // sends and receives hold the rank (DeepSpeed's pipeline
                                  // engine) instead of overlapping its compute (Megatron-LM)
  bool tp_overlap = false;        // the backward's TP collectives run during GEMMs (Megatron-LM
                                  // since late 2021: a column-parallel linear's input-gradient
                                  // all-reduce, or reduce-scatter with SP, during its
                                  // weight-gradient GEMM, SP's re-gather of its input during
                                  // its input-gradient GEMM); false: on the critical path
  double grad_bytes = 2;          // bytes per gradient element in the DP reduction
  double grad_accumulation_bytes = 0; // HBM bytes per weight and micro-batch to add its
                                  // gradient to the accumulated one outside the GEMM: 0 when
                                  // the weight-gradient GEMM accumulates into it (Megatron-LM's
                                  // gradient accumulation fusion, by early 2022); 6 for a
                                  // separate 16-bit add (read both, write one), 10 for 16-bit
                                  // into fp32; charged every micro-batch (autograd skips the
                                  // first one's add: one pass in m too many)

  [[nodiscard]] int gpus() const noexcept { return tp * pp * dp; }
  [[nodiscard]] int batch() const noexcept { return global_batch > 0 ? global_batch : dp * micro_batch; }
  [[nodiscard]] int microbatches() const noexcept { return batch() / (dp * micro_batch); }

  /// Device of the rank at (tp index, pp index, dp index).
  [[nodiscard]] int device(int t, int p, int d) const noexcept {
    return tp_across_nodes ? d + dp * (p + pp * t) : t + tp * (d + dp * p);
  }
};

/// layout::grad_accumulation_bytes of a software's gradient accumulation by name: "fused" (0),
/// "fp16" (6: a 16-bit add reads both gradients and writes one) or "fp32" (10: into fp32).
[[nodiscard]] inline double grad_accumulation_named(std::string_view s) {
  if (s == "fused") return 0;
  if (s == "fp16") return 6;
  if (s == "fp32") return 10;
  throw error("weft: sim: unknown gradient accumulation '" + std::string(s) + "': expected fused, fp16 or fp32");
}

/// Whose pipeline engine runs a layout's stages. `megatron`, Megatron-LM's (the layout's defaults):
/// each TP rank sends 1/tp of an activation (SC21 4.1) and the sends overlap compute; the DP
/// reduction runs in buckets behind the last backward. `deepspeed`, DeepSpeed's PipelineEngine
/// (MT-NLG, BLOOM): whole activations, sends and receives that hold the rank, and the DP reduction
/// after the last micro-batch's backward; it runs 1F1B only, under ZeRO 0 or 1.
enum class pipeline_engine { megatron, deepspeed };

[[nodiscard]] constexpr std::string_view name_of(pipeline_engine e) noexcept {
  return e == pipeline_engine::deepspeed ? "deepspeed" : "megatron";
}

[[nodiscard]] inline pipeline_engine pipeline_engine_named(std::string_view s) {
  for (pipeline_engine e : {pipeline_engine::megatron, pipeline_engine::deepspeed})
    if (name_of(e) == s) return e;
  throw error("weft: sim: unknown pipeline engine '" + std::string(s) + "': expected megatron or deepspeed");
}

/// Why engine `e` cannot run `l` ("" if it can).
[[nodiscard]] inline std::string engine_refusal(const layout& l, pipeline_engine e) {
  if (e != pipeline_engine::deepspeed) return "";
  if (l.pp < 2) return "DeepSpeed's pipeline engine runs pipelines of 2 stages or more, not pp " + std::to_string(l.pp);
  if (l.schedule != pipeline::schedule_kind::one_f_one_b)
    return "DeepSpeed's pipeline engine runs 1F1B only, not " + std::string(pipeline::name_of(l.schedule));
  if (l.zero > 1) return "DeepSpeed's pipeline engine runs under ZeRO 0 or 1, not ZeRO-" + std::to_string(l.zero);
  return "";
}

/// Sets `l`'s sends and DP reduction to engine `e`'s; throws if `e` cannot run `l`.
inline void use_engine(layout& l, pipeline_engine e) {
  if (const std::string why = engine_refusal(l, e); !why.empty()) throw error("weft: sim: " + why);
  const bool ds = e == pipeline_engine::deepspeed;
  l.p2p_scatter_gather = !ds;
  l.p2p_blocking = ds;
  l.overlap_dp = !ds;
}

/// The engine whose sends `l` prices: DeepSpeed's where they hold the rank.
[[nodiscard]] inline pipeline_engine engine_of(const layout& l) noexcept {
  return l.p2p_blocking ? pipeline_engine::deepspeed : pipeline_engine::megatron;
}

/// Time of one axis' communication over a step, as one GPU sees it.
struct axis_time {
  double seconds = 0;        // on the critical path of the busiest rank (TP, PP) or in all (DP)
  double per_call_s = 0;     // one collective / message
  std::string_view link;     // "nvlink", "ib", ... or "none"
};

struct step_result {
  int microbatches = 0;
  double step_time_s = 0;
  double tflops_per_gpu = 0;       // SC21 Eq. 3 convention (full recompute counted)
  double model_tflops_per_gpu = 0; // model FLOPs only (MFU's numerator)
  double mfu = 0;                  // model FLOPs / (peak * step time * GPUs)
  double bubble = 0;               // pipeline bubble over ideal compute
  double idle_fraction = 0;
  double pipeline_s = 0;           // the schedule's makespan
  double forward_s = 0;            // per micro-batch on the busiest rank, TP comm included
  double backward_s = 0;
  double weight_s = 0;             // split schedules only
  axis_time tp, pp, dp;
  double dp_exposed_s = 0;
  double optimizer_s = 0;
  state_memory states;             // bytes per GPU on the rank holding the most
  double activation_bytes = 0;
  [[nodiscard]] double memory_bytes() const noexcept { return states.total() + activation_bytes; }
  pipeline::schedule schedule;     // the simulated step, for traces
  pipeline::timeline timeline;
};

namespace detail {

/// The node's links as collectives achieve them.
inline topology::cluster achieved(const topology::cluster& c, const calibration& k) {
  topology::link intra = c.intra();
  topology::link inter = c.inter();
  intra.bandwidth *= k.nvlink_fraction;
  inter.bandwidth *= k.ib_fraction;
  return topology::cluster(c.devices_per_node(), intra, inter, c.nics_per_node(),
                           c.reduce_bandwidth());
}

inline double price_group(collective coll, const std::vector<int>& devices, std::size_t count,
                          std::size_t element_size, const topology::cluster& c);

/// Beyond this many bytes per rank a collective is priced at two smaller sizes and
/// extrapolated: past a few chunks per block its time is affine in the bytes (each extra
/// chunk adds one round of fixed cost and its bytes), and plans of gigabytes would take
/// seconds to build.
inline constexpr std::size_t extrapolate_above_bytes = std::size_t{64} << 20;

/// Groups larger than this are priced from two of their subgroups (the plans of p ranks hold
/// O(p^2) steps).
inline constexpr int max_priced_group = 64;

/// Prices `coll` of `count` elements of `element_size` bytes among `devices` with the ring,
/// and where the group spans nodes also the two-level ring (all-reduce; all-gather and
/// reduce-scatter over rails): the cheaper, as a collective library would pick.
inline double price_group(collective coll, const std::vector<int>& devices, std::size_t count,
                          std::size_t element_size, const topology::cluster& c) {
  const int n = static_cast<int>(devices.size());
  if (n <= 1 || count == 0) return 0;
  // Prices are kept: a search prices the same DP and TP groups for many variants.
  static std::mutex mutex;
  static std::map<std::tuple<int, std::vector<int>, std::size_t, std::size_t, std::string>, double> cache;
  auto key = std::make_tuple(static_cast<int>(coll), devices, count, element_size, c.to_string());
  {
    const std::lock_guard lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const auto keep = [&](double t) {
    const std::lock_guard lock(mutex);
    if (cache.size() > 4096) cache.clear();
    cache.emplace(std::move(key), t);
    return t;
  };
  if (n > max_priced_group) {
    // A collective of S bytes over p ranks costs about a (p - 1) + b (p - 1) / p (rounds of
    // fixed cost, and the share of the bytes each rank's link carries); fit a and b to the
    // plans of the group's first 32 and 64 members, whose placement repeats the group's.
    const bool per_rank = coll == collective::reduce_scatter || coll == collective::all_gather;
    const double total = static_cast<double>(count) * (per_rank ? n : 1);
    const auto at = [&](int q) {
      const std::vector<int> sub(devices.begin(), devices.begin() + q);
      const auto cq = static_cast<std::size_t>(per_rank ? total / q : total);
      return price_group(coll, sub, cq > 0 ? cq : 1, element_size, c);
    };
    const double p1 = max_priced_group / 2.0, p2 = max_priced_group;
    const double t1 = at(max_priced_group / 2), t2 = at(max_priced_group);
    // t = a (p-1) + b (p-1)/p at p1 and p2
    const double x1 = p1 - 1, y1 = (p1 - 1) / p1, x2 = p2 - 1, y2 = (p2 - 1) / p2;
    const double det = x1 * y2 - x2 * y1;
    const double a = (t1 * y2 - t2 * y1) / det;
    const double b = (x1 * t2 - x2 * t1) / det;
    return keep(std::max(t2, a * (n - 1) + b * (n - 1.0) / n));
  }
  if (count * element_size > extrapolate_above_bytes) {
    const std::size_t c2 = extrapolate_above_bytes / element_size;
    const std::size_t c1 = c2 / 2;
    const double t1 = price_group(coll, devices, c1, element_size, c);
    const double t2 = price_group(coll, devices, c2, element_size, c);
    return keep(t2 + (t2 - t1) / static_cast<double>(c2 - c1) * static_cast<double>(count - c2));
  }
  plan_request q;
  q.coll = coll;
  q.size = n;
  q.count = count;
  q.element_size = element_size;
  for (int d : devices)
    q.node_of.push_back(c.node_of(d));
  const bool spans = std::any_of(q.node_of.begin(), q.node_of.end(),
                                 [&](int x) { return x != q.node_of.front(); });
  // The cost model charges every message its link's latency in turn, as weft's transports
  // (and the emulated links) pay it; a collective library on real links streams a ring's
  // chunks back to back and pays the latency once per round. So: the plans' bytes on
  // latency-free links, plus one latency per round (the inter-node one when the group
  // spans nodes). Without this a ring of 1 MiB chunks on NVLink3 reaches two thirds of the
  // bus bandwidth nvlink_fraction stands for.
  const topology::link intra{c.intra().kind, c.intra().bandwidth, 0.0};
  const topology::link inter{c.inter().kind, c.inter().bandwidth, 0.0};
  const topology::cluster wire(c.devices_per_node(), intra, inter, c.nics_per_node(), c.reduce_bandwidth());
  const double latency = spans ? std::max(c.intra().latency, c.inter().latency) : c.intra().latency;
  const auto streamed = [&](const std::vector<plan>& plans) {
    std::uint32_t rounds = 0;
    for (const plan& pl : plans)
      if (!pl.steps().empty()) rounds = std::max(rounds, pl.steps().back().round + 1);
    return price(plans, wire, devices, element_size) + rounds * latency;
  };
  double best = streamed(plans_of(&algo::ring::make_plan, q));
  if (spans && algo::hierarchical<algo::ring, algo::ring>::serves(coll))
    best = std::min(best, streamed(plans_of(&algo::hierarchical<algo::ring, algo::ring>::make_plan, q)));
  return keep(best);
}

/// `c` as one of `sharing` groups that run at once with members on every node sees it: the
/// node's NICs split among them (rounded down); with more groups than NICs, one NIC at
/// nics / sharing of its bandwidth, the node's NIC bandwidth split evenly.
inline topology::cluster nic_share(const topology::cluster& c, int sharing) {
  const int nics = c.nics_per_node();
  if (sharing <= 1) return c;
  if (sharing <= nics)
    return topology::cluster(c.devices_per_node(), c.intra(), c.inter(), nics / sharing, c.reduce_bandwidth());
  topology::link shared = c.inter();
  shared.bandwidth *= static_cast<double>(nics) / sharing;
  return topology::cluster(c.devices_per_node(), c.intra(), shared, 1, c.reduce_bandwidth());
}

inline std::string_view link_name(const std::vector<int>& devices, const topology::cluster& c) {
  if (devices.size() <= 1) return "none";
  for (int d : devices)
    if (c.node_of(d) != c.node_of(devices.front())) return topology::name_of(c.inter().kind);
  return topology::name_of(c.intra().kind);
}

/// Which members of a group share a node: each member's node, numbered in order of first
/// appearance ({0, 0, 1, 1}: the first two on one node, the others on another). The links are
/// the same on every node, so groups with one pattern cost the same.
inline std::vector<int> node_pattern(const std::vector<int>& devices, const topology::cluster& c) {
  std::vector<int> nodes, pattern;
  pattern.reserve(devices.size());
  for (int d : devices) {
    const int n = c.node_of(d);
    const auto it = std::find(nodes.begin(), nodes.end(), n);
    pattern.push_back(static_cast<int>(it - nodes.begin()));
    if (it == nodes.end()) nodes.push_back(n);
  }
  return pattern;
}

/// Seconds of a GEMM m x n x k (times `batch` independent ones) on `g`.
inline double gemm_time(double m, double n, double k, double batch, const gpu& g,
                        const calibration& cal) {
  const auto q = [&](double d) { return d / (d + cal.gemm_half_dim); };
  const double eff = cal.gemm_peak_fraction * q(m) * q(n) * q(k);
  const double compute = 2.0 * m * n * k * batch / (g.peak_flops * eff);
  const double traffic = 2.0 * (m * k + k * n + m * n) * batch / (g.hbm_bandwidth * cal.hbm_fraction);
  return std::max(compute, traffic);
}

} // namespace detail

/// Compute seconds of one layer's forward on one TP rank, for a micro-batch of b sequences,
/// without communication: the GEMMs, the attention core, and the elementwise kernels. Their
/// bytes per token, an estimate: 15h for the two layer norms (each reads and writes h 16-bit
/// values: 8h) and the two fused bias-dropout-residual adds (7h in all), replicated on every
/// TP rank unless sequence parallel; the activation function reads and writes f/t 16-bit
/// values (4f/t; 6f/t gated); the attention core's softmax and dropout read and write the
/// b a/t s^2 scores (9 bytes each: 2+2 softmax, 2+2 dropout, a 1-byte mask) unless fused.
struct layer_cost {
  double gemm_s = 0;
  double attention_s = 0;
  double elementwise_s = 0;      // all of them, core_elementwise_s included
  double core_elementwise_s = 0; // the attention core's softmax and dropout (0 when fused)
  double qkv_gemm_s = 0;         // the column-parallel GEMMs, whose backward collectives
  double up_gemm_s = 0;          // Megatron-LM overlaps (layout::tp_overlap)
  [[nodiscard]] double total() const noexcept { return gemm_s + attention_s + elementwise_s; }
};

[[nodiscard]] inline layer_cost layer_forward(const model_spec& m, double b, int t, bool sp,
                                              const gpu& g, const calibration& cal) {
  const double T = b * m.seq, h = m.h(), f = m.f(), tt = t;
  layer_cost c;
  c.qkv_gemm_s = detail::gemm_time(T, m.qkv_width() / tt, h, 1, g, cal);
  c.up_gemm_s = detail::gemm_time(T, f * (m.mlp_matrices() - 1) / tt, h, 1, g, cal);
  c.gemm_s = c.qkv_gemm_s + detail::gemm_time(T, h, h / tt, 1, g, cal) + c.up_gemm_s +
             detail::gemm_time(T, h, f / tt, 1, g, cal);
  const double heads = m.heads / tt * b;
  const double hd = h / m.heads;
  c.attention_s = 2.0 * detail::gemm_time(m.seq, m.seq, hd, heads, g, cal);
  const double hbm = g.hbm_bandwidth * cal.hbm_fraction;
  double bytes = 15.0 * T * h / (sp ? tt : 1.0) + (m.gated ? 6.0 : 4.0) * T * f / tt;
  if (!m.flash_attention) c.core_elementwise_s = 9.0 * heads * m.seq * static_cast<double>(m.seq) / hbm;
  c.elementwise_s = bytes / hbm + c.core_elementwise_s + cal.layer_overhead_s;
  return c;
}

namespace detail {

inline void check_layout(const model_spec& m, const machine& mc, const layout& l) {
  const auto fail = [&](const std::string& what) { throw error("weft: sim: layout: " + what); };
  for (auto [name, v] : {std::pair{"tp", l.tp}, {"pp", l.pp}, {"dp", l.dp}, {"chunks", l.chunks},
                         {"micro_batch", l.micro_batch}}) {
    if (v < 1) fail(std::string(name) + " must be at least 1, not " + std::to_string(v));
  }
  // Products in 64 bits: flags near INT_MAX must not wrap into a small or zero divisor.
  const std::int64_t gpus = std::int64_t{l.tp} * l.pp * l.dp;
  if (gpus > mc.cluster.size())
    fail("tp * pp * dp = " + std::to_string(gpus) + " GPUs, more than the cluster's " +
         std::to_string(mc.cluster.size()));
  const std::int64_t per_microbatch = std::int64_t{l.dp} * l.micro_batch;
  if (l.global_batch < 0 || (l.global_batch > 0 && l.global_batch % per_microbatch != 0))
    fail("global batch " + std::to_string(l.global_batch) + " is not a multiple of dp * micro_batch = " +
         std::to_string(per_microbatch));
  if (m.heads % l.tp != 0)
    fail("tp " + std::to_string(l.tp) + " does not divide the " + std::to_string(m.heads) + " heads");
  if (m.kv_heads > 0 && m.kv_heads % l.tp != 0) // Megatron-core splits the key-value groups over TP
    fail("tp " + std::to_string(l.tp) + " does not divide the " + std::to_string(m.kv_heads) +
         " key-value heads (grouped-query attention)");
  const std::int64_t model_chunks = std::int64_t{l.pp} * l.chunks;
  if (m.layers < model_chunks)
    fail(std::to_string(m.layers) + " layers cannot fill pp * chunks = " + std::to_string(model_chunks) +
         " model chunks");
  if (l.zero < 0 || l.zero > 3) fail("zero must be 0..3, not " + std::to_string(l.zero));
  if (l.dp_buckets < 1) fail("dp_buckets must be at least 1");
  if (l.chunks > 1 && l.schedule != pipeline::schedule_kind::interleaved)
    fail("chunks > 1 needs the interleaved schedule");
}

} // namespace detail

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
inline std::vector<double> weights_per_rank(const model_spec& m, const layout& l, const std::vector<int>& layers_of) {
  const double input = static_cast<double>(m.vocab) * m.h() + (m.learned_positions ? m.seq * m.h() : 0.0);
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
inline double rank_parameters(const model_spec& m, const layout& l, const std::vector<int>& layers_of) {
  const std::vector<double> w = weights_per_rank(m, l, layers_of);
  return *std::max_element(w.begin(), w.end());
}

/// Model states and activations of the fullest rank (the most of both together), given how
/// many (micro-batch, chunk) pairs each pipeline rank holds at its peak (a chunk's pair holds
/// 1/V of the rank's layers).
inline std::pair<state_memory, double> memory_of(const model_spec& m, const layout& l,
                                                 const std::vector<int>& layers_of,
                                                 const std::vector<int>& peak) {
  const int t = l.tp, p = l.pp;
  const double b = l.micro_batch, T = b * m.seq, h = m.h(), v = l.chunks;
  const std::vector<double> weights = weights_per_rank(m, l, layers_of);
  const double per_layer = activation_bytes_per_layer(m, b, t, l.sequence_parallel, l.recomputation);
  std::pair<state_memory, double> worst{};
  for (int r = 0; r < p; ++r) {
    const double held = peak[static_cast<std::size_t>(r)];
    double a = per_layer * layers_of[static_cast<std::size_t>(r)] * held / v;
    if (l.recomputation == recompute::full) // one layer's activations live while recomputed
      a += activation_bytes_per_layer(m, b, t, l.sequence_parallel, recompute::none);
    if (r == 0) a += 2.0 * T * h / (l.sequence_parallel ? t : 1) * held / v; // embedding output
    if (r == p - 1) a += 4.0 * T * m.vocab / t;                                  // fp32 logits
    if (l.zero >= 3) a += 2.0 * 2.0 * m.layer_parameters() / t; // ZeRO-3: a layer gathered, the next prefetched
    const state_memory states = zero_memory(weights[static_cast<std::size_t>(r)], l.dp, l.zero, l.grad_bytes);
    if (r == 0 || states.total() + a > worst.first.total() + worst.second) worst = {states, a};
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
      else if (a.kind == (s.split_backward ? pipeline::action_kind::weight : pipeline::action_kind::backward))
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
[[nodiscard]] inline double estimate_memory(const model_spec& m, const layout& l, const std::vector<int>& peak) {
  const auto mem = detail::memory_of(m, l, detail::layers_per_rank(m, l.pp), peak);
  return mem.first.total() + mem.second;
}

[[nodiscard]] inline double estimate_memory(const model_spec& m, const layout& l) {
  return estimate_memory(
      m, l, detail::peak_in_flight(pipeline::generate(l.schedule, l.pp, l.microbatches(), l.chunks)));
}

/// Simulates one step of `m` on `mc` laid out as `l`, with the constants `cal`. Throws
/// weft::error naming what is wrong with the layout or schedule.
[[nodiscard]] inline step_result simulate_step(const model_spec& m, const machine& mc,
                                               const layout& l, const calibration& cal) {
  m.check();
  detail::check_layout(m, mc, l);
  const gpu& g = mc.device;
  const topology::cluster net = detail::achieved(mc.cluster, cal);
  const int t = l.tp, p = l.pp;
  const double b = l.micro_batch;
  const double T = b * m.seq, h = m.h();
  step_result out;
  out.microbatches = l.microbatches();

  // --- communication prices --------------------------------------------------------------
  // Every TP group (one per pipeline rank and replica), pipeline hop and DP group is priced
  // where it lies, and each stage takes its slowest: where tp does not divide a node's GPUs
  // some TP groups straddle two nodes, and where tp * dp does not fill a node some hops stay
  // inside one. Groups whose members share nodes in the same pattern are priced once.
  const auto group = [&](int n, auto&& device_of) {
    std::vector<int> g(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      g[static_cast<std::size_t>(i)] = device_of(i);
    return g;
  };
  // How many TP and DP groups have members on one node (the first) and others elsewhere: they
  // run their collectives at once and share its NICs (a group inside the node uses none).
  int tp_sharing = 0, dp_sharing = 0;
  {
    std::vector<std::pair<int, int>> tp_keys, dp_keys;
    const int first_node = std::min(mc.cluster.devices_on(0), l.gpus());
    for (int dev = 0; dev < first_node; ++dev) {
      int ti = 0, pi = 0, di = 0;
      if (l.tp_across_nodes) {
        di = dev % l.dp;
        pi = dev / l.dp % l.pp;
        ti = dev / (l.dp * l.pp);
      } else {
        ti = dev % l.tp;
        di = dev / l.tp % l.dp;
        pi = dev / (l.tp * l.dp);
      }
      tp_keys.emplace_back(pi, di);
      dp_keys.emplace_back(ti, pi);
    }
    const auto leaves = [&](int n, auto&& device_of) {
      for (int i = 0; i < n; ++i)
        if (mc.cluster.node_of(device_of(i)) != 0) return true;
      return false;
    };
    for (auto* keys : {&tp_keys, &dp_keys}) {
      std::sort(keys->begin(), keys->end());
      keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
    }
    // Keys as pairs, not structured bindings: clang before 16 cannot capture those in a lambda.
    for (const std::pair<int, int>& key : tp_keys) // (pi, di)
      tp_sharing += leaves(t, [&](int i) { return l.device(i, key.first, key.second); }) ? 1 : 0;
    for (const std::pair<int, int>& key : dp_keys) // (ti, pi)
      dp_sharing += leaves(l.dp, [&](int d) { return l.device(key.first, key.second, d); }) ? 1 : 0;
  }
  const topology::cluster tp_net = detail::nic_share(net, tp_sharing);
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
      for (int d = 0; d < l.dp; ++d) {
        const std::vector<int> members = group(t, [&](int i) { return l.device(i, r, d); });
        auto [it, fresh] = priced.try_emplace(detail::node_pattern(members, mc.cluster));
        tp_price& q = it->second;
        if (fresh) {
          if (l.sequence_parallel) {
            q.gather = detail::price_group(collective::all_gather, members, act / static_cast<std::size_t>(t), 2, tp_net);
            q.scatter = detail::price_group(collective::reduce_scatter, members, act / static_cast<std::size_t>(t), 2, tp_net);
            q.call = q.gather + q.scatter;
          } else {
            q.call = detail::price_group(collective::all_reduce, members, act, 2, tp_net);
          }
          q.link = detail::link_name(members, mc.cluster);
        }
        if (q.call > tp_of[static_cast<std::size_t>(r)].call) tp_of[static_cast<std::size_t>(r)] = q;
      }
    }
  }
  const tp_price tp_worst = *std::max_element(
      tp_of.begin(), tp_of.end(), [](const tp_price& a, const tp_price& x) { return a.call < x.call; });
  out.tp = {0, tp_worst.call, tp_worst.link};

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
    for (int d = 0; d < l.dp; ++d) {
      for (int i = 0; i < t; ++i) {
        const topology::link& lk = net.link_between(l.device(i, r, d), l.device(i, (r + 1) % p, d));
        if (slowest == nullptr || lk.bandwidth < slowest->bandwidth ||
            (lk.bandwidth == slowest->bandwidth && lk.latency > slowest->latency))
          slowest = &lk;
      }
    }
    hop[static_cast<std::size_t>(r)] = slowest;
    hop_s[static_cast<std::size_t>(r)] = slowest->latency + static_cast<double>(msg_bytes) / slowest->bandwidth;
    if (hop_s[static_cast<std::size_t>(r)] > p2p_call) {
      p2p_call = hop_s[static_cast<std::size_t>(r)];
      p2p_link = topology::name_of(slowest->kind);
    }
  }
  out.pp = {0, p2p_call, p2p_link};

  // --- compute per micro-batch per rank ----------------------------------------------------
  const bool split = l.schedule == pipeline::schedule_kind::zero_bubble_h1;
  const layer_cost fwd = layer_forward(m, b, t, l.sequence_parallel, g, cal);
  // One layer's forward and backward with a pipeline rank's TP prices. The backward's TP
  // collectives: two, like the forward's, on the critical path; with tp_overlap the two
  // column-parallel linears' collectives run during their GEMMs (only what outlasts a GEMM
  // shows), and with SP the gathers of the gradient before the two row-parallel linears
  // remain. A split schedule runs the weight-gradient GEMMs apart.
  // The backward: input-gradient GEMMs (as many FLOPs as the forward's), the attention core and
  // the elementwise kernels twice over, the TP collectives, and what is recomputed (full: the
  // whole forward; selective: the attention core, its QK^T and AV GEMMs and its softmax and
  // dropout); the weight-gradient GEMMs (W) as many FLOPs as the forward's again.
  struct layer_times {
    double f, b_input, tp_backward;
  };
  const auto layer_with = [&](const tp_price& q) {
    layer_times lt{};
    lt.f = fwd.total() + 2.0 * q.call;
    lt.tp_backward = 2.0 * q.call;
    if (l.tp_overlap && !split && t > 1) {
      const auto shows = [](double comm, double gemm) { return std::max(0.0, comm - gemm); };
      lt.tp_backward = l.sequence_parallel
                           ? 2.0 * q.gather + shows(q.gather, fwd.qkv_gemm_s) + shows(q.scatter, fwd.qkv_gemm_s) +
                                 shows(q.gather, fwd.up_gemm_s) + shows(q.scatter, fwd.up_gemm_s)
                           : shows(q.call, fwd.qkv_gemm_s) + shows(q.call, fwd.up_gemm_s);
    }
    lt.b_input = fwd.gemm_s + 2.0 * (fwd.attention_s + fwd.elementwise_s) + lt.tp_backward;
    if (l.recomputation == recompute::full) lt.b_input += lt.f;
    if (l.recomputation == recompute::selective) lt.b_input += fwd.attention_s + fwd.core_elementwise_s;
    return lt;
  };
  const double layer_b_weight = fwd.gemm_s;

  // The logits and the cross-entropy (fp32, read and written three times) on the last rank.
  const double logit_gemm = detail::gemm_time(T, m.vocab / static_cast<double>(t), h, 1, g, cal);
  const double logit_f = logit_gemm + 3.0 * 4.0 * T * m.vocab / t / (g.hbm_bandwidth * cal.hbm_fraction);
  const double logit_w = logit_gemm;

  const std::vector<int> layers_of = detail::layers_per_rank(m, p);
  const std::vector<double> rank_weights = detail::weights_per_rank(m, l, layers_of);

  struct rank_cost {
    double f, b, w;
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
      c.f += logit_f;
      c.b += logit_w + 2.0 * (logit_f - logit_w);
      c.w += logit_w;
    }
    // Adding this micro-batch's weight gradients to the step's, unless the GEMMs do it.
    c.w += rank_weights[static_cast<std::size_t>(r)] * l.grad_accumulation_bytes / (g.hbm_bandwidth * cal.hbm_fraction);
    if (!split) {
      c.b += c.w;
      c.w = 0;
    }
  }
  const auto busiest = std::max_element(cost.begin(), cost.end(), [](const rank_cost& a, const rank_cost& x) {
    return a.f + a.b + a.w < x.f + x.b + x.w;
  });
  out.forward_s = busiest->f;
  out.backward_s = busiest->b;
  out.weight_s = busiest->w;

  // --- the pipeline ------------------------------------------------------------------------
  pipeline::options po;
  po.activation_bytes = msg_bytes;
  po.gradient_bytes = msg_bytes;
  out.schedule = pipeline::generate(l.schedule, p, out.microbatches, l.chunks, po);
  pipeline::validate(out.schedule);
  const pipeline::schedule& s = out.schedule;
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
        const int from = a.kind == pipeline::action_kind::send_activation ? (a.peer - 1 + p) % p : (a.peer + 1) % p;
        const topology::link* lk = hop[static_cast<std::size_t>(a.kind == pipeline::action_kind::send_activation ? from : a.peer)];
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
  out.bubble = busiest_busy > 0 ? std::max(0.0, (out.pipeline_s - busiest_busy) / busiest_busy) : 0.0;
  out.idle_fraction = out.pipeline_s > 0 ? idle / (p * out.pipeline_s) : 0.0;
  const auto busiest_rank = static_cast<std::size_t>(busiest - cost.begin());
  out.tp.seconds = t > 1 ? out.microbatches * layers_of[busiest_rank] *
                               (tp_of[busiest_rank].call * (l.recomputation == recompute::full ? 4.0 : 2.0) +
                                layer_with(tp_of[busiest_rank]).tp_backward)
                         : 0.0;
  out.pp.seconds = p > 1 ? 2.0 * out.microbatches * s.chunks * p2p_call : 0.0;

  // --- data parallelism and the optimizer ---------------------------------------------------
  const double rank_params = detail::rank_parameters(m, l, layers_of);
  const auto grad_elems = static_cast<std::size_t>(rank_params);
  const auto grad_size = static_cast<std::size_t>(l.grad_bytes);
  double dp_time = 0;
  std::string_view dp_link = "none";
  if (l.dp > 1) {
    // ZeRO-1 reduce-scatters the gradients and all-gathers the updated weights once a step:
    // the two halves of a ring all-reduce, priced as one. ZeRO-2 keeps 1/dp of the gradients,
    // so each micro-batch's are reduce-scattered as its backward makes them (m reduce-scatters,
    // then the all-gather). ZeRO-3 keeps 1/dp of the weights too and gathers them for every
    // micro-batch's forward and backward: 2m all-gathers and m reduce-scatters (DeepSpeed's
    // stages 2 and 3 under gradient accumulation). The slowest group's.
    const double micro = out.microbatches;
    const auto shard = grad_elems / static_cast<std::size_t>(l.dp);
    std::map<std::vector<int>, double> priced;
    for (int r = 0; r < p; ++r) {
      for (int i = 0; i < t; ++i) {
        const std::vector<int> members = group(l.dp, [&](int d) { return l.device(i, r, d); });
        auto [it, fresh] = priced.try_emplace(detail::node_pattern(members, mc.cluster), 0.0);
        if (fresh) {
          const auto price = [&](collective c, std::size_t n, std::size_t bytes) {
            return detail::price_group(c, members, n, bytes, dp_net);
          };
          if (l.zero <= 1) {
            it->second = price(collective::all_reduce, grad_elems, grad_size);
          } else if (l.zero == 2) {
            it->second = price(collective::all_reduce, grad_elems, grad_size) +
                         (micro - 1) * price(collective::reduce_scatter, shard, grad_size);
          } else {
            it->second = micro * (2 * price(collective::all_gather, shard, 2) +
                              price(collective::reduce_scatter, shard, grad_size));
          }
        }
        if (it->second > dp_time || dp_link == "none") {
          dp_time = it->second;
          dp_link = detail::link_name(members, mc.cluster);
        }
      }
    }
  }
  out.dp = {dp_time, dp_time, dp_link};
  if (l.overlap_dp) {
    // The last micro-batch's backward; ZeRO-2 and 3 communicate under every micro-batch's
    // backward (ZeRO-3: and forward).
    const double backward = out.backward_s + out.weight_s;
    const double micro = out.microbatches;
    const double window = l.zero <= 1   ? backward
                          : l.zero == 2 ? micro * backward
                                        : micro * (backward + out.forward_s);
    out.dp_exposed_s = std::max(dp_time / l.dp_buckets, dp_time - window);
  } else {
    out.dp_exposed_s = dp_time;
  }
  const double shard = l.zero >= 1 ? l.dp : 1;
  out.optimizer_s = rank_params / shard * 32.0 / (g.hbm_bandwidth * cal.hbm_fraction);
  out.step_time_s = out.pipeline_s + out.dp_exposed_s + out.optimizer_s;

  // --- throughput ----------------------------------------------------------------------------
  const double gpus = l.gpus();
  const double batch = l.batch();
  out.tflops_per_gpu = m.hardware_flops(batch, recompute::full) / (out.step_time_s * gpus) / 1e12;
  out.model_tflops_per_gpu = m.model_flops(batch) / (out.step_time_s * gpus) / 1e12;
  out.mfu = out.model_tflops_per_gpu * 1e12 / g.peak_flops;

  // --- memory ----------------------------------------------------------------------------
  const std::vector<int> peak = detail::peak_in_flight(s);
  const auto mem = detail::memory_of(m, l, layers_of, peak);
  out.states = mem.first;
  out.activation_bytes = mem.second;
  return out;
}

[[nodiscard]] inline step_result simulate_step(const model_spec& m, const machine& mc, const layout& l) {
  return simulate_step(m, mc, l, calibration_of(mc.device));
}

} // namespace weft::sim
