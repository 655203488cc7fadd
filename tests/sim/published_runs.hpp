#pragma once
// Reads data/published_runs.csv (the repository's calibration data) into models and layouts.
#include <weft/core/error.hpp>
#include <weft/sim/hardware.hpp>
#include <weft/sim/model.hpp>
#include <weft/sim/step.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

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

/// The repository's data folder, found from this file's path (CMake compiles by absolute path).
inline std::string data_dir() {
  std::string here = __FILE__;
  return here.substr(0, here.rfind("/tests/sim/")) + "/data";
}

inline std::vector<published_run> read_published_runs(
    const std::string& path = data_dir() + "/published_runs.csv") {
  std::ifstream in(path);
  if (!in) throw weft::error("cannot open " + path);
  std::vector<std::string> header;
  std::vector<published_run> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ','))
      cells.push_back(cell);
    if (line.back() == ',') cells.emplace_back();
    if (header.empty()) {
      header = cells;
      continue;
    }
    if (cells.size() != header.size())
      throw weft::error(path + ": a row of " + std::to_string(cells.size()) +
                        " cells under a header of " + std::to_string(header.size()) + ": " + line);
    std::map<std::string, std::string> row;
    for (std::size_t i = 0; i < cells.size(); ++i)
      row[header[i]] = cells[i];
    const auto num = [&](const char* k) { return std::stod(row.at(k)); };
    const auto integer = [&](const char* k) { return std::stoi(row.at(k)); };
    published_run r;
    r.source = row.at("source");
    r.id = row.at("id");
    r.set = row.at("set");
    r.flops = row.at("flops");
    r.assumed = row.at("assumed");
    r.device = weft::sim::gpu_named(row.at("gpu"));
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
    const std::string positions = row.at("positions");
    if (positions != "learned" && positions != "rotary" && positions != "alibi")
      throw weft::error(path + ": unknown positions '" + positions + "'");
    r.model.learned_positions = positions == "learned";
    r.model.tied_embeddings = integer("tied") != 0;
    r.published_params = num("params_b") * 1e9;
    r.layout.tp = integer("tp");
    r.layout.pp = integer("pp");
    r.layout.dp = integer("dp");
    r.layout.chunks = integer("chunks");
    r.layout.micro_batch = integer("micro_batch");
    r.layout.global_batch = integer("global_batch");
    r.layout.schedule = row.at("schedule") == "interleaved"
                            ? weft::pipeline::schedule_kind::interleaved
                            : weft::pipeline::schedule_kind::one_f_one_b;
    r.layout.recomputation = weft::sim::recompute_named(row.at("recompute"));
    r.layout.sequence_parallel = integer("sp") != 0;
    try {
      weft::sim::use_engine(r.layout, weft::sim::pipeline_engine_named(row.at("stack")));
    } catch (const weft::error& e) {
      throw weft::error(path + ": row " + r.id + ": " + e.what());
    }
    r.layout.tp_overlap = integer("tp_overlap") != 0;
    r.layout.overlap_dp =
        integer("dp_overlap") != 0; // the source's word, over the engine's default
    r.layout.grad_accumulation_bytes = weft::sim::grad_accumulation_named(row.at("grad_accum"));
    r.gpus = integer("gpus");
    r.measured_tflops = num("tflops_per_gpu");
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
