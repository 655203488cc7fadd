#pragma once
// Reads data/published_runs.csv (the repository's calibration data) into models and layouts.
#include <weft/core/error.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/model.hpp>
#include <weft/sim/step.hpp>

#include <string>
#include <vector>

#include "csv_rows.hpp"

namespace weft_test {

struct published_run {
  std::string source, id, set, flops, assumed;
  weft::sim::gpu device;
  weft::sim::model_spec model;
  weft::sim::layout layout;
  int gpus = 0;
  double published_params = 0; // as the source rounds it
  double measured_tflops = 0;
};

inline std::vector<published_run> read_published_runs(
    const std::string& path = data_dir() + "/published_runs.csv") {
  std::vector<published_run> out;
  for (const csv_row& row : read_csv_rows(path)) {
    published_run r;
    r.source = row.at("source");
    r.id = row.at("id");
    r.set = row.at("set");
    r.flops = row.at("flops");
    r.assumed = row.at("assumed");
    r.device = weft::sim::gpu_named(row.at("gpu"));
    r.model.name = r.id;
    r.model.layers = row.integer("layers");
    r.model.hidden = row.integer("hidden");
    r.model.heads = row.integer("heads");
    r.model.kv_heads = row.integer("kv_heads");
    r.model.ffn = row.integer("ffn");
    r.model.gated = row.integer("gated") != 0;
    r.model.seq = row.integer("seq");
    r.model.vocab = row.integer("vocab");
    r.model.flash_attention = row.integer("flash") != 0;
    const std::string positions = row.at("positions");
    if (positions != "learned" && positions != "rotary" && positions != "alibi")
      throw weft::error(row.where() + ": unknown positions '" + positions + "'");
    r.model.learned_positions = positions == "learned";
    r.model.tied_embeddings = row.integer("tied") != 0;
    r.published_params = row.number("params_b") * 1e9;
    r.layout.tp = row.integer("tp");
    r.layout.pp = row.integer("pp");
    r.layout.dp = row.integer("dp");
    r.layout.chunks = row.integer("chunks");
    r.layout.micro_batch = row.integer("micro_batch");
    r.layout.global_batch = row.integer("global_batch");
    r.layout.schedule = row.at("schedule") == "interleaved"
                            ? weft::pipeline::schedule_kind::interleaved
                            : weft::pipeline::schedule_kind::one_f_one_b;
    r.layout.recomputation = weft::sim::recompute_named(row.at("recompute"));
    r.layout.sequence_parallel = row.integer("sp") != 0;
    try {
      weft::sim::use_engine(r.layout, weft::sim::pipeline_engine_named(row.at("stack")));
    } catch (const weft::error& e) {
      throw weft::error(row.where() + ": row " + r.id + ": " + e.what());
    }
    r.layout.tp_overlap = row.integer("tp_overlap") != 0;
    r.layout.overlap_dp =
        row.integer("dp_overlap") != 0; // the source's word, over the engine's default
    r.layout.grad_accumulation_bytes = weft::sim::grad_accumulation_named(row.at("grad_accum"));
    r.gpus = row.integer("gpus");
    r.measured_tflops = row.number("tflops_per_gpu");
    out.push_back(std::move(r));
  }
  return out;
}

/// The predicted TFLOP/s per GPU of a run, in the convention its source reports.
inline double predicted_tflops(const published_run& r, const weft::sim::calibration& cal) {
  const auto mc = weft::sim::dgx(r.device, (r.gpus + 7) / 8);
  const auto res = weft::sim::simulate_step(r.model, mc, r.layout, cal);
  return r.flops == "model" ? res.model_tflops_per_gpu : res.tflops_per_gpu;
}

} // namespace weft_test
