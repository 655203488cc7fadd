// weft beside the libraries people would otherwise use, in one program and one run: 4 ranks,
// float sum, 4 B .. 64 MiB by 4x (WEFT_BENCH_SIZES="min:max:factor" to change).
//
//   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
//   mpirun -n 4 --oversubscribe --bind-to none build/benchmarks/peers/weft_peer_suite
//     --benchmark_counters_tabular=true                   (one command line)
//
// Rows, all named <collective>/<transport><ranks>/<algorithm or peer>/<bytes>:
//   mpi4/<algorithm>        weft over MPI processes, every collective x algorithm it serves;
//                           mpi4/vendor is MPI's own collective called through weft
//                           (algo::vendor), mpi4/automatic the default (the cost model's pick)
//   mpi4/automatic_measured automatic with mpi::options::measured_automatic: MPI's own
//                           collective unless a plan of weft's measured cheaper (label: the pick)
//   mpi4/MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather    MPI's own (Open MPI)
//   mpi4/MPI_Iallreduce     MPI's nonblocking all-reduce, which mpi4/vendor calls
//   local4/<algorithm>      weft's all-reduce on 4 threads of rank 0 (every algorithm);
//                           local4/automatic the default (prices measured on the machine)
//   local4/automatic_model  automatic with local::automatic_prices::model (the cost model's
//                           nominal figures)
//   gloo4/ring, ring_chunked, halving_doubling    Gloo's all-reduce, 4 threads of rank 0 over TCP
//   memcpy/<bytes>, stream_add                    the machine's copy and streaming bandwidth
// While rank 0 runs a threaded row the other ranks sleep in a polling barrier (MPI_Barrier
// would spin and take the cores from rank 0's threads). Without MPI the program runs the
// local, Gloo and reference rows alone. Only rank 0 reports.
//
// Before any benchmark every peer is checked against a plain-loop reference at a few
// counts; a wrong answer ends the program with status 1. `--check_only` stops after the
// checks (the ctest test benchmarks_peers_check). weft's own results are checked by
// weft-perf's tests.
//
// Sizes are nccl-tests' "size": the all-reduce vector, the reduce-scatter input and the
// all-gather output (count*p elements; so these start at 4p bytes). Counters:
//   time_us      seconds per call, in us: MPI-side rows (weft's and MPI's alike) by
//                mpi_peer::time_calls, Gloo by gloo_group::time_all_reduce, local rows by
//                bench::time_collective: each the best of 3 runs of back-to-back calls, a run
//                timed by its slowest rank
//   algbw_GBps   size / time
//   busbw_GBps   algbw * 2(p-1)/p for all-reduce, * (p-1)/p for reduce-scatter, all-gather and
//                all-to-all, * 1 for broadcast and reduce
//   model_us     weft's rows: the cost model's price of the same plans (label: the algorithm)
//   measured_us  mpi4/automatic_measured: the measured price of the pick at the row's size
//   peer         1 on MPI's and Gloo's rows, so plot.py tells them from weft's unpriced rows
//   of_bound     local all-reduce: the fraction of the memory-traffic bound reached
// After Google Benchmark's output rank 0 prints the all-reduce figures as one table, weft
// and the peers side by side.
#include "peers/gloo_peer.hpp"
#include "support/references.hpp"
#include "support/sizes.hpp"
#include "support/suite.hpp"

#if defined(WEFT_BENCH_HAVE_MPI) && WEFT_BENCH_HAVE_MPI
#include <weft/comm/transport/mpi.hpp>

