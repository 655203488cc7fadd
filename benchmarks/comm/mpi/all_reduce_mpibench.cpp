// weft::all_reduce over MPI processes (automatic and each algorithm) against MPI_Allreduce,
// in the same program and the same run: float sum, out of place, 4 B .. 64 MiB.
//
//   mpirun -n 4 build/benchmarks/comm/mpi/comm_mpi_all_reduce_mpibench
//   --benchmark_counters_tabular=true
//
// Every iteration times one weft call and one MPI_Allreduce call on the same buffers, each
// started right after a barrier and counted until the last rank has finished (the slowest
// rank's time, gathered with MPI_MAX outside the timed region), so both see the same
// machine state. Time is the mean of weft's calls; the counters use the median iteration,
// which another program's burst of work on the machine moves little:
//   weft_us, mpi_us   median time of one call
//   busbw             weft's bus bandwidth, nccl-tests' definition (algbw * 2(p-1)/p), GB/s
//   mpi_busbw         the same for MPI_Allreduce
//   ratio             busbw / mpi_busbw: above 1, weft is faster
// automatic's row is labelled with the algorithm it chose. The rows "automatic,throw_error"
// run automatic on a communicator with on_failure::throw_error, whose large steps wait for
// their receivers' credits (docs/reliability.md).
// Only rank 0 reports. The iteration counts are fixed per size (the same on every rank,
// which collectives need).
#include <weft/comm/transport/mpi.hpp>
#include <weft/weft.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "support/measure.hpp"

namespace {

weft::mpi::communicator* world = nullptr;

// Reports nothing: the ranks other than 0 run the same benchmarks, silently.
class silent_reporter : public benchmark::BenchmarkReporter {
public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The middle value: one iteration slowed by another program on the machine moves it little.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Small integers: every order of summation gives the exact answer, so the result is checked.
float input(int r, std::size_t i) {
  return static_cast<float>(static_cast<int>((r * 7 + i * 13) % 11) - 5);
}

template <class Algo>
void all_reduce_vs_mpi(benchmark::State& state, weft::mpi::communicator* comm) {
  auto& c = *comm;
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / sizeof(float);
  const int p = c.size();
  std::vector<float> in(count), out(count), mpi_out(count);
  for (std::size_t i = 0; i < count; ++i)
    in[i] = input(c.rank(), i);
  const auto run_weft = [&] {
    weft::all_reduce<Algo>(c, std::span<const float>(in), std::span(out));
  };
  const auto run_mpi = [&] {
    MPI_Allreduce(in.data(), mpi_out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  c.native());
  };
  run_weft(); // warm-up: plans, buffers, MPI's connections
  run_mpi();
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int r = 0; r < p; ++r)
      want += input(r, i);
    wrong += out[i] == want ? 0 : 1;
  }
  std::int64_t wrong_all = 0;
  MPI_Allreduce(&wrong, &wrong_all, 1, MPI_INT64_T, MPI_SUM, c.native());
  if (wrong_all != 0) {
    state.SkipWithError(
        ("weft's result is wrong in " + std::to_string(wrong_all) + " elements").c_str());
    return;
  }
  std::vector<double> weft_times;
  std::vector<double> mpi_times;
  for (auto _ : state) {
    double t[2];
    MPI_Barrier(c.native());
    auto t0 = std::chrono::steady_clock::now();
    run_weft();
    t[0] = since(t0);
    MPI_Barrier(c.native());
    t0 = std::chrono::steady_clock::now();
    run_mpi();
    t[1] = since(t0);
    double slowest[2];
    MPI_Allreduce(t, slowest, 2, MPI_DOUBLE, MPI_MAX, c.native());
    state.SetIterationTime(slowest[0]);
    weft_times.push_back(slowest[0]);
    mpi_times.push_back(slowest[1]);
  }
  const double weft_s = median(weft_times);
  const double mpi_s = median(mpi_times);
  const double factor = weft::bench::bus_factor_all_reduce(p);
  const double busbw = static_cast<double>(bytes) / weft_s * factor / 1e9;
  const double mpi_busbw = static_cast<double>(bytes) / mpi_s * factor / 1e9;
  state.counters["weft_us"] = weft_s * 1e6;
  state.counters["mpi_us"] = mpi_s * 1e6;
  state.counters["busbw"] = busbw;
  state.counters["mpi_busbw"] = mpi_busbw;
  state.counters["ratio"] = busbw / mpi_busbw;
  if constexpr (std::is_same_v<Algo, weft::algo::automatic>) {
    const weft::plan_request q{
        weft::collective::all_reduce, p, 0, count, 0, c.node_of(), sizeof(float)};
    state.SetLabel(std::string(weft::algo::choose(q, c.cluster(), c.devices(), false).name));
  }
}

// The same number of iterations on every rank, about 64 MiB of data per benchmark.
std::int64_t iterations_for(std::int64_t bytes) {
  return std::clamp<std::int64_t>((std::int64_t{64} << 20) / bytes, 5, 500);
}

template <class Algo>
void add(std::string_view name, weft::mpi::communicator* comm = world) {
  for (std::int64_t s = 4; s <= (std::int64_t{64} << 20); s *= 4) {
    benchmark::RegisterBenchmark(
        ("all_reduce/mpi" + std::to_string(comm->size()) + "/" + std::string(name)).c_str(),
        all_reduce_vs_mpi<Algo>, comm)
        ->Arg(s)
        ->Iterations(iterations_for(s))
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

} // namespace

int main(int argc, char** argv) {
  weft::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Only rank 0 may write --benchmark_out's file; the others would truncate it.
  std::vector<char*> args(argv, argv + argc);
  if (rank != 0) {
    args.erase(
        std::remove_if(args.begin() + 1, args.end(),
                       [](const char* a) { return std::strncmp(a, "--benchmark_out", 15) == 0; }),
        args.end());
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  try {
    auto w = weft::mpi::world();
    world = &w;
    add<weft::algo::automatic>("automatic");
    add<weft::algo::ring>("ring");
    add<weft::algo::tree>("tree");
    add<weft::algo::halving_doubling>("halving_doubling");
    add<weft::algo::recursive_doubling>("recursive_doubling");
    add<weft::algo::hierarchical<weft::algo::ring, weft::algo::ring>>("hierarchical<ring,ring>");
    add<weft::algo::hierarchical<weft::algo::ring, weft::algo::tree>>("hierarchical<ring,tree>");
    // The default policy is abort_job; under throw_error a large step waits for its
    // receiver's credit (docs/reliability.md): what that costs.
    weft::mpi::options throwing;
    throwing.on_failure = weft::on_failure::throw_error;
    auto t = weft::mpi::world(throwing);
    add<weft::algo::automatic>("automatic,throw_error", &t);
    if (rank == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      silent_reporter quiet;
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    world = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    env.abort(1);
  }
  benchmark::Shutdown();
  return 0;
}
