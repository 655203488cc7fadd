// The optimizer step on the device (its target: at least 70% of HBM bandwidth)
// against the device's own copy bandwidth, in one run.
//
//   memcpy_d2d/<bytes>            cudaMemcpyAsync device to device: reads and writes `bytes`
//   adamw/<param type>/<params>   one AdamW step over flat device buffers: the update_ref of
//                                 weft/optim/optimizers.hpp launched as weft::cuda's element
//                                 kernel (fp32 master weights and two fp32 state slots; for
//                                 half and bfloat16 the gradients are of that type and the
//                                 low-precision parameters are written back)
//
// Counters: GBps is memory traffic per second (memcpy: 2 x bytes; AdamW on float: 28 bytes per
// parameter, the weight, gradient and two state words read, the weight and the state written;
// on half/bfloat16 also 28: a 2-byte gradient read and a 2-byte parameter written), time_us
// per step, and of_memcpy, the row's GBps over memcpy_d2d's at the nearest size measured
// earlier in the same run. Times are from CUDA events around back-to-back steps, best of 5.
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/optim/optimizers.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "support/cuda_timing.cuh"

namespace {

using weft::bench::skip_without_device;
using weft::bench::time_calls;

double& memcpy_gbps() {
  static double v = 0;
  return v;
}

void report(benchmark::State& state, double seconds, double traffic) {
  state.SetIterationTime(seconds);
  state.counters["time_us"] = seconds * 1e6;
  state.counters["GBps"] = traffic / seconds / 1e9;
  if (memcpy_gbps() > 0) state.counters["of_memcpy"] = traffic / seconds / 1e9 / memcpy_gbps();
}

// 1 GiB copied: about the 28 x 64M = 1.8 GB an AdamW step over 64M parameters moves.
void memcpy_d2d(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const auto bytes = static_cast<std::size_t>(state.range(0));
  double t = 0;
  for (auto _ : state)
    t = weft::bench::memcpy_d2d_seconds(bytes, 10);
  memcpy_gbps() = 2.0 * static_cast<double>(bytes) / t / 1e9;
  report(state, t, 2.0 * static_cast<double>(bytes));
}

template <class P>
void adamw(benchmark::State& state) {
  if (skip_without_device(state)) return;
  const auto n = static_cast<std::size_t>(state.range(0));
  weft::cuda::device_buffer<float> master(n), st(2 * n);
  weft::cuda::device_buffer<P> grad(n);
  weft::cuda::device_buffer<P> param(std::is_same_v<P, float> ? 0 : n);
  WEFT_CUDA_TRY(cudaMemset(master.data(), 0, n * sizeof(float)));
  WEFT_CUDA_TRY(cudaMemset(st.data(), 0, 2 * n * sizeof(float)));
  WEFT_CUDA_TRY(cudaMemset(grad.data(), 0, n * sizeof(P)));
  weft::cuda::stream s;
  const weft::optim::adamw rule{};
  long step = 0;
  double t = 0;
  P* low = std::is_same_v<P, float> ? nullptr : param.data();
  for (auto _ : state) {
    t = time_calls(s.get(), 10, [&] {
      const auto k = rule.at(++step, 1.0f);
      weft::cuda::detail::launch(
          weft::optim::update_ref<decltype(k), P, P>{k, master.data(), grad.data(), st.data(), low,
                                                     n},
          n, s.get());
    });
  }
  // float: w, g, m, v read (16 B), w, m, v written (12 B); half/bfloat16: master, m, v read and
  // written (24 B), a 2-byte gradient read and a 2-byte parameter written.
  report(state, t, 28.0 * static_cast<double>(n));
  state.counters["params_per_s"] = static_cast<double>(n) / t;
}

void manual(benchmark::internal::Benchmark* b) {
  b->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
}

} // namespace

BENCHMARK(memcpy_d2d)->Arg(std::int64_t{1} << 30)->Apply(manual);
BENCHMARK(adamw<float>)->Name("adamw/float")->Arg(std::int64_t{64} << 20)->Apply(manual);
BENCHMARK(adamw<weft::bfloat16>)
    ->Name("adamw/bfloat16")
    ->Arg(std::int64_t{64} << 20)
    ->Apply(manual);
BENCHMARK(adamw<weft::half>)->Name("adamw/half")->Arg(std::int64_t{64} << 20)->Apply(manual);

BENCHMARK_MAIN();
