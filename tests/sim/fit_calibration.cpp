// Refits the constants of include/weft/sim/calibration.hpp, one set per GPU type, on every row
// marked `tune` in data/published_runs.csv and data/sharded_runs.csv, as data/README.md
// describes ("The fit"): a grid over gemm_peak_fraction, gemm_half_dim, hbm_fraction and
// overlap_slowdown, the point with the smallest largest error of those rows. Prints that point,
// every row of the GPU type (both files, held-out rows too) under it and under the header's
// constants, and the time the search took; exits 1 if a GPU type's point differs from the
// header's (the header then needs the printed figures), 2 if a GPU type has no tuning row, 3 if
// the search's shortcut (below) missed a better overlap_slowdown.
//
// FP8 rows are fitted apart: the grid above runs on the bf16 tuning rows only (no bf16 row
// depends on fp8_gemm_peak_fraction), then fp8_gemm_peak_fraction's grid on the FP8 tuning rows
// at the point found.
//
//   cmake --build build --target sim_fit_calibration && build/tests/sim_fit_calibration
//
// The search starts from the header's constants and moves only for a smaller largest error, so
// a tie keeps them. overlap_slowdown changes only the ZeRO-3 rows, and each of their predictions
// falls as it grows: the largest error over it is the larger of a falling curve (the most
// positive error) and a rising one (the most negative), least where they cross, which a
// bisection of its grid finds; the point found is then checked against the whole grid.
// hbm_fraction stops at 0.90: elementwise kernels do not stream HBM faster than that.
// gemm_peak_fraction's grid is wider than any fit has needed; a point on its edge is reported.
// Not a test: what it fits, sim_step_test and sim_sharded_runs_test check.
#include <weft/sim/calibration.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "sim/calibration_fit.hpp"

namespace {

using weft::sim::calibration;

using weft_test::fit_row;

// The largest |error| of `rows` under `c`, or any figure above `bound` once one row exceeds it.
double worst_of(const std::vector<const fit_row*>& rows, const calibration& c,
                double bound = 1e300) {
  double worst = 0;
  for (const fit_row* r : rows) {
    worst = std::max(worst, std::abs(r->error(c)));
    if (worst > bound) break;
  }
  return worst;
}

// The overlap_slowdown on `grid` that minimises the ZeRO-3 rows' largest error under `c`: the
// first at which the most positive error no longer exceeds the magnitude of the most negative
// one, or the one before it.
double best_overlap(const std::vector<const fit_row*>& zero3, calibration c,
                    const std::vector<double>& grid) {
  const auto spread = [&](std::size_t k) { // (most positive, most negative)
    c.overlap_slowdown = grid[k];
    double hi = -1e300, lo = 1e300;
    for (const fit_row* r : zero3) {
      const double e = r->error(c);
      hi = std::max(hi, e);
      lo = std::min(lo, e);
    }
    return std::pair{hi, lo};
  };
  const auto crossed = [&](std::size_t k) {
    const auto [hi, lo] = spread(k);
    return hi + lo <= 0;
  };
  std::size_t first = 0, last = grid.size() - 1; // the first crossed k lies in [first, last]
  if (!crossed(last)) return grid[last];
  while (first < last) {
    const std::size_t mid = (first + last) / 2;
    if (crossed(mid))
      last = mid;
    else
      first = mid + 1;
  }
  if (first == 0) return grid[0];
  const auto at = [&](std::size_t k) {
    const auto [hi, lo] = spread(k);
    return std::max(hi, -lo);
  };
  return at(first - 1) < at(first) ? grid[first - 1] : grid[first];
}

bool same(const calibration& a, const calibration& b) {
  return a.gemm_peak_fraction == b.gemm_peak_fraction && a.gemm_half_dim == b.gemm_half_dim &&
         a.hbm_fraction == b.hbm_fraction && a.overlap_slowdown == b.overlap_slowdown &&
         a.fp8_gemm_peak_fraction == b.fp8_gemm_peak_fraction;
}

void print(const char* what, const calibration& c, double worst) {
  std::printf(
      "  %-16s gemm_peak_fraction %.2f, gemm_half_dim %g, hbm_fraction %.2f, overlap_slowdown "
      "%.2f, fp8_gemm_peak_fraction %.2f: largest tuning error %.2f%%\n",
      what, c.gemm_peak_fraction, c.gemm_half_dim, c.hbm_fraction, c.overlap_slowdown,
      c.fp8_gemm_peak_fraction, 100 * worst);
}

} // namespace

