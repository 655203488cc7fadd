// The optimizer step on the host: AdamW over 64M float parameters (fp32 weights, gradients
// and both moments: 28 bytes of memory traffic per parameter, 16 read and 12 written), the
// same functor and loop data_parallel runs, on all cores and on one; and beside it, measured
// in the same run, the streaming bandwidth of a[i] += b[i] on all cores
// (bench::stream_bandwidth()). of_stream is the step's bandwidth over it; the target is
// at least 0.5.
//
//   build/benchmarks/optim_adamw_bench --benchmark_counters_tabular=true
//   WEFT_BENCH_PARAMS=16M ... (fewer parameters, for a quick run; K, M, G in either case are
//   powers of 1024; anything else, such as 1.5M, is refused with exit status 2)
//
// Also rows for bfloat16 and half parameters with fp32 master weights (gradients of the same type,
// 28 bytes per parameter: master, two moments read and written (24), the gradient read, the 16-bit
// copy written), and, on one thread, the same step as the functor's plain element loop (`scalar`:
// what the vectorized loop replaces; compare their GBps with the one-thread rows').
#include <weft/optim/optimizers.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "support/references.hpp"
#include "support/sizes.hpp"

namespace {

namespace wo = weft::optim;

// WEFT_BENCH_PARAMS or 64M; main reads it first, so a bad value ends the program before any row.
std::size_t parameters() {
  static const std::size_t n = [] {
    const char* v = std::getenv("WEFT_BENCH_PARAMS");
    if (v == nullptr || *v == '\0') return std::size_t{64} << 20;
    return static_cast<std::size_t>(weft::bench::parse_size(v, "WEFT_BENCH_PARAMS"));
  }();
  return n;
}

template <class P, bool Scalar = false>
void adamw_step(benchmark::State& state) {
  const int threads = state.range(0) == 0
                          ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))
                          : static_cast<int>(state.range(0));
  const std::size_t n = parameters();
  std::vector<float> master(n, 0.5f), moments(2 * wo::slot_stride(n), 0.0f);
  std::vector<P> grad(n, P(0.001f)), param(std::is_same_v<P, float> ? 0 : n, P(0.5f));
  const wo::adamw rule{.lr = 1e-3f};
  long t = 0;
  double best = 1e30;
  // First touch from the threads that will use the memory (a NUMA machine cares).
  {
    const wo::update_ref<wo::adamw::kernel, P, P> u{rule.at(1, 0.0f), master.data(),
                                                    grad.data(),      moments.data(),
                                                    param.data(),     wo::slot_stride(n)};
    wo::apply_parallel(u, n, threads);
  }
  for (auto _ : state) {
    const wo::update_ref<wo::adamw::kernel, P, P> u{rule.at(++t, 1.0f), master.data(),
                                                    grad.data(),        moments.data(),
                                                    param.data(),       wo::slot_stride(n)};
    const auto t0 = std::chrono::steady_clock::now();
    if constexpr (Scalar) {
      for (std::size_t i = 0; i < n; ++i)
        u(i);
    } else {
      wo::apply_parallel(u, n, threads);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    state.SetIterationTime(s);
  }
  benchmark::DoNotOptimize(master[n / 2]);
  const double bytes_per = 28.0; // float: 16 read, 12 written; 16-bit: 24 + 2 read + 2 written
  const double gbps = bytes_per * static_cast<double>(n) / best / 1e9;
  const double stream = weft::bench::stream_bandwidth() / 1e9; // right after the rows, within 10 s
  state.counters["params_M"] = static_cast<double>(n) / (1 << 20);
  state.counters["threads"] = threads;
  state.counters["best_ms"] = best * 1e3;
  state.counters["GBps"] = gbps;
  state.counters["stream_GBps"] = stream;
  state.counters["of_stream"] = gbps / stream;
}

BENCHMARK(adamw_step<float>)
    ->Name("adamw_step/float")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(adamw_step<weft::bfloat16>)
    ->Name("adamw_step/bfloat16_master_fp32")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(adamw_step<weft::half>)
    ->Name("adamw_step/half_master_fp32")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(10)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(adamw_step<weft::bfloat16, true>)
    ->Name("adamw_step/bfloat16_master_fp32_scalar")
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(adamw_step<weft::half, true>)
    ->Name("adamw_step/half_master_fp32_scalar")
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(5)
    ->Unit(benchmark::kMillisecond);

} // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1; // as BENCHMARK_MAIN does
  try {
    parameters();
  } catch (const weft::error& e) {
    std::fprintf(stderr, "optim_adamw_bench: %s\n", e.what());
    return 2;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
