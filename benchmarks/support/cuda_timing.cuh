#pragma once
// For the device benchmarks: time stream-ordered calls with CUDA events, and skip (with the
// reason) where there is no device.
#include <weft/cuda/memory.cuh>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <string>

namespace weft::bench {

/// Seconds per call of f (which enqueues on s), best of 5 batches of `calls` calls, after one
/// call to warm up.
template <class F>
double time_calls(cudaStream_t s, int calls, F&& f) {
  const weft::cuda::event start(true), stop(true);
  f();
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  double best = 1e30;
  for (int batch = 0; batch < 5; ++batch) {
    start.record(s);
    for (int i = 0; i < calls; ++i)
      f();
    stop.record(s);
    best = std::min(best, static_cast<double>(stop.elapsed_ms(start)) * 1e-3 / calls);
  }
  return best;
}

/// Seconds per cudaMemcpyAsync of `bytes` from one device buffer to another (time_calls with
/// `calls` calls): the bandwidth the device benchmarks divide by. It moves 2 x bytes.
inline double memcpy_d2d_seconds(std::size_t bytes, int calls) {
  weft::cuda::device_buffer<std::byte> a(bytes), b(bytes);
  WEFT_CUDA_TRY(cudaMemset(a.data(), 1, bytes));
  const weft::cuda::stream s;
  return time_calls(s.get(), calls, [&] {
    WEFT_CUDA_TRY(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s.get()));
  });
}

/// True, with the benchmark marked skipped and why, where no CUDA device is present.
inline bool skip_without_device(benchmark::State& state) {
  const std::string why = weft::cuda::no_device_reason();
  if (why.empty()) return false;
  state.SkipWithError(why.c_str());
  return true;
}

} // namespace weft::bench