int main() {
  const auto start = std::chrono::steady_clock::now();
  const auto published = weft_test::read_published_runs();
  const auto sharded = weft_test::read_sharded_runs();
  const std::vector<double> peak_fractions = weft_test::peak_fraction_grid(),
                            half_dims = weft_test::half_dim_grid(),
                            hbm_fractions = weft_test::hbm_fraction_grid(),
                            overlaps = weft_test::overlap_slowdown_grid(),
                            fp8_fractions = weft_test::fp8_peak_fraction_grid();
  int status = 0;
  for (const weft_test::gpu_type& type : weft_test::gpu_types(published, sharded)) {
    std::vector<const fit_row*> fixed, zero3; // the tuning rows overlap_slowdown leaves, and moves
    std::vector<const fit_row*> fp8;          // the FP8 tuning rows, fitted after
    for (const fit_row& r : type.rows)
      if (r.set == "tune") (r.fp8 ? fp8 : r.zero3 ? zero3 : fixed).push_back(&r);
    if (fixed.empty() && zero3.empty()) {
      std::fprintf(stderr, "%s: no tuning rows\n", type.name.c_str());
      return 2;
    }
    std::vector<const fit_row*> tuning = fixed;
    tuning.insert(tuning.end(), zero3.begin(), zero3.end());

    const calibration header = type.constants;
    calibration best = header;
    double best_worst = worst_of(tuning, header);
    for (const double pf : peak_fractions)
      for (const double hd : half_dims)
        for (const double hf : hbm_fractions) {
          calibration c = header;
          c.gemm_peak_fraction = pf;
          c.gemm_half_dim = hd;
          c.hbm_fraction = hf;
          const double fixed_worst = worst_of(fixed, c, best_worst);
          if (fixed_worst >= best_worst - 1e-9) continue;
          if (!zero3.empty()) c.overlap_slowdown = best_overlap(zero3, c, overlaps);
          const double worst = std::max(fixed_worst, worst_of(zero3, c, best_worst));
          if (worst < best_worst - 1e-9) {
            best_worst = worst;
            best = c;
          }
        }
    // The shortcut's check: no overlap_slowdown on the grid does better at the point found.
    for (const double k : overlaps) {
      calibration c = best;
      c.overlap_slowdown = k;
      if (!zero3.empty() && worst_of(tuning, c) < best_worst - 1e-9) {
        std::fprintf(stderr, "%s: overlap_slowdown %.2f beats the search's %.2f\n",
                     type.name.c_str(), c.overlap_slowdown, best.overlap_slowdown);
        status = 3;
      }
    }

    // fp8_gemm_peak_fraction at the point found, on the FP8 rows; a tie keeps the header's.
    double fp8_worst = 0;
    if (!fp8.empty()) {
      fp8_worst = worst_of(fp8, best);
      const calibration at = best;
      for (const double k : fp8_fractions) {
        calibration c = at;
        c.fp8_gemm_peak_fraction = k;
        const double w = worst_of(fp8, c);
        if (w < fp8_worst - 1e-9) {
          fp8_worst = w;
          best = c;
        }
      }
    }
    tuning.insert(tuning.end(), fp8.begin(), fp8.end());

    std::printf("%s: %zu tuning rows, %zu of them ZeRO-3, %zu FP8\n", type.name.c_str(),
                tuning.size(), zero3.size(), fp8.size());
    print("minimax:", best, std::max(best_worst, fp8_worst));
    print("calibration.hpp:", header, worst_of(tuning, header));
    if (!fp8.empty() && (best.fp8_gemm_peak_fraction <= fp8_fractions.front() ||
                         best.fp8_gemm_peak_fraction >= fp8_fractions.back()))
      std::printf("  fp8_gemm_peak_fraction on the grid's edge: widen the grid\n");
    if (best.gemm_peak_fraction <= peak_fractions.front() ||
        best.gemm_peak_fraction >= peak_fractions.back())
      std::printf("  gemm_peak_fraction on the grid's edge: widen the grid\n");
    if (best.overlap_slowdown >= overlaps.back())
      std::printf("  overlap_slowdown on the grid's edge: widen the grid\n");
    std::printf("  %-9s %-8s %-44s %9s %9s\n", "file", "set", "row", "minimax", "header");
    for (const std::string set : {"tune", "holdout"})
      for (const fit_row& r : type.rows)
        if (r.set == set)
          std::printf("  %-9s %-8s %-44s %+8.1f%% %+8.1f%%\n", r.file.c_str(), r.set.c_str(),
                      r.id.c_str(), 100 * r.error(best), 100 * r.error(header));
    if (!same(best, header) && status == 0) status = 1;
  }
  std::printf("search time %.1f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return status;
}
