// all_reduce of floats (sum) with algo::direct on the p2p transport: the one-shot kernel up to
// 16 KiB, the two-shot one past it.
//
//   p2p/all_reduce/<ranks>x_device0/<bytes>   ranks sharing device 0
//   p2p/all_reduce/<ranks>_devices/<bytes>    rank r on device r (registered where there are as
//   many)
//
// Counters, as nccl-tests defines them: time_us per call, algbw_GBps = bytes / time and
// busbw_GBps = algbw * 2(n-1)/n. Times are from CUDA events on rank 0's stream around a batch
// of back-to-back calls (each call syncs every rank, so rank 0's span covers them all), after
// a barrier that lines the ranks up; best of 5 batches. Ranks sharing one device share its
// memory bandwidth: those rows measure the kernels and syncs, not a link.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/cuda/memory.cuh>
#include <weft/cuda/p2p.cuh>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

namespace p2p = weft::cuda::p2p;

int calls_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 28) / bytes, 5, 200));
}

// Seconds per call on `devices`, best of 5 batches.
double time_all_reduce(const std::vector<int>& devices, std::size_t bytes) {
  const std::size_t n = bytes / sizeof(float);
  double best = 0;
  p2p::run(devices, [&](p2p::communicator& c) {
    const weft::cuda::stream_buffer<float> x(n, c.stream());
    WEFT_CUDA_TRY(cudaMemsetAsync(x.data(), 0, bytes, c.stream()));
    const std::span<float> data(x.data(), n);
    weft::all_reduce<weft::algo::direct>(
        c, data); // the plan and the kernels' launch figures, made once
    const weft::cuda::event start(true), stop(true);
    const int calls = calls_for(bytes);
    double t = 1e30;
    for (int batch = 0; batch < 5; ++batch) {
      c.barrier();
      start.record(c.stream());
      for (int i = 0; i < calls; ++i)
        weft::all_reduce<weft::algo::direct>(c, data);
      stop.record(c.stream());
      c.synchronize(); // also reports a sync that timed out
      t = std::min(t, static_cast<double>(stop.elapsed_ms(start)) * 1e-3 / calls);
    }
    if (c.rank() == 0) best = t;
  });
  return best;
}

void all_reduce_row(benchmark::State& state, const std::vector<int>& devices) {
  if (const std::string why = weft::cuda::no_device_reason(); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  const auto bytes = static_cast<std::size_t>(state.range(0));
  double seconds = 0;
  try {
    for (auto _ : state) {
      seconds = time_all_reduce(devices, bytes);
      state.SetIterationTime(seconds);
    }
  } catch (const weft::error& e) {
    state.SkipWithError(e.what());
    return;
  }
  const double ranks = static_cast<double>(devices.size());
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  state.counters["time_us"] = seconds * 1e6;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * 2.0 * (ranks - 1.0) / ranks;
}

void add_rows(const std::string& name, std::vector<int> devices) {
  auto* b = benchmark::RegisterBenchmark(
      name.c_str(), [devices](benchmark::State& state) { all_reduce_row(state, devices); });
  for (std::int64_t bytes = std::int64_t{4} << 10; bytes <= (std::int64_t{16} << 20); bytes *= 4)
    b->Arg(bytes);
  b->UseManualTime()->Iterations(1)->Unit(benchmark::kMicrosecond);
}

} // namespace

int main(int argc, char** argv) {
  // Ranks sharing a device: a hardware queue each and no kernel loaded late (before the first
  // CUDA call).
  p2p::configure_shared_device();
  for (int ranks : {2, 4})
    add_rows("p2p/all_reduce/" + std::to_string(ranks) + "x_device0",
             std::vector<int>(static_cast<std::size_t>(ranks), 0));
  const int devices = weft::cuda::device_count();
  for (int ranks : {2, 4}) {
    if (devices < ranks) continue;
    std::vector<int> each(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
      each[static_cast<std::size_t>(r)] = r;
    add_rows("p2p/all_reduce/" + std::to_string(ranks) + "_devices", each);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
