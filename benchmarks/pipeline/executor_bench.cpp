// The pipeline executor's own cost: one training step of each schedule with empty stage
// functions (they return at once) and messages of no elements, on the local transport, so
// what is timed is the executor's bookkeeping and the transport's per-message work (post,
// wake, match). p = 2 and 4 ranks, m = 4p microbatches.
//
//   build/benchmarks/pipeline_executor_bench --benchmark_counters_tabular=true
//
// us_per_action: the step's wall time over the length of the longest rank's action list
// (compute, sends and receives): the time one action adds along a rank. The target is
// under 5 us. Ranks are threads: with more ranks than cores they take turns, and each
// message can cost a thread switch.
#include <weft/comm/transport/local.hpp>
#include <weft/pipeline/executor.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace {

namespace pl = weft::pipeline;
using weft::local::communicator;

// Stage functions that do nothing; their results view nothing.
struct empty_stage {
  struct result {
    double loss;
    std::span<const float> gradient;
  };
  std::span<const float> input(int) const { return {}; }
  std::span<const float> forward(int, int, std::span<const float>) const { return {}; }
  std::span<const float> backward(int, int, std::span<const float>) const { return {}; }
  void weight_grad(int, int) const {}
  result loss(int, std::span<const float>) const { return {0.0, {}}; }
};

template <class Schedule>
void step(benchmark::State& state) {
  const int p = static_cast<int>(state.range(0));
  const int m = 4 * p;
  using clock = std::chrono::steady_clock;
  std::atomic<bool> more{true};
  std::vector<clock::time_point> ends(static_cast<std::size_t>(p));
  std::size_t actions = 0;
  double seconds = 0;
  std::int64_t steps = 0;
  weft::local::run(p, [&](communicator& c) {
    pl::executor<Schedule, communicator> ex(c, m, 0);
    empty_stage st;
    const auto me = static_cast<std::size_t>(c.rank());
    // Rank 0 runs the benchmark loop and tells the others, through `more` and a barrier,
    // whether another step follows; each step is timed from rank 0's leaving the barrier to
    // the last rank's end.
    const auto one_step = [&] {
      ex.run(st);
      ends[me] = clock::now();
      c.barrier();
    };
    if (c.rank() != 0) {
      for (;;) {
        c.barrier();
        if (!more.load(std::memory_order_relaxed)) return;
        one_step();
      }
    }
    for (const auto& list : ex.schedule().ranks)
      actions = std::max(actions, list.size());
    for (auto _ : state) {
      c.barrier();
      const auto start = clock::now();
      one_step();
      const double s =
          std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) - start)
              .count();
      state.SetIterationTime(s);
      seconds += s;
      ++steps;
    }
    more.store(false, std::memory_order_relaxed);
    c.barrier();
  });
  state.counters["actions"] = static_cast<double>(actions);
  state.counters["us_per_step"] = seconds * 1e6 / static_cast<double>(steps);
  state.counters["us_per_action"] =
      seconds * 1e6 / static_cast<double>(steps) / static_cast<double>(actions);
}

template <class Schedule>
void add(const std::string& name) {
  benchmark::RegisterBenchmark(("executor/" + name).c_str(), step<Schedule>)
      ->ArgName("p")
      ->Arg(2)
      ->Arg(4)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

const bool registered = [] {
  add<pl::gpipe>("gpipe");
  add<pl::one_f_one_b>("1f1b");
  add<pl::interleaved<2>>("interleaved2");
  add<pl::interleaved<3>>("interleaved3");
  add<pl::zero_bubble_h1>("zb-h1");
  return true;
}();

} // namespace

BENCHMARK_MAIN();
