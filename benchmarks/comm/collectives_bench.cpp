// Every collective x algorithm on the local transport (4 ranks as threads, float sum, out of
// place), 4 B .. 256 MiB by powers of 2 (WEFT_BENCH_SIZES="min:max:factor" to change), with
// nccl-tests' algbw and busbw, the cost model's predicted time for the same plans (model_us;
// the host(4) cluster's figures are nominal, so these are rough), and the physical
// references of the same run: memcpy bandwidth by size (one thread) and the streaming
// bandwidth of a[i] += b[i] on all cores, from which all_reduce's of_bound is the fraction of
// the memory-traffic bound reached (an in-memory all-reduce of N bytes on p ranks reads every
// input and writes every output once: 2 p N bytes).
//
//   build/benchmarks/comm_collectives_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>
#include <vector>

#include "support/references.hpp"
#include "support/sizes.hpp"
#include "support/suite.hpp"

namespace {

using weft::collective;
namespace algo = weft::algo;

constexpr int ranks = 4;

const std::vector<std::int64_t>& sizes() {
  static const auto s = weft::bench::sizes_from_env("4:256M:2");
  return s;
}

void apply_sizes(benchmark::internal::Benchmark* b, std::int64_t at_least = 1) {
  weft::bench::apply_sizes(b, sizes(), at_least);
}

template <collective C, class Algo>
void add() {
  if constexpr (Algo::serves(C)) {
    const std::string name = std::string(weft::name_of(C)) + "/local" + std::to_string(ranks) +
                             "/" + std::string(Algo::name);
    benchmark::RegisterBenchmark(name.c_str(), [](benchmark::State& state) {
      const auto bytes = static_cast<std::size_t>(state.range(0));
      weft::bench::run_local_case<C, Algo>(state, weft::topology::host(ranks), {}, bytes);
      if constexpr (C == collective::all_reduce) {
        state.counters["of_bound"] =
            weft::bench::of_bound(ranks, bytes, state.counters["time_us"] * 1e-6);
      }
    })->Apply([](benchmark::internal::Benchmark* b) {
      constexpr bool blocks = C == collective::reduce_scatter || C == collective::all_gather ||
                              C == collective::all_to_all;
      apply_sizes(b, static_cast<std::int64_t>(sizeof(float)) * (blocks ? ranks : 1));
    });
  }
}

template <collective C>
void add_all() {
  add<C, algo::ring>();
  add<C, algo::tree>();
  add<C, algo::halving_doubling>();
  add<C, algo::recursive_doubling>();
  add<C, algo::direct>();
  add<C, algo::pairwise>();
  add<C, algo::automatic>();
}

} // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  try {
    sizes(); // read here: a bad WEFT_BENCH_SIZES thrown from a registration would abort
  } catch (const weft::error& e) {
    std::fprintf(stderr, "comm_collectives_bench: %s\n", e.what());
    return 2;
  }
  benchmark::RegisterBenchmark("stream_add", weft::bench::stream_add_row)->Iterations(1);
  benchmark::RegisterBenchmark("memcpy", weft::bench::memcpy_row)->Apply([](auto* b) {
    apply_sizes(b);
  });
  add_all<collective::all_reduce>();
  add_all<collective::reduce_scatter>();
  add_all<collective::all_gather>();
  add_all<collective::broadcast>();
  add_all<collective::reduce>();
  add_all<collective::all_to_all>();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
