// What the fabric does, on one machine: the local transport with emulated links
// (local::options::emulate_links) paces every transfer at a cluster's figures, and each row
// prints the cost model's prediction for the same plans beside the measurement.
//
//   flat vs topology-aware all-reduce on 2 and 4 emulated nodes of 8 ranks in all;
//   a 4-rank tensor-parallel group inside one node vs spread across nodes;
//   reduce-scatter and all-gather on 2x4: flat ring vs hierarchical<ring, ring> (over rails) vs
//   weft::two_level, whose even-node path
//   (one call per level, levels<ring, ring>) is priced as its two calls, and whose rank-block
//   path (levels<ring, tree>: tree plans neither collective) is timed unpriced.
//
//   build/benchmarks/comm_emulated_bench --benchmark_counters_tabular=true
// The links are WEFT_EMULATED_LINKS (default below) appended to each shape, the sizes
// WEFT_BENCH_SIZES (default 64K:64M:4).
#include <weft/comm/two_level.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/sizes.hpp"
#include "support/suite.hpp"

namespace {

using weft::collective;
namespace algo = weft::algo;

std::string links() {
  const char* env = std::getenv("WEFT_EMULATED_LINKS");
  return env != nullptr ? env : "intra=shm:1GB/s:5us,inter=net:0.25GB/s:20us";
}

// The model's reduce bandwidth is what this machine gives each of 8 ranks reducing at once.
double reduce_bandwidth() {
  static const double bw = [] {
    const double b = weft::bench::reduce_bandwidth_per_rank(8);
    // On stderr: stdout may be --benchmark_format=json, which a line here would break.
    std::fprintf(stderr, "# reduce bandwidth per rank, 8 ranks at once: %.2f GB/s\n", b / 1e9);
    return b;
  }();
  return bw;
}

std::string reduce_figure() {
  return ",reduce=" + std::to_string(reduce_bandwidth() / 1e6) + "MB/s";
}

weft::topology::cluster shape(const char* s) {
  return weft::topology::parse(std::string(s) + "," + links() + reduce_figure());
}

constexpr weft::local::options emulated{.emulate_links = true};

// Tensor-parallel all-reduces of 4 ranks on a 2x4 cluster, both groups at once: the groups of
// mesh<tp<4>, dp<2>> (ranks 0-3 and 4-7, each inside a node) vs those of mesh<dp<2>, tp<4>>
// (ranks 0, 2, 4, 6 and 1, 3, 5, 7, each across both nodes, sharing their NICs). The model
// prices both groups together, as they run.
template <bool across>
void tp_group(benchmark::State& state) {
  const auto cluster = shape("2x4");
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t count = bytes / sizeof(float);
  double seconds = 0;
  weft::bench::prediction model;
  for (auto _ : state) {
    weft::local::run(
        cluster,
        [&](weft::local::communicator& world) {
          const int color = across ? world.rank() % 2 : world.rank() / 4;
          auto tp = world.split(color, world.rank());
          std::vector<float> in(count, 1.0f), out(count);
          const double t = weft::bench::time_collective(
              world, [&] { weft::all_reduce(tp, std::span<const float>(in), std::span(out)); },
              0.1);
          if (world.rank() == 0) {
            seconds = t;
            std::vector<std::vector<int>> groups(2);
            for (int w = 0; w < world.size(); ++w)
              groups[static_cast<std::size_t>(across ? w % 2 : w / 4)].push_back(w);
            model = weft::bench::predict_concurrent<collective::all_reduce, algo::automatic>(
                groups, cluster, count, sizeof(float));
          }
        },
        emulated);
    state.SetIterationTime(seconds);
  }
  weft::bench::set_counters(state, bytes, seconds, weft::bench::bus_factor_all_reduce(4), model);
}

// reduce_scatter or all_gather (C) through make_two_level(world) on 2x4, with Algo =
// levels<IntraAlgo, InterAlgo>. Where both levels plan C, two_level makes one call per level,
// and the model prices those two: Intra's over the N blocks of a local index on every node at
// once, then Inter's over one block on every local index at once, plus the local-major copy of
// all p blocks: memory traffic at the measured reduce bandwidth, whose kernel moves three
// streams per element (two reads, a write) where a copy moves two.
template <collective C, class Algo>
void two_level_case(benchmark::State& state) {
  const auto cluster = shape("2x4");
  const int p = cluster.size();
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t n = weft::bench::count_for(C, bytes, p, sizeof(float));
  const auto [in_n, out_n] = weft::bench::buffer_sizes(C, n, p);
  double seconds = 0;
  weft::bench::prediction model{0, Algo::name};
  constexpr bool two_calls = (C == collective::reduce_scatter || C == collective::all_gather) &&
                             Algo::intra::serves(C) && Algo::inter::serves(C);
  for (auto _ : state) {
    weft::local::run(
        cluster,
        [&](weft::local::communicator& world) {
          auto tl = weft::make_two_level(world);
          std::vector<float> in(in_n, 1.0f), out(out_n);
          const double t = weft::bench::time_collective(
              world,
              [&] { weft::bench::call<C, Algo>(tl, std::span<const float>(in), std::span(out)); },
              0.1);
          if (world.rank() != 0) return;
          seconds = t;
          if constexpr (two_calls) {
            std::vector<std::vector<int>> nodes(2), locals(4);
            for (int w = 0; w < p; ++w) {
              nodes[static_cast<std::size_t>(w / 4)].push_back(w);
              locals[static_cast<std::size_t>(w % 4)].push_back(w);
            }
            const auto intra =
                weft::bench::predict_concurrent<C, typename Algo::intra>(nodes, cluster, 2 * n, 4);
            const auto inter =
                weft::bench::predict_concurrent<C, typename Algo::inter>(locals, cluster, n, 4);
            const double copy = static_cast<double>(in_n > out_n ? in_n : out_n) * sizeof(float) /
                                (1.5 * reduce_bandwidth());
            model.seconds = intra.seconds + inter.seconds + copy;
          }
        },
        emulated);
    state.SetIterationTime(seconds);
  }
  weft::bench::set_counters(state, bytes, seconds, weft::bench::bus_factor(C, p), model);
}

const std::vector<std::int64_t>& size_range() {
  static const auto range = weft::bench::sizes_from_env("64K:64M:4");
  return range;
}

void sizes(benchmark::internal::Benchmark* b) { weft::bench::apply_sizes(b, size_range()); }

template <class Algo>
void add(const char* nodes) {
  const std::string name =
      "all_reduce/local8@" + std::string(nodes) + "/" + std::string(Algo::name);
  benchmark::RegisterBenchmark(name.c_str(), [nodes](benchmark::State& state) {
    weft::bench::run_local_case<collective::all_reduce, Algo>(
        state, shape(nodes), emulated, static_cast<std::size_t>(state.range(0)), 0.1);
  })->Apply(sizes);
}

// C through two_level on 2x4, levels<IntraAlgo, InterAlgo>.
template <collective C, class IntraAlgo, class InterAlgo>
void add_two_level() {
  const std::string name = std::string(weft::name_of(C)) + "/local8@2x4/two_level<" +
                           std::string(IntraAlgo::name) + ", " + std::string(InterAlgo::name) + ">";
  benchmark::RegisterBenchmark(name.c_str(), two_level_case<C, algo::levels<IntraAlgo, InterAlgo>>)
      ->Apply(sizes);
}

// C by Algo on 2x4, as "<C>/local8@2x4/<Algo>".
template <collective C, class Algo>
void add_2x4() {
  const std::string name = std::string(weft::name_of(C)) + "/local8@2x4/" + std::string(Algo::name);
  benchmark::RegisterBenchmark(name.c_str(), [](benchmark::State& state) {
    weft::bench::run_local_case<C, Algo>(state, shape("2x4"), emulated,
                                         static_cast<std::size_t>(state.range(0)), 0.1);
  })->Apply(sizes);
}

using hier = algo::hierarchical<algo::ring, algo::ring>;

// C on 2x4: the flat ring, hierarchical<ring, ring> over rails (each local index crosses on its
// own: with nics=4 in WEFT_EMULATED_LINKS, on its own NIC), and two_level with ring at both
// levels (the even-node path) and with tree across (which plans neither collective: the
// rank-block path).
template <collective C>
void for_scatter_and_gather() {
  add_2x4<C, algo::ring>();
  add_2x4<C, hier>();
  add_two_level<C, algo::ring, algo::ring>();
  add_two_level<C, algo::ring, algo::tree>();
}

// broadcast and reduce from rank 0 on 2x4: the flat ring, hierarchical<ring, ring> and two_level.
template <collective C>
void for_rooted() {
  add_2x4<C, algo::ring>();
  add_2x4<C, hier>();
  add_two_level<C, algo::ring, algo::ring>();
}

} // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Both read before any benchmark runs: a bad value thrown from a registration or a row would
  // end the program in std::terminate, after some rows had run.
  try {
    size_range();
  } catch (const weft::error& e) {
    std::fprintf(stderr, "comm_emulated_bench: %s\n", e.what());
    return 2;
  }
  try {
    (void)weft::topology::parse("2x4," + links());
  } catch (const weft::error& e) {
    std::fprintf(stderr, "comm_emulated_bench: WEFT_EMULATED_LINKS=\"%s\": %s\n", links().c_str(),
                 e.what());
    return 2;
  }
  for (const char* nodes : {"2x4", "4x2"}) {
    add<algo::ring>(nodes);
    add<algo::tree>(nodes);
    add<algo::halving_doubling>(nodes);
    add<algo::hierarchical<algo::ring, algo::ring>>(nodes);
    add<algo::hierarchical<algo::ring, algo::tree>>(nodes);
    add<algo::automatic>(nodes);
  }
  for_scatter_and_gather<collective::reduce_scatter>();
  for_scatter_and_gather<collective::all_gather>();
  add_two_level<collective::all_reduce, algo::ring, algo::ring>();
  for_rooted<collective::broadcast>();
  for_rooted<collective::reduce>();
  benchmark::RegisterBenchmark("all_reduce/tp4@2x4/inside_a_node", tp_group<false>)->Apply(sizes);
  benchmark::RegisterBenchmark("all_reduce/tp4@2x4/across_nodes", tp_group<true>)->Apply(sizes);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
