#pragma once
// What calibration.hpp's constants are fitted on, and over which grid (data/README.md, "The
// fit"): every row of data/published_runs.csv and data/sharded_runs.csv that the simulator can
// express, with its error under given constants, grouped by GPU type. tests/sim/fit_calibration.cpp
// searches the grid for each type's minimax (the bf16 rows' constants first, then
// fp8_gemm_peak_fraction on the FP8 rows at that point); tests/sim/sharded_runs_test.cpp checks
// the header against it along each constant.
#include <weft/sim/calibration.hpp>

#include <functional>
#include <string>
#include <vector>

#include "published_runs.hpp"
#include "sharded_runs.hpp"

namespace weft_test {

struct fit_row {
  std::string file, set, id; // file: "published" or "sharded"
  bool zero3 = false;        // overlap_slowdown moves it
  bool fp8 = false;          // FP8 GEMMs: fp8_gemm_peak_fraction moves it, fitted after the others
  std::function<double(const weft::sim::calibration&)> error; // predicted / published - 1
};

/// The GPU presets that share one set of constants, and their rows.
struct gpu_type {
  std::string name; // the presets' names, joined by '/'
  weft::sim::calibration constants;
  std::vector<fit_row> rows;
};

/// The grid of the fit, constant by constant.
inline std::vector<double> peak_fraction_grid() { // 0.55 to 0.85 by 0.01
  std::vector<double> v;
  for (int k = 55; k <= 85; ++k)
    v.push_back(k / 100.0);
  return v;
}
inline std::vector<double> half_dim_grid() {
  return {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 200, 256, 320, 384, 448, 512, 640, 768, 1024};
}
inline std::vector<double> hbm_fraction_grid() { // 0.60 to 0.90 by 0.05
  std::vector<double> v;
  for (int k = 60; k <= 90; k += 5)
    v.push_back(k / 100.0);
  return v;
}
inline std::vector<double> overlap_slowdown_grid() { // 0 to 1.5 by 0.01
  std::vector<double> v;
  for (int k = 0; k <= 150; ++k)
    v.push_back(k / 100.0);
  return v;
}

inline std::vector<double> fp8_peak_fraction_grid() { // 0.30 to 0.90 by 0.01
  std::vector<double> v;
  for (int k = 30; k <= 90; ++k)
    v.push_back(k / 100.0);
  return v;
}

/// Whether two presets take the same constants (their names aside).
inline bool same_constants(const weft::sim::calibration& a, const weft::sim::calibration& b) {
  return a.gemm_peak_fraction == b.gemm_peak_fraction && a.gemm_half_dim == b.gemm_half_dim &&
         a.hbm_fraction == b.hbm_fraction && a.nvlink_fraction == b.nvlink_fraction &&
         a.ib_fraction == b.ib_fraction && a.layer_overhead_s == b.layer_overhead_s &&
         a.overlap_slowdown == b.overlap_slowdown &&
         a.fp8_gemm_peak_fraction == b.fp8_gemm_peak_fraction;
}

/// The rows of both files by GPU type; the rows refer to `published` and `sharded`, which must
/// outlive them.
inline std::vector<gpu_type> gpu_types(const std::vector<published_run>& published,
                                       const std::vector<sharded_run>& sharded) {
  std::vector<gpu_type> types;
  const auto type_of = [&](const weft::sim::gpu& g) -> gpu_type& {
    const weft::sim::calibration c = weft::sim::calibration_of(g);
    for (gpu_type& t : types)
      if (same_constants(t.constants, c)) {
        if (t.name.find(g.name) == std::string::npos) t.name += "/" + std::string(g.name);
        return t;
      }
    return types.emplace_back(gpu_type{std::string(g.name), c, {}});
  };
  for (const published_run& r : published)
    type_of(r.device).rows.push_back({"published", r.set, r.id, r.layout.zero == 3,
                                      r.layout.gemm_precision != weft::sim::precision::bf16,
                                      [&r](const weft::sim::calibration& c) {
                                        return predicted_tflops(r, c) / r.measured_tflops - 1;
                                      }});
  for (const sharded_run& r : sharded)
    if (r.why_not.empty())
      type_of(r.device).rows.push_back({"sharded", r.set, r.id, r.layout.zero == 3,
                                        r.layout.gemm_precision != weft::sim::precision::bf16,
                                        [&r](const weft::sim::calibration& c) {
                                          return predicted_tokens(r, c) / r.published_tokens - 1;
                                        }});
  return types;
}

} // namespace weft_test
