// Strong scaling of one tensor-parallel transformer block (issue 6): forward + backward of a
// block of hidden 1024, 16 heads, sequence 256, micro-batch 4, in float, at TP = 1 on one rank and
// TP = 2 on two in-process ranks, measured alternately in one run on the same machine.
//
//   build/benchmarks/layer_block_bench
//
// efficiency = t(TP=1) / (2 t(TP=2)): 1 when two ranks halve the step. The target is 0.75. Each
// rank does its GEMMs on one BLAS thread (weft::layer::cblas), so TP = 2 uses two cores where TP
// = 1 uses one; on a machine with fewer than two idle cores the figure means nothing.
// WEFT_BENCH_BLOCK=small runs a tiny block instead (a smoke test of the program).
#include <weft/comm/transport/local.hpp>
#include <weft/layer/block.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

using comm_t = weft::local::communicator;
using block_t = weft::layer::transformer_block<float, comm_t>;

struct config {
  weft::layer::block_shape shape;
  std::size_t batch;
  int reps;
};

config chosen() {
  const char* v = std::getenv("WEFT_BENCH_BLOCK");
  if (v != nullptr && std::strcmp(v, "small") == 0) return {{.hidden = 64, .heads = 4, .ffn = 0, .seq = 16}, 2, 2};
  return {{.hidden = 1024, .heads = 16, .ffn = 0, .seq = 256}, 4, 5};
}

/// Seconds per forward + backward at the given TP size: the median of `reps` steps after one warm-up.
double step_seconds(const config& cfg, int tp) {
  std::vector<double> times;
  weft::local::options opt;
  opt.timeout = std::chrono::minutes(10);
  weft::local::run(
      tp,
      [&](comm_t& c) {
        block_t blk(c, cfg.shape, 1, 1);
        const std::size_t rows = cfg.batch * cfg.shape.seq;
        weft::matrix<float> x(rows, cfg.shape.hidden), y(rows, cfg.shape.hidden), dx(rows, cfg.shape.hidden);
        std::mt19937 g(3);
        std::normal_distribution<float> d;
        for (auto& v : x.flat()) v = d(g);
        for (int r = -1; r < cfg.reps; ++r) {
          c.barrier();
          const auto t0 = std::chrono::steady_clock::now();
          blk.forward(x.view(), y.view());
          blk.backward(y.view(), dx.view());
          c.barrier();
          const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (c.rank() == 0 && r >= 0) times.push_back(s);
          benchmark::DoNotOptimize(dx.data());
        }
      },
      opt);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void block_strong_scaling(benchmark::State& state) {
  const config cfg = chosen();
  double t1 = 0.0;
  double t2 = 0.0;
  for (auto _ : state) {
    t1 = step_seconds(cfg, 1);
    t2 = step_seconds(cfg, 2);
  }
  const double tokens = static_cast<double>(cfg.batch * cfg.shape.seq);
  const double h = static_cast<double>(cfg.shape.hidden);
  // 24 tokens h^2 for the GEMMs of the forward plus 4 tokens seq h for attention's, times 3 with
  // the backward (Narayanan et al. 2021), per block.
  const double flops = 3.0 * (24.0 * tokens * h * h + 4.0 * tokens * static_cast<double>(cfg.shape.seq) * h);
  state.counters["tp1_ms"] = t1 * 1e3;
  state.counters["tp2_ms"] = t2 * 1e3;
  state.counters["tp1_gflops"] = flops / t1 / 1e9;
  state.counters["tp2_gflops_per_rank"] = flops / t2 / 2 / 1e9;
  state.counters["efficiency"] = t1 / (2.0 * t2);
}

BENCHMARK(block_strong_scaling)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

} // namespace

BENCHMARK_MAIN();