#include "peers/mpi_peer.hpp"
#define WEFT_PEERS_MPI 1
#else
#define WEFT_PEERS_MPI 0
#endif

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace {

constexpr int repetitions = 3;

const std::vector<std::int64_t>& sizes() {
  static const auto s = weft::bench::sizes_from_env("4:64M:4");
  return s;
}

void apply_sizes(benchmark::internal::Benchmark* b, std::int64_t at_least) {
  weft::bench::apply_sizes(b, sizes(), at_least);
}

// Calls per timed run, fixed by size (the same on every rank, which MPI's collectives need):
// about 16 MiB of data per run, at least 2 calls and at most 500.
[[maybe_unused]] int iterations_for(std::int64_t bytes) {
  return static_cast<int>(std::clamp<std::int64_t>((std::int64_t{16} << 20) / bytes, 2, 500));
}

// Every measurement, for the summary table printed at the end: collective -> series -> size
// -> (seconds, bus factor). The series keep their first-registered order.
struct measurement {
  double seconds;
  double factor;
};
struct series {
  std::string name;
  std::map<std::int64_t, measurement> by_size;
};
std::map<std::string, std::vector<series>> results;

[[maybe_unused]] void record(const std::string& collective, const std::string& name,
                             std::int64_t bytes, measurement m) {
  auto& list = results[collective];
  auto it = std::find_if(list.begin(), list.end(), [&](const series& x) { return x.name == name; });
  if (it == list.end()) it = list.insert(list.end(), series{name, {}});
  it->by_size[bytes] = m;
}

// One table per collective: a row per size, time and bus bandwidth of each peer side by side.
void print_summary() {
  for (const auto& [collective, list] : results) {
    std::printf("\n%s, float%s: time_us | busbw_GBps\n%10s", collective.c_str(),
                collective == "all_gather" ? "" : " sum", "bytes");
    std::set<std::int64_t> seen;
    for (const series& x : list) {
      std::printf("  %24s", x.name.c_str());
      for (const auto& [bytes, m] : x.by_size)
        seen.insert(bytes);
    }
    std::printf("\n");
    for (std::int64_t bytes : seen) {
      std::printf("%10lld", static_cast<long long>(bytes));
      for (const series& x : list) {
        const auto it = x.by_size.find(bytes);
        if (it == x.by_size.end()) {
          std::printf("  %24s", "-");
          continue;
        }
        const double busbw =
            static_cast<double>(bytes) / it->second.seconds / 1e9 * it->second.factor;
        std::printf("  %13.1f | %8.3f", it->second.seconds * 1e6, busbw);
      }
      std::printf("\n");
    }
  }
}

// `peer`: the row is another library's (MPI's, Gloo's), marked for plot.py with a counter.
[[maybe_unused]] void report(benchmark::State& state, double seconds, std::int64_t bytes,
                             double factor, bool peer = false) {
  state.SetIterationTime(seconds);
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  state.counters["time_us"] = seconds * 1e6;
  state.counters["algbw_GBps"] = algbw;
  state.counters["busbw_GBps"] = algbw * factor;
  if (peer) state.counters["peer"] = 1;
}

// Reports nothing: the ranks other than 0 run the MPI benchmarks silently.
class silent_reporter : public benchmark::BenchmarkReporter {
public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

// Counts at which every peer is checked: 1, fewer than p, non-multiples of p and of Gloo's
// chunking (256 elements, 2p chunks), and a few MiB.
constexpr std::size_t check_counts[] = {
    1, 3, 255, 1031, (std::size_t{1} << 18) + 5, std::size_t{1} << 20};

// Threaded rows (weft's local ones, Gloo's, the references) run on rank 0 alone; the other
// ranks pass through and wait for it, sleeping.
bool on_rank0 = true;

template <class Body>
void rank0_only(benchmark::State& state, Body&& body) {
  if (on_rank0) {
    body();
  } else {
    for (auto _ : state)
      state.SetIterationTime(1e-9);
  }
#if WEFT_PEERS_MPI
  // The others wait here, waking rarely: at the 200 us of the MPI rows' barrier their wake-ups
  // slowed rank 0's 4 KiB all-reduce on 2 cores by half.
  weft::bench::mpi_peer::polite_barrier(MPI_COMM_WORLD, std::chrono::milliseconds(20));
#endif
}

#if WEFT_BENCH_HAVE_GLOO
namespace gloo = weft::bench::gloo;

std::unique_ptr<gloo::gloo_group> gloo_world;

bool check_gloo() {
  bool ok = true;
  for (gloo::algorithm a : gloo::all_algorithms) {
    for (std::size_t count : check_counts) {
      const std::size_t wrong = gloo_world->count_wrong_all_reduce(a, count);
      if (wrong != 0) {
        std::fprintf(stderr,
                     "peers: Gloo %s all-reduce of %zu floats on %d ranks: %zu elements wrong\n",
                     std::string(gloo::name(a)).c_str(), count, gloo_world->size(), wrong);
        ok = false;
      }
    }
  }
  return ok;
}

// Registered on every rank (the same benchmark list everywhere, so a filter selects the same
// MPI benchmarks on all of them); only rank 0 has a gloo_world.
void add_gloo(int p) {
  for (gloo::algorithm a : gloo::all_algorithms) {
    const std::string name =
        "all_reduce/gloo" + std::to_string(p) + "/" + std::string(gloo::name(a));
    benchmark::RegisterBenchmark(name.c_str(), [a, p](benchmark::State& state) {
      const std::int64_t bytes = state.range(0);
      const auto count = static_cast<std::size_t>(bytes) / sizeof(float);
      const double factor = p > 1 ? 2.0 * (p - 1) / p : 1.0;
      // Only rank 0 runs Gloo, as it runs weft's local rows.
      rank0_only(state, [&] {
        for (auto _ : state) {
          const double s =
              gloo_world->time_all_reduce(a, count, iterations_for(bytes), repetitions);
          report(state, s, bytes, factor, true);
          record("all_reduce", "gloo" + std::to_string(p) + "/" + std::string(gloo::name(a)), bytes,
                 {s, factor});
        }
      });
    })->Apply([](benchmark::internal::Benchmark* b) { apply_sizes(b, 4); });
  }
}
#endif

#if WEFT_PEERS_MPI
namespace mpi_peer = weft::bench::mpi_peer;

bool check_mpi(MPI_Comm comm) {
  bool ok = true;
  int rank = 0;
  int p = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &p);
  for (auto op : {mpi_peer::operation::all_reduce, mpi_peer::operation::reduce_scatter,
                  mpi_peer::operation::all_gather}) {
    for (std::size_t count : check_counts) {
      const long long wrong = mpi_peer::count_wrong(op, comm, count);
      if (wrong != 0) {
        if (rank == 0) {
          std::fprintf(stderr,
                       "peers: %s of %zu floats per rank on %d ranks: %lld elements wrong\n",
                       std::string(mpi_peer::name(op)).c_str(), count, p, wrong);
        }
        ok = false;
      }
    }
  }
  return ok;
}

void add_mpi(MPI_Comm comm) {
  int p = 1;
  MPI_Comm_size(comm, &p);
  struct entry {
    mpi_peer::operation op;
    const char* collective;
  };
  for (entry e : {entry{mpi_peer::operation::all_reduce, "all_reduce"},
                  entry{mpi_peer::operation::reduce_scatter, "reduce_scatter"},
                  entry{mpi_peer::operation::all_gather, "all_gather"}}) {
    const std::string name = std::string(e.collective) + "/mpi" + std::to_string(p) + "/" +
                             std::string(mpi_peer::name(e.op));
    // The size is the larger buffer; reduce-scatter and all-gather need at least one float per
    // rank.
    const std::int64_t per_rank_divisor = e.op == mpi_peer::operation::all_reduce ? 1 : p;
    auto* b = benchmark::RegisterBenchmark(name.c_str(), [e, p, comm, per_rank_divisor](
                                                             benchmark::State& state) {
      const std::int64_t bytes = state.range(0);
      const auto count = static_cast<std::size_t>(bytes / per_rank_divisor) / sizeof(float);
      for (auto _ : state) {
        const double s =
            mpi_peer::time_operation(e.op, comm, count, iterations_for(bytes), repetitions);
        report(state, s, bytes, mpi_peer::bus_factor(e.op, p), true);
        record(e.collective, "mpi" + std::to_string(p) + "/" + std::string(mpi_peer::name(e.op)),
               bytes, {s, mpi_peer::bus_factor(e.op, p)});
      }
    });
    apply_sizes(b, per_rank_divisor * static_cast<std::int64_t>(sizeof(float)));
  }
  // The nonblocking all-reduce that weft's mpi4/vendor rows call (MPI_Iallreduce, then
  // MPI_Wait here where weft polls MPI_Test under its deadline): Open MPI runs it through
  // another component (libnbc) than its blocking MPI_Allreduce.
  const std::string series = "mpi" + std::to_string(p) + "/MPI_Iallreduce";
  auto* b = benchmark::RegisterBenchmark(
      ("all_reduce/" + series).c_str(), [p, comm, series](benchmark::State& state) {
        const std::int64_t bytes = state.range(0);
        const auto count = static_cast<int>(static_cast<std::size_t>(bytes) / sizeof(float));
        std::vector<float> in(static_cast<std::size_t>(count), 1.0f), out(in.size());
        for (auto _ : state) {
          const double s = mpi_peer::time_calls(comm, iterations_for(bytes), repetitions, [&] {
            MPI_Request r = MPI_REQUEST_NULL;
            WEFT_MPI_TRY(MPI_Iallreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, comm, &r),
                         "MPI_Iallreduce");
            WEFT_MPI_TRY(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
          });
          report(state, s, bytes, mpi_peer::bus_factor(mpi_peer::operation::all_reduce, p), true);
          record("all_reduce", series, bytes,
                 {s, mpi_peer::bus_factor(mpi_peer::operation::all_reduce, p)});
        }
      });
  apply_sizes(b, static_cast<std::int64_t>(sizeof(float)));
}
#endif

// weft's rows.

// `variant` names the row's options beside the algorithm ("_model").
template <class Algo>
void add_local(int p, const weft::local::options& opt = {}, std::string_view variant = {}) {
  if constexpr (Algo::serves(weft::collective::all_reduce)) {
    const std::string series =
        "local" + std::to_string(p) + "/" + std::string(Algo::name) + std::string(variant);
    benchmark::RegisterBenchmark(("all_reduce/" + series).c_str(), [p, series,
                                                                    opt](benchmark::State& state) {
      rank0_only(state, [&] {
        const auto bytes = static_cast<std::size_t>(state.range(0));
        weft::bench::run_local_case<weft::collective::all_reduce, Algo>(
            state, weft::topology::host(p), opt, bytes);
        const double s = state.counters["time_us"] * 1e-6;
        state.counters["of_bound"] = weft::bench::of_bound(p, bytes, s);
        record("all_reduce", series, static_cast<std::int64_t>(bytes),
               {s, weft::bench::bus_factor_all_reduce(p)});
      });
    })->Apply([](benchmark::internal::Benchmark* b) { apply_sizes(b, 4); });
  }
}

void add_references() {
  benchmark::RegisterBenchmark("stream_add", [](benchmark::State& state) {
    rank0_only(state, [&] { weft::bench::stream_add_row(state); });
  })->Iterations(1);
  benchmark::RegisterBenchmark("memcpy", [](benchmark::State& state) {
    rank0_only(state, [&] { weft::bench::memcpy_row(state); });
  })->Apply([](benchmark::internal::Benchmark* b) { apply_sizes(b, 1); });
}

#if WEFT_PEERS_MPI
weft::mpi::communicator* mpi_world = nullptr;
weft::mpi::communicator* mpi_measured = nullptr; // with options::measured_automatic

// `comm`: the communicator the row runs on; `variant` names its options beside the algorithm.
template <weft::collective C, class Algo>
void add_weft_mpi(weft::mpi::communicator** comm = &mpi_world, std::string_view variant = {}) {
  if constexpr (Algo::serves(C)) {
    const int p = mpi_world->size();
    const std::string series =
        "mpi" + std::to_string(p) + "/" + std::string(Algo::name) + std::string(variant);
    constexpr bool blocks = C == weft::collective::reduce_scatter ||
                            C == weft::collective::all_gather || C == weft::collective::all_to_all;
    benchmark::RegisterBenchmark(
        (std::string(weft::name_of(C)) + "/" + series).c_str(),
        [p, series, comm](benchmark::State& state) {
          auto& c = **comm;
          const std::int64_t bytes = state.range(0);
          const std::size_t count =
              weft::bench::count_for(C, static_cast<std::size_t>(bytes), p, sizeof(float));
          const auto [in_n, out_n] = weft::bench::buffer_sizes(C, count, p);
          std::vector<float> in(in_n, 1.0f), out(out_n, 1.0f);
          for (auto _ : state) {
            const double s = mpi_peer::time_calls(
                c.native(), iterations_for(bytes), repetitions,
                [&] { weft::bench::call<C, Algo>(c, std::span<const float>(in), std::span(out)); });
            report(state, s, bytes, weft::bench::bus_factor(C, p));
            if constexpr (std::is_same_v<Algo, weft::algo::vendor>) {
              state.SetLabel("MPI's own"); // no plan of weft's to price
            } else if (std::is_same_v<Algo, weft::algo::automatic> && c.measures_automatic()) {
              // Measured by the timed calls' first: every rank asks, as every rank calls.
              const auto chosen = weft::automatic_choice<C, float>(c, count);
              state.counters["measured_us"] =
                  (chosen.vendor ? *chosen.vendor_seconds : chosen.plan_seconds) * 1e6;
              state.SetLabel(std::string(chosen.name()));
            } else {
              const auto model = weft::bench::predict<C, Algo>(c, count, sizeof(float));
              state.counters["model_us"] = model.seconds * 1e6;
              state.SetLabel(std::string(model.algorithm));
            }
            if (C == weft::collective::all_reduce) {
              record("all_reduce", series, bytes, {s, weft::bench::bus_factor(C, p)});
            }
          }
        })
        ->Apply([](benchmark::internal::Benchmark* b) {
          apply_sizes(b,
                      static_cast<std::int64_t>(sizeof(float)) * (blocks ? mpi_world->size() : 1));
        });
  }
}

template <weft::collective C>
void add_weft_mpi_all() {
  namespace algo = weft::algo;
  add_weft_mpi<C, algo::ring>();
  add_weft_mpi<C, algo::tree>();
  add_weft_mpi<C, algo::halving_doubling>();
  add_weft_mpi<C, algo::recursive_doubling>();
  add_weft_mpi<C, algo::pairwise>();
  add_weft_mpi<C, algo::hierarchical<algo::ring, algo::ring>>();
  add_weft_mpi<C, algo::hierarchical<algo::ring, algo::tree>>();
  add_weft_mpi<C, algo::automatic>();
  add_weft_mpi<C, algo::vendor>();
  add_weft_mpi<C, algo::automatic>(&mpi_measured, "_measured");
}
#endif

// Drops `flag` from the arguments; whether it was there.
bool take_flag(std::vector<char*>& args, const char* flag) {
  const auto it = std::remove_if(args.begin() + 1, args.end(),
                                 [&](const char* a) { return std::strcmp(a, flag) == 0; });
  const bool found = it != args.end();
  args.erase(it, args.end());
  return found;
}

int run(std::vector<char*>& args, int rank, [[maybe_unused]] int size) {
  const bool check_only = take_flag(args, "--check_only");
  int argc = static_cast<int>(args.size());
  benchmark::Initialize(&argc, args.data());
  // Read before the checks and the registrations: every rank sees the same WEFT_BENCH_SIZES, so
  // all of them stop here, and none of them in std::terminate or MPI_Abort.
  try {
    sizes();
  } catch (const weft::error& e) {
    if (rank == 0) std::fprintf(stderr, "peers: %s\n", e.what());
    return 2;
  }
  bool ok = true;
#if WEFT_PEERS_MPI
  ok = check_mpi(MPI_COMM_WORLD) && ok;
#endif
#if WEFT_BENCH_HAVE_GLOO
  // As many Gloo ranks as MPI ranks, so gloo4 and mpi4 are compared; all of them threads of rank 0.
  const int gloo_ranks = WEFT_PEERS_MPI ? size : 4;
  int gloo_ok = 1;
  if (rank == 0) {
    gloo_world = std::make_unique<gloo::gloo_group>(gloo_ranks);
    gloo_ok = check_gloo() ? 1 : 0;
  }
#if WEFT_PEERS_MPI
  mpi_peer::polite_barrier(MPI_COMM_WORLD);
  MPI_Bcast(&gloo_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
#endif
  ok = ok && gloo_ok != 0;
#else
  if (rank == 0)
    std::fprintf(stderr, "peers: built without Gloo (libgloo-dev not found): no Gloo benchmarks\n");
#endif
  if (!ok) {
    if (rank == 0)
      std::fprintf(stderr, "peers: a peer library gave a wrong answer; no benchmarks run\n");
    return 1;
  }
  if (rank == 0)
    std::printf("peers: every peer's result checked against a plain loop: all right\n");
  if (check_only) return 0;

  on_rank0 = rank == 0;
  const int local_ranks = WEFT_PEERS_MPI ? size : 4; // local4 beside mpi4 and gloo4
  // Order matters on a small machine: rank 0's threaded rows run before weft's MPI rows,
  // after which (for reasons not found) a 4 KiB local all-reduce on 2 cores ran 2x slower.
#if WEFT_PEERS_MPI
  auto world = weft::mpi::world();
  mpi_world = &world;
  weft::mpi::options measured_options;
  measured_options.measured_automatic = weft::mpi::measured_automatic();
  auto measured = weft::mpi::world(measured_options);
  mpi_measured = &measured;
  add_mpi(MPI_COMM_WORLD);
#endif
  namespace algo = weft::algo;
  add_local<algo::ring>(local_ranks);
  add_local<algo::tree>(local_ranks);
  add_local<algo::halving_doubling>(local_ranks);
  add_local<algo::recursive_doubling>(local_ranks);
  add_local<algo::direct>(local_ranks);
  add_local<algo::automatic>(local_ranks);
  add_local<algo::automatic>(local_ranks, {.automatic = weft::local::automatic_prices::model},
                             "_model");
#if WEFT_BENCH_HAVE_GLOO
  add_gloo(gloo_ranks);
#endif
  add_references();
#if WEFT_PEERS_MPI
  add_weft_mpi_all<weft::collective::all_reduce>();
  add_weft_mpi_all<weft::collective::reduce_scatter>();
  add_weft_mpi_all<weft::collective::all_gather>();
  add_weft_mpi_all<weft::collective::broadcast>();
  add_weft_mpi_all<weft::collective::reduce>();
  add_weft_mpi_all<weft::collective::all_to_all>();
#endif
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
    print_summary();
  } else {
    silent_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
#if WEFT_PEERS_MPI
  mpi_peer::polite_barrier(MPI_COMM_WORLD);
  mpi_world = nullptr;
#endif
#if WEFT_BENCH_HAVE_GLOO
  gloo_world.reset();
#endif
  benchmark::Shutdown();
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
#if WEFT_PEERS_MPI
  weft::mpi::environment env(argc, argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Only rank 0 may write --benchmark_out's file; the others would truncate it.
  args.assign(argv, argv + argc);
  if (rank != 0) {
    args.erase(
        std::remove_if(args.begin() + 1, args.end(),
                       [](const char* a) { return std::strncmp(a, "--benchmark_out", 15) == 0; }),
        args.end());
  }
  try {
    return run(args, rank, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peers: rank %d: %s\n", rank, e.what());
    env.abort(1);
  }
  return 1;
#else
  try {
    return run(args, 0, 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "peers: %s\n", e.what());
    return 1;
  }
#endif
}
