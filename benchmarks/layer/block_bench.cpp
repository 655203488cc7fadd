// Strong scaling of one tensor-parallel transformer block: forward + backward of a block of hidden
// 1024, 16 heads, sequence 256, micro-batch 4, in float, at TP = 1 on one rank and TP = 2 on two
// in-process ranks, measured alternately in one run on the same machine. Two blocks of that size:
//   gpt:   LayerNorms, multi-head attention with biases, GELU MLP of ffn 4 hidden
//   llama: RMSNorms, rotary grouped-query attention without biases (kv_heads = heads / 4,
//          rope_theta 10000), SwiGLU of Llama's ffn rule (2/3 of 4 hidden rounded up to 256: 2816,
//          whose three matrices hold about the GELU MLP's two of 4 hidden, so the blocks'
//          FLOPs compare)
//
//   build/benchmarks/layer_block_bench --benchmark_counters_tabular=true
//
// efficiency = t(TP=1) / (2 t(TP=2)): 1 when two ranks halve the step. The target is 0.75. Each
// rank does its GEMMs on one BLAS thread (weft::layer::cblas), so TP = 2 uses two cores where TP
// = 1 uses one; on a machine with fewer than two idle cores the figure means nothing.
// WEFT_BENCH_BLOCK=small runs tiny blocks instead (a smoke test of the program).
#include <weft/comm/transport/local.hpp>
#include <weft/layer/block.hpp>
#include <weft/layer/llama.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

using comm_t = weft::local::communicator;

struct config {
  weft::layer::block_shape shape;
  std::size_t batch;
  int reps;
};

config chosen() {
  const char* v = std::getenv("WEFT_BENCH_BLOCK");
  if (v != nullptr && std::strcmp(v, "small") == 0)
    return {{.hidden = 64, .heads = 4, .ffn = 0, .seq = 16}, 2, 2};
  return {{.hidden = 1024, .heads = 16, .ffn = 0, .seq = 256}, 4, 5};
}

// The two blocks: how each is built from the benchmark's shape, and its FLOPs per forward +
// backward (the GEMMs' 2 tokens x (weight elements) plus attention's 4 tokens seq hidden for
// Q K^T and P V, unmasked, times 3 with the backward: Narayanan et al. 2021).
struct gpt {
  using block = weft::layer::transformer_block<float, comm_t>;
  static block make(comm_t& c, const weft::layer::block_shape& s) { return block(c, s, 1, 1); }
  static double weights(const weft::layer::block_shape& s) {
    const double h = static_cast<double>(s.hidden);
    return 12.0 * h * h; // QKV and output 4 h^2, MLP 2 h (4 h)
  }
};

struct llama {
  using block =
      weft::layer::llama_block<float, comm_t, weft::layer::cblas, weft::layer::no_sequence_parallel,
                               weft::layer::recompute::none>;
  static weft::layer::llama_config config(const weft::layer::block_shape& s) {
    return {.hidden = s.hidden,
            .heads = s.heads,
            .kv_heads = s.heads / 4,
            .seq = s.seq,
            .layers = 1,
            .rope_theta = 10000};
  }
  static block make(comm_t& c, const weft::layer::block_shape& s) {
    return block(c, config(s), 0, 1);
  }
  static double weights(const weft::layer::block_shape& s) {
    const auto cfg = config(s);
    const double h = static_cast<double>(s.hidden);
    const double kv = h * static_cast<double>(cfg.kv_heads) / static_cast<double>(cfg.heads);
    return 2.0 * h * h + 2.0 * h * kv +
           3.0 * h * static_cast<double>(cfg.ffn_size()); // q, o; k, v; gate, up, down
  }
};

/// Seconds per forward + backward at the given TP size: the median of `reps` steps after one
/// warm-up.
template <class Kind>
double step_seconds(const config& cfg, int tp) {
  std::vector<double> times;
  weft::local::options opt;
  opt.timeout = std::chrono::minutes(10);
  weft::local::run(
      tp,
      [&](comm_t& c) {
        auto blk = Kind::make(c, cfg.shape);
        const std::size_t rows = cfg.batch * cfg.shape.seq;
        weft::matrix<float> x(rows, cfg.shape.hidden), y(rows, cfg.shape.hidden),
            dx(rows, cfg.shape.hidden);
        std::mt19937 g(3);
        std::normal_distribution<float> d;
        for (auto& v : x.flat())
          v = d(g);
        for (int r = -1; r < cfg.reps; ++r) {
          c.barrier();
          const auto t0 = std::chrono::steady_clock::now();
          blk.forward(x.view(), y.view());
          blk.backward(y.view(), dx.view());
          c.barrier();
          const double s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (c.rank() == 0 && r >= 0) times.push_back(s);
          benchmark::DoNotOptimize(dx.data());
        }
      },
      opt);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <class Kind>
void block_strong_scaling(benchmark::State& state) {
  const config cfg = chosen();
  double t1 = 0.0;
  double t2 = 0.0;
  for (auto _ : state) {
    t1 = step_seconds<Kind>(cfg, 1);
    t2 = step_seconds<Kind>(cfg, 2);
  }
  const double tokens = static_cast<double>(cfg.batch * cfg.shape.seq);
  const double flops = 3.0 * (2.0 * tokens * Kind::weights(cfg.shape) +
                              4.0 * tokens * static_cast<double>(cfg.shape.seq) *
                                  static_cast<double>(cfg.shape.hidden));
  state.counters["tp1_ms"] = t1 * 1e3;
  state.counters["tp2_ms"] = t2 * 1e3;
  state.counters["tp1_gflops"] = flops / t1 / 1e9;
  state.counters["tp2_gflops_per_rank"] = flops / t2 / 2 / 1e9;
  state.counters["efficiency"] = t1 / (2.0 * t2);
}

BENCHMARK_TEMPLATE(block_strong_scaling, gpt)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_TEMPLATE(block_strong_scaling, llama)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

} // namespace

BENCHMARK_MAIN();
