#pragma once
// The physical references a suite run prints beside its collectives, measured in the same
// run: the copy bandwidth of one thread by size (cached at small sizes, DRAM at large), and
// the streaming bandwidth of a[i] += b[i] on every core, from which an all-reduce's of_bound
// is the fraction of the memory-traffic bound it reaches (an in-memory all-reduce of N bytes
// on p ranks reads every input and writes every output once: 2 p N bytes).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "support/measure.hpp"

namespace weft::bench {

/// a[i] += b[i] over 256 MiB on all cores, bytes per second (two reads and a write counted),
/// measured again when the last measurement is more than 10 s old: this virtual machine's
/// memory bandwidth drifts by up to 1.5x over minutes, so a bound measured at the start of
/// a long run would misjudge rows timed later. Rows at most 10 s apart share one figure.
inline double stream_bandwidth() {
  using clock = std::chrono::steady_clock;
  static double bw = 0;
  static clock::time_point measured{};
  if (bw == 0 || clock::now() - measured > std::chrono::seconds(10)) {
    bw = stream_add_bandwidth(std::size_t{256} << 20,
                              static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    measured = clock::now();
  }
  return bw;
}

/// all_reduce's fraction of the memory-traffic bound, for p ranks and `bytes` per rank.
inline double of_bound(int p, std::size_t bytes, double seconds) {
  return 2.0 * p * static_cast<double>(bytes) / stream_bandwidth() / seconds;
}

/// Benchmark row `memcpy/<bytes>`: one thread copying range(0) bytes, best of several runs.
inline void memcpy_row(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> a(bytes, 1), b(bytes, 0);
  double best = 1e30;
  for (auto _ : state) {
    const int reps = static_cast<int>(std::max<std::size_t>(1, (std::size_t{64} << 20) / bytes));
    for (int k = 0; k < 5; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) {
        std::memcpy(b.data(), a.data(), bytes);
        benchmark::ClobberMemory();
      }
      best = std::min(
          best,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    state.SetIterationTime(best);
  }
  state.counters["time_us"] = best * 1e6;
  state.counters["GBps"] = static_cast<double>(bytes) / best / 1e9;
}

/// Benchmark row `stream_add`: the streaming bandwidth above, GB/s.
inline void stream_add_row(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(stream_bandwidth());
  state.counters["stream_add_GBps"] = stream_bandwidth() / 1e9;
}

} // namespace weft::bench
