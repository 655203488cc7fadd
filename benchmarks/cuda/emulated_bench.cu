// all_reduce of float sums on 4 ranks emulated on one GPU (weft::cuda::emulated), one row per
// algorithm and size, with nccl-tests' counters: algbw = bytes / time, busbw = algbw x 2(n-1)/n.
//
// On one GPU the "links" are the device's own memory: every transfer is a copy from one
// rank's buffer to another's within the same HBM, and every rank's kernels share the same
// SMs. The numbers say how well each algorithm's device path (its copies, reduction kernels
// and stream hand-offs between ranks) uses one device; they are not an interconnect's.
//
//   build/benchmarks/cuda_emulated_bench --benchmark_counters_tabular=true
// Rows: all_reduce/cuda_emulated4/<algorithm>/<bytes>, and cuda_emulated2x2 for 2 nodes of 2
// (the hierarchical algorithms, and weft::cuda::two_level with ring at both levels).
// Sizes: WEFT_BENCH_SIZES (default 1M:256M:4). Each row queues `timed_calls` calls back to
// back on every rank, with no host synchronisation between them, and times them with CUDA
// events on each rank's stream; the slowest rank's time counts.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/recursive_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/cuda/emulated.cuh>
#include <weft/cuda/two_level.cuh>
#include <weft/topology/topology.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../support/sizes.hpp"

namespace {

namespace algo = weft::algo;
namespace emulated = weft::cuda::emulated;

constexpr int warmup_calls = 3;
constexpr int timed_calls = 20;

// Seconds per all_reduce<Algo> of `span` on comm, whose calls are queued on and end on stream s.
template <class Algo, class Comm>
double time_all_reduce(Comm& comm, cudaStream_t s, std::span<float> span) {
  WEFT_CUDA_TRY(cudaMemsetAsync(span.data(), 0, span.size_bytes(), s)); // zeros stay finite
  for (int i = 0; i < warmup_calls; ++i)
    weft::all_reduce<Algo>(comm, span);
  const weft::cuda::event start(true), stop(true);
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  comm.barrier(); // every stream idle: each start below marks the same moment
  start.record(s);
  for (int i = 0; i < timed_calls; ++i)
    weft::all_reduce<Algo>(comm, span);
  stop.record(s);
  return stop.elapsed_ms(start) * 1e-3 / timed_calls;
}

// Seconds per all_reduce of `count` floats on the ranks of `shape`; for algo::levels, through
// weft::cuda::two_level (make_two_level of the emulated world: each level its own communicator
// and stream, ordered by events), timed on the call's stream (the intra level's).
template <class Algo>
double seconds_per_call(const weft::topology::cluster& shape, std::size_t count) {
  std::vector<double> seconds(static_cast<std::size_t>(shape.size()));
  emulated::run(shape, [&](emulated::communicator& c) {
    weft::cuda::device_buffer<float> data(count);
    const std::span<float> span(data.data(), count);
    double t = 0;
    if constexpr (weft::algo::is_levels_v<Algo>) {
      auto tl = weft::make_two_level(c, {}, weft::cuda::stream_runtime{});
      t = time_all_reduce<Algo>(tl, tl.stream(), span);
    } else {
      t = time_all_reduce<Algo>(c, c.stream(), span);
    }
    seconds[static_cast<std::size_t>(c.rank())] = t;
  });
  return *std::max_element(seconds.begin(), seconds.end());
}

template <class Algo>
void all_reduce_float(benchmark::State& state, const weft::topology::cluster& shape) {
  if (const std::string why = weft::cuda::no_device_reason(); !why.empty()) {
    state.SkipWithError(why.c_str()); // "no CUDA device: ..."
    return;
  }
  const auto bytes = static_cast<std::size_t>(state.range(0));
  double seconds = 0;
  for (auto _ : state) {
    seconds = seconds_per_call<Algo>(shape, bytes / sizeof(float));
    state.SetIterationTime(seconds);
  }
  const int n = shape.size();
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  state.counters["time_us"] = seconds * 1e6;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * 2.0 * (n - 1) / n;
}

template <class Algo>
void add(const std::string& shape_name, const weft::topology::cluster& shape,
         const std::vector<std::int64_t>& sizes) {
  std::string algo_name(Algo::name);
  if constexpr (weft::algo::is_levels_v<Algo>) {
    algo_name =
        "two_level<" + std::string(Algo::intra::name) + ", " + std::string(Algo::inter::name) + ">";
  }
  const std::string name = "all_reduce/cuda_emulated" + shape_name + "/" + algo_name;
  auto* b = benchmark::RegisterBenchmark(
      name.c_str(), [shape](benchmark::State& state) { all_reduce_float<Algo>(state, shape); });
  weft::bench::apply_sizes(b, sizes, static_cast<std::int64_t>(shape.size() * sizeof(float)));
}

// Called from main, not a static initializer: a bad WEFT_BENCH_SIZES thrown from one would end in
// std::terminate before main could report it.
void register_all(const std::vector<std::int64_t>& sizes) {
  const auto flat = weft::topology::host(4);
  add<algo::ring>("4", flat, sizes);
  add<algo::tree>("4", flat, sizes);
  add<algo::halving_doubling>("4", flat, sizes);
  add<algo::recursive_doubling>("4", flat, sizes);
  add<algo::direct>("4", flat, sizes);
  add<algo::automatic>("4", flat, sizes);
  // The same 4 ranks as 2 emulated nodes of 2, for the two-level algorithms.
  const auto nodes = weft::topology::parse("2x2");
  add<algo::hierarchical<algo::ring, algo::ring>>("2x2", nodes, sizes);
  add<algo::hierarchical<algo::ring, algo::tree>>("2x2", nodes, sizes);
  add<algo::automatic>("2x2", nodes, sizes);
  add<algo::levels<algo::ring, algo::ring>>("2x2", nodes, sizes);
}

} // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1; // as BENCHMARK_MAIN does
  std::vector<std::int64_t> sizes;
  try {
    sizes = weft::bench::sizes_from_env("1M:256M:4");
  } catch (const weft::error& e) {
    std::fprintf(stderr, "cuda_emulated_bench: %s\n", e.what());
    return 2;
  }
  register_all(sizes);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
