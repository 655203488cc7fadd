#pragma once
// Measurement helpers shared by the benchmarks: nccl-tests' bandwidth definitions, the
// machine's streaming bandwidth, and timing of a collective across in-process ranks.
#include <weft/comm/transport/local.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

namespace weft::bench {

/// nccl-tests: algbw = bytes / time; busbw = algbw * factor, with factor 2(n-1)/n for
/// all-reduce, (n-1)/n for reduce-scatter, all-gather and all-to-all, 1 for broadcast/reduce.
inline double bus_factor_all_reduce(int n) { return n > 1 ? 2.0 * (n - 1) / n : 1.0; }
inline double bus_factor(collective c, int n) {
  switch (c) {
    case collective::all_reduce: return bus_factor_all_reduce(n);
    case collective::reduce_scatter:
    case collective::all_gather:
    case collective::all_to_all: return n > 1 ? static_cast<double>(n - 1) / n : 1.0;
    case collective::broadcast:
    case collective::reduce: return 1.0;
  }
  return 1.0;
}

/// Bytes per second of `a[i] += b[i]` over float arrays of `bytes` each, counting the two
/// reads and the write (3 x bytes per pass), run on `threads` threads at once, best of `reps`.
inline double stream_add_bandwidth(std::size_t bytes, int threads, int reps = 5) {
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<std::jthread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const std::size_t lo = n * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads);
        const std::size_t hi =
            n * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
        float* __restrict pa = a.data();
        const float* __restrict pb = b.data();
        for (std::size_t i = lo; i < hi; ++i)
          pa[i] += pb[i];
      });
    }
    pool.clear();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 3.0 * static_cast<double>(n * sizeof(float)) / s);
  }
  if (a[n / 2] < 0) std::terminate(); // keeps the work observable
  return best;
}

/// Bytes per second that each of `ranks` threads reduces (dst[i] = a[i] + b[i], float, three
/// distinct arrays, with weft's own kernel) while all of them do so at once: what the cost
/// model's reduce bandwidth is on this machine when every rank of a run computes (a plan's
/// reductions mostly write a buffer other than their sources: recv_reduce into the output).
/// Counts the elements' bytes once per pass, as the model does; the slowest thread's rate,
/// best of `reps`.
inline double reduce_bandwidth_per_rank(int ranks, std::size_t bytes = std::size_t{8} << 20,
                                        int reps = 3) {
  const std::size_t n = bytes / sizeof(float);
  const auto per_rank = [&](float v) {
    return std::vector<std::vector<float>>(static_cast<std::size_t>(ranks),
                                           std::vector<float>(n, v));
  };
  auto a = per_rank(1.0f), b = per_rank(2.0f), d = per_rank(0.0f);
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<double> seconds(static_cast<std::size_t>(ranks));
    {
      std::vector<std::jthread> pool;
      for (int t = 0; t < ranks; ++t) {
        pool.emplace_back([&, t] {
          const auto u = static_cast<std::size_t>(t);
          const auto t0 = std::chrono::steady_clock::now();
          for (int pass = 0; pass < 4; ++pass)
            detail::reduce2(d[u].data(), a[u].data(), b[u].data(), n, op::sum{});
          seconds[u] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        });
      }
    }
    best = std::max(
        best, 4.0 * static_cast<double>(bytes) / *std::max_element(seconds.begin(), seconds.end()));
  }
  if (d[0][n / 2] < 0) std::terminate(); // keeps the work observable
  return best;
}

/// Runs `call` on every rank of c `iters` times between two barriers; returns seconds per
/// call as rank 0 saw it.
template <class Call>
double time_calls(local::communicator& c, int iters, Call&& call) {
  c.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i)
    call();
  c.barrier();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

/// Times `call` on all ranks: warms up, picks an iteration count that fills about
/// `target` seconds (the same on every rank), and returns the best of `reps` runs.
template <class Call>
double time_collective(local::communicator& c, Call&& call, double target = 0.2, int reps = 3) {
  static std::atomic<int> agreed{0};
  call();
  double once = time_calls(c, 2, call);
  if (c.rank() == 0)
    agreed.store(std::clamp(static_cast<int>(target / reps / std::max(once, 1e-9)), 1, 100000));
  c.barrier();
  const int iters = agreed.load();
  c.barrier();
  double best = 1e30;
  for (int r = 0; r < reps; ++r)
    best = std::min(best, time_calls(c, iters, call));
  return best;
}

} // namespace weft::bench
