#pragma once
// The 3D planner: every TP x PP x DP mesh of a cluster that fits in memory, ranked by the
// simulated step, with the reasons for the top ones.
//
//   for each mesh tp * pp * dp = GPUs   (tp a power of two dividing the heads, up to twice a
//                                        node, so that TP across nodes is seen and explained;
//                                        pp dividing the layers; dp dividing the batch)
//     for each micro-batch and schedule (1F1B, interleaved with 2 chunks, ZB-H1)
//       every recomputation with every ZeRO stage that fits: neither dominates (less
//       recomputation may fit only under ZeRO-2 or 3, whose collectives every micro-batch cost
//       more than the recomputation saves; ZeRO adds communication but shards the optimizer
//       step); memory is checked (estimate_memory) before anything is simulated
//       simulate the step (step.hpp)
//     keep the mesh's fastest variant
//   rank the meshes by step time
#include <weft/core/error.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/sim/calibration.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/model.hpp>
#include <weft/sim/step.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace weft::sim {

struct search_options {
  int global_batch = 0;    // sequences per step (required)
  double memory_limit = 0; // bytes per GPU; 0: the GPU's HBM
  std::vector<int> micro_batches = {1, 2, 4};
  std::vector<pipeline::schedule_kind> schedules = {pipeline::schedule_kind::one_f_one_b,
                                                    pipeline::schedule_kind::interleaved,
                                                    pipeline::schedule_kind::zero_bubble_h1};
  int max_tp = 0;                     // 0: twice the devices of a node
  bool sequence_parallel = true;      // with TP > 1
  bool tp_overlap = false;            // layout::tp_overlap of every variant
  double grad_accumulation_bytes = 0; // layout::grad_accumulation_bytes of every variant
  pipeline_engine engine = pipeline_engine::megatron; // of every variant with PP > 1 (DeepSpeed's
      // runs only 1F1B under ZeRO 0 or 1; PP 1 runs no pipeline engine)
};

/// One mesh's fastest variant.
struct ranked_layout {
  layout l;
  step_result r;
};

struct search_result {
  std::vector<ranked_layout> ranked; // fastest first, one per (tp, pp, dp)
  int simulated = 0;                 // step simulations run
  int meshes = 0;                    // meshes that divide the cluster, the layers and the batch
  int out_of_memory = 0;             // meshes with no variant that fits in memory
  int unschedulable = 0;             // meshes no schedule runs with this batch (micro-batches)
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
  for (int tp = 1; tp <= max_tp && tp <= gpus; tp *= 2) {
    if (m.heads % tp != 0 || (m.kv_heads > 0 && m.kv_heads % tp != 0)) continue;
    for (int pp = 1; pp <= m.layers && tp * pp <= gpus; ++pp) {
      if (m.layers % pp != 0 || gpus % (tp * pp) != 0) continue;
      const int dp = gpus / (tp * pp);
      if (o.global_batch % dp != 0) continue;
      ++out.meshes;
      std::vector<ranked_layout> variants;
      bool schedulable = false;
      for (int mb : o.micro_batches) {
        if (o.global_batch % (dp * mb) != 0) continue;
        const int micro = o.global_batch / (dp * mb);
        for (pipeline::schedule_kind kind : o.schedules) {
          layout l;
          l.tp = tp;
          l.pp = pp;
          l.dp = dp;
          l.micro_batch = mb;
          l.global_batch = o.global_batch;
          l.schedule = kind;
          l.sequence_parallel = o.sequence_parallel && tp > 1;
          l.tp_overlap = o.tp_overlap;
          l.grad_accumulation_bytes = o.grad_accumulation_bytes;
          if (kind == pipeline::schedule_kind::interleaved) {
            l.chunks = 2;
            if (pp < 2 || m.layers % (2 * pp) != 0 || micro % pp != 0) continue;
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
          for (recompute rc : {recompute::none, recompute::selective, recompute::full}) {
            for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero) {
              l.recomputation = rc;
              l.zero = zero;
              if (pp > 1) {
                if (!engine_refusal(l, o.engine).empty()) continue;
                use_engine(l, o.engine);
              }
              if (estimate_memory(m, l, peak) > limit) continue;
              ++out.simulated;
              step_result r = simulate_step(m, mc, l, cal);
              r.schedule = {}; // the ranking keeps figures, not timelines
              r.timeline = {};
              variants.push_back({l, std::move(r)});
            }
          }
        }
      }
      if (variants.empty()) {
        ++(schedulable ? out.out_of_memory : out.unschedulable);
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
                " fit no variant in " + gib + " GiB per GPU and " +
                std::to_string(out.unschedulable) + " have no schedule for the batch");
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
/// last where it runs)
[[nodiscard]] inline std::string describe(const layout& l) {
  std::string s = "tp " + std::to_string(l.tp) + " pp " + std::to_string(l.pp) + " dp " +
                  std::to_string(l.dp) + ", micro-batch " + std::to_string(l.micro_batch) + ", " +
                  std::string(pipeline::name_of(l.schedule));
  if (l.chunks > 1) s += "<" + std::to_string(l.chunks) + ">";
  s += ", recompute " + std::string(name_of(l.recomputation));
  if (l.zero > 0) s += ", ZeRO-" + std::to_string(l.zero);
  if (l.sequence_parallel) s += ", sequence parallel";
  if (l.tp_across_nodes) s += ", TP across nodes";
  if (engine_of(l) == pipeline_engine::deepspeed) s += ", DeepSpeed's pipeline engine";
  return s;
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
    const auto& [l, r] = s.ranked[i];
    out += "#" + std::to_string(i + 1) + "  " + describe(l) + "\n";
    out += detail::format(
        "    %.1f TFLOP/s per GPU (SC21), %.1f model TFLOP/s (MFU %.0f%%), step %.2f s\n",
        r.tflops_per_gpu, r.model_tflops_per_gpu, 100 * r.mfu, r.step_time_s);
    out += detail::format("    memory %.1f GiB per GPU (states %.1f, activations %.1f)\n",
                          r.memory_bytes() / gib, r.states.total() / gib, r.activation_bytes / gib);
    if (l.tp > 1)
      out += detail::format("    TP %.0f on ", l.tp) + std::string(r.tp.link) +
             detail::format(": %.2f s per step (%.0f%% of it)\n", r.tp.seconds,
                            100 * r.tp.seconds / r.step_time_s);
    if (l.pp > 1)
      out += detail::format(
          "    PP %.0f stages, %.0f micro-batches: bubble %.1f%% of ideal compute (1F1B's (p-1)/m "
          "= %.1f%%)\n",
          l.pp, r.microbatches, 100 * r.bubble, 100.0 * (l.pp - 1) / r.microbatches);
    if (l.dp > 1)
      out += detail::format("    DP %.0f on ", l.dp) + std::string(r.dp.link) +
             detail::format(": %.2f s of reduction, %.2f s not hidden behind the backward\n",
                            r.dp.seconds, r.dp_exposed_s);
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
         "), simulated " + std::to_string(s.simulated) + " layouts.\n";
  return out;
}

} // namespace weft::sim
