// all_reduce over the local transport (ranks as threads), every algorithm, 4 B .. 64 MiB.
// Reports nccl-tests' algbw and busbw, and the fraction of the memory-traffic bound reached:
// an in-memory all-reduce of N bytes on p ranks must read every input and write every
// output once, 2*p*N bytes, so it takes at least 2*p*N / (streaming bandwidth of a[i] += b[i]
// measured in this run, on all cores).
//
//   build/benchmarks/comm_all_reduce_bench --benchmark_counters_tabular=true
#include <weft/weft.hpp>

#include "support/measure.hpp"

#include <benchmark/benchmark.h>

#include <string>
#include <thread>

namespace {

constexpr int ranks = 4;

double stream_bandwidth() {
  static const double bw = weft::bench::stream_add_bandwidth(std::size_t{256} << 20,
                                                             static_cast<int>(std::thread::hardware_concurrency()));
  return bw;
}

template <class Algo>
void all_reduce_local(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / sizeof(float);
  double seconds = 0;
  for (auto _ : state) {
    weft::local::run(ranks, [&](weft::local::communicator& c) {
      std::vector<float> in(count, 1.0f), out(count);
      const double t = weft::bench::time_collective(c, [&] {
        weft::all_reduce<Algo>(c, std::span<const float>(in), std::span(out));
      });
      if (c.rank() == 0) seconds = t;
    });
    state.SetIterationTime(seconds);
  }
  const double algbw = static_cast<double>(bytes) / seconds;
  state.counters["time_us"] = seconds * 1e6;
  state.counters["algbw_GBps"] = algbw / 1e9;
  state.counters["busbw_GBps"] = algbw * weft::bench::bus_factor_all_reduce(ranks) / 1e9;
  state.counters["of_bound"] = 2.0 * ranks * static_cast<double>(bytes) / stream_bandwidth() / seconds;
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t s = 4; s <= (std::int64_t{64} << 20); s *= 4) b->Arg(s);
  b->Iterations(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

void stream_add(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(stream_bandwidth());
  state.counters["stream_add_GBps"] = stream_bandwidth() / 1e9;
}

} // namespace

BENCHMARK(stream_add)->Iterations(1);
BENCHMARK(all_reduce_local<weft::algo::ring>)->Name("all_reduce/local4/ring")->Apply(sizes);
BENCHMARK(all_reduce_local<weft::algo::tree>)->Name("all_reduce/local4/tree")->Apply(sizes);
BENCHMARK(all_reduce_local<weft::algo::halving_doubling>)->Name("all_reduce/local4/halving_doubling")->Apply(sizes);
BENCHMARK(all_reduce_local<weft::algo::recursive_doubling>)->Name("all_reduce/local4/recursive_doubling")->Apply(sizes);
BENCHMARK(all_reduce_local<weft::algo::direct>)->Name("all_reduce/local4/direct")->Apply(sizes);
BENCHMARK(all_reduce_local<weft::algo::automatic>)->Name("all_reduce/local4/automatic")->Apply(sizes);

BENCHMARK_MAIN();
