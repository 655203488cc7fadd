#pragma once
// Reads data/sharded_runs.csv (published ZeRO-3 / FSDP / HSDP runs and Megatron-core runs with
// the distributed optimizer, in bf16 or FP8) into models, layouts and machines, and says of each
// row the simulator cannot express why.
#include <weft/core/error.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/model.hpp>
#include <weft/sim/sharded.hpp>
#include <weft/sim/step.hpp>

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <string>
#include <vector>

#include "csv_rows.hpp"

namespace weft_test {

struct sharded_run {
  std::string source, id, engine, series, batch_rule, set;
  std::string why_not; // "" when the simulator can express the row
  weft::sim::gpu device;
  weft::sim::model_spec model;
  weft::sim::layout layout;
  int gpus = 0;
  int gpus_per_node = 8;       // from the row's interconnect ("<N>_GPUs_per_node"); the DGX's
  double nic_gbps = 0;         // per NIC, from the row's interconnect; 0: the DGX preset's
  double published_tokens = 0; // tokens/s per GPU, as the source states it
};

/// The machine a row ran on: nodes of the row's GPUs per node with its GPU's DGX links and one
/// NIC per GPU (as every DGX preset has), at the NICs' bandwidth the source states.
inline weft::sim::machine machine_of(const sharded_run& r) {
  weft::sim::machine mc = weft::sim::dgx(r.device, 1);
  const weft::topology::cluster& c = mc.cluster;
  weft::topology::link inter = c.inter();
  if (r.nic_gbps > 0) inter.bandwidth = r.nic_gbps * 1e9 / 8;
  const int n = r.gpus_per_node;
  mc.cluster =
      weft::topology::cluster(std::vector<int>(static_cast<std::size_t>((r.gpus + n - 1) / n), n),
                              c.intra(), inter, n, c.reduce_bandwidth());
  return mc;
}

/// Predicted tokens/s per GPU of a row under the constants `cal`.
inline double predicted_tokens(const sharded_run& r, const weft::sim::calibration& cal) {
  const auto res = weft::sim::simulate_step(r.model, machine_of(r), r.layout, cal);
  return r.layout.batch() * static_cast<double>(r.model.seq) / (res.step_time_s * r.gpus);
}

/// Predicted tokens/s per GPU of a row under calibration.hpp's constants.
inline double predicted_tokens(const sharded_run& r) {
  return predicted_tokens(r, weft::sim::calibration_of(r.device));
}

inline std::vector<sharded_run> read_sharded_runs(const std::string& path = data_dir() +
                                                                            "/sharded_runs.csv") {
  std::vector<sharded_run> out;
  for (const csv_row& row : read_csv_rows(path)) {
    const auto integer = [&](const char* k) { return row.at(k) == "-" ? 0 : row.integer(k); };
    sharded_run r;
    r.source = row.at("source");
    r.id = row.at("id");
    r.engine = row.at("engine");
    r.series = row.at("series");
    r.batch_rule = row.at("batch_rule");
    r.set = row.at("set");
    r.gpus = integer("gpus");
    r.published_tokens = row.at("tokens_per_gpu_s") == "-" ? 0 : row.number("tokens_per_gpu_s");
    const std::string precision = row.at("precision");
    const auto refuse = [&](const std::string& why) {
      if (r.why_not.empty()) r.why_not = why;
    };
    if (r.engine != "fsdp" && r.engine != "fsdp2" && r.engine != "hsdp" &&
        r.engine != "megatron-distopt")
      refuse("engine " + r.engine + ": its layout or precision is not stated or not modelled");
    const bool fp8 = precision == "fp8" || precision == "fp8_cs" || precision == "fp8_linear";
    if (precision != "bf16" && precision != "amp_bf16" && precision != "bf16_pure" && !fp8)
      refuse(precision == "-" ? std::string("precision not stated")
                              : "precision " + precision + ": not modelled");
    if (row.at("recompute") == "-") refuse("recompute not stated");
    if (row.at("offload") != "none") refuse("offload " + row.at("offload") + ": not modelled");
    if (row.at("recompute") == "blocks_unstated")
      refuse("recompute of whole blocks on a fraction of them the source does not state");
    try {
      r.device = weft::sim::gpu_named(row.at("gpu"));
    } catch (const weft::error&) {
      refuse("gpu " + row.at("gpu") + ": no datasheet preset");
    }
    for (const char* k : {"tp", "pp", "dp", "micro_batch", "accum_steps", "heads", "layers"})
      if (integer(k) == 0) refuse(std::string(k) + " not stated");
    if (r.published_tokens == 0) refuse("no tokens/s figure");
    // The gathering each engine's row records, checked against the engine: FSDP1's
    // BACKWARD_POST (with limit_all_gathers), FSDP2's one module ahead, Megatron's distributed
    // optimizer overlapping its weights' gather with the next forward, '-' the engine's default.
    const std::string prefetch = row.at("prefetch");
    const auto prefetch_needs = [&](std::initializer_list<const char*> engines) {
      for (const char* e : engines)
        if (r.engine == e) return;
      throw weft::error("sharded_runs.csv: " + r.id + ": prefetch '" + prefetch +
                        "' is not engine " + r.engine + "'s");
    };
    if (prefetch == "backward_post" || prefetch == "backward_post+limit_all_gathers")
      prefetch_needs({"fsdp", "hsdp"});
    else if (prefetch == "implicit_one_ahead")
      prefetch_needs({"fsdp2"});
    else if (prefetch == "overlap_param_gather")
      prefetch_needs({"megatron-distopt"});
    else if (prefetch != "-")
      throw weft::error("sharded_runs.csv: " + r.id + ": prefetch '" + prefetch +
                        "': expected backward_post, backward_post+limit_all_gathers, "
                        "implicit_one_ahead, overlap_param_gather or -");
    if (!r.why_not.empty()) {
      out.push_back(std::move(r));
      continue;
    }
    // The node: "<N>_GPUs_per_node" (N GPUs and N NICs), the DGX's 8 where not stated. The
    // NICs: "<N>Gbps" per node (one NIC per GPU sharing N) or "_per_GPU" (each NIC N); none
    // stated: the DGX preset's.
    const std::string net = row.at("interconnect");
    const auto number_before = [&](std::size_t at) {
      auto from = at;
      while (from > 0 && std::isdigit(static_cast<unsigned char>(net[from - 1])) != 0)
        --from;
      if (from == at) throw weft::error(r.id + ": no number before '" + net.substr(at) + "'");
      return std::stoi(net.substr(from, at - from));
    };
    if (const auto at = net.find("_GPUs_per_node"); at != std::string::npos) {
      r.gpus_per_node = number_before(at);
      if (r.gpus_per_node < 1)
        throw weft::error(r.id + ": " + std::to_string(r.gpus_per_node) + " GPUs per node");
    }
    if (const auto at = net.find("Gbps"); at != std::string::npos) {
      const double gbps = number_before(at);
      r.nic_gbps = net.find("per_GPU") != std::string::npos ? gbps : gbps / r.gpus_per_node;
    }
    r.model.name = r.id;
    r.model.layers = integer("layers");
    r.model.hidden = integer("hidden");
    r.model.heads = integer("heads");
    r.model.kv_heads = integer("kv_heads");
    r.model.ffn = integer("ffn");
    r.model.gated = integer("gated") != 0;
    r.model.seq = integer("seq");
    r.model.vocab = integer("vocab");
    r.model.flash_attention = integer("flash") != 0;
    r.model.learned_positions = row.at("positions") == "learned";
    r.model.tied_embeddings = integer("tied") != 0;
    weft::sim::layout& l = r.layout;
    l.tp = integer("tp");
    l.pp = integer("pp");
    l.dp = integer("dp");
    l.cp = std::max(1, integer("cp"));
    l.micro_batch = integer("micro_batch");
    l.global_batch = integer("global_batch");
    l.schedule = row.at("schedule") == "interleaved" ? weft::pipeline::schedule_kind::interleaved
                                                     : weft::pipeline::schedule_kind::one_f_one_b;
    l.chunks = std::max(1, integer("chunks"));
    l.recomputation = weft::sim::recompute_named(row.at("recompute"));
    l.gemm_precision = fp8 ? weft::sim::precision_named(precision) : weft::sim::precision::bf16;
    l.sequence_parallel = integer("sp") != 0;
    // The column is Megatron's --tp-comm-overlap for Megatron-core's rows (the TP collectives
    // pipelined with the GEMMs in both passes), the backward's overlap otherwise.
    bool& overlap = r.engine == "megatron-distopt" ? l.tp_comm_overlap : l.tp_overlap;
    overlap = integer("tp_overlap") != 0;
    // Gradients reduced in fp32 where the software's default says so: torchtitan's
    // mixed_precision_reduce and Composer's DEFAULT mixed precision (amp_bf16); in bf16 under
    // Composer's PURE and where the source says bf16 only.
    l.grad_bytes = r.engine == "fsdp2" || precision == "amp_bf16" ? 4 : 2;
    weft::sim::use_shard_engine(
        l, weft::sim::shard_engine_named(r.engine == "hsdp" ? "fsdp" : r.engine));
    if (r.engine == "hsdp") l.shard_group = integer("shard_group");
    l.overlap_param_gather = prefetch == "overlap_param_gather";
    // BACKWARD_POST issues the backward's next gather after the current unit's gradient
    // computation (layout::backward_prefetch 0), but llm-foundry's rows are priced at the
    // engine's default, 1: the constants fitted with them at 0 predict the held-out rows worse
    // (docs/sim.md, "Sharded data parallelism").
    // yes: every micro-batch gathers and reduce-scatters; no: once a step; gather: every
    // micro-batch gathers, the last one reduce-scatters (no_sync on the others); '-': one
    // micro-batch a step.
    const std::string sync = row.at("sync_per_micro");
    if (sync != "yes" && sync != "no" && sync != "gather" && sync != "-")
      throw weft::error("sharded_runs.csv: " + r.id + ": sync_per_micro '" + sync +
                        "': expected yes, no, gather or -");
    l.sync = sync == "no"       ? weft::sim::shard_sync::once
             : sync == "gather" ? weft::sim::shard_sync::last
                                : weft::sim::shard_sync::every;
    // The optimizer as each source's software runs it (data/README.md, "The software's own costs"):
    // Composer's DecoupledAdamW (llm-foundry) updates each fp32 weight in unfused steps, 88
    // bytes a weight; fms-fsdp's torch.optim.AdamW runs foreach (multi-tensor, unfused) steps,
    // 80 bytes, and clips the gradients' norm every step, 12 more. The others: a fused step.
    if (r.source.rfind("FOUNDRY", 0) == 0) l.optimizer_traffic_bytes = 88;
    if (r.source == "IBM-FSDP24" || r.source == "FMSFSDP-README") l.optimizer_traffic_bytes = 92;
    // KempnerForge's April code (KF-MFU) keeps its weights in bf16 (model.to(bf16)), so its fused
    // AdamW keeps bf16 moments and no fp32 master (the report's 80.7 GB for 7B on one GPU holds no
    // fp32 state).
    if (r.source == "KF-MFU") l.optimizer_bytes = weft::sim::optimizer_state_named("bf16");
    out.push_back(std::move(r));
  }
  return out;
}

} // namespace weft_test
