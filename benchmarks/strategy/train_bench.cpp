// The 3D trainer (weft::strategy) on the demo's layout (samples/07_train_3d): a GPT of vocabulary
// 1000, hidden 256, 8 heads, sequence 64, 4 layers; global batch 16 in microbatches of 2; TP 2 x
// PP 2 x DP 2 on 8 in-process ranks (threads, under weft::traced as in the demo), interleaved
// schedule of 2 chunks, AdamW. Rows, each with the median step as its time:
//
//   demo/zero1           the demo exactly (zero<1>, selective recompute)
//   demo/zero3           the same at zero<3> (prefetch at its default), in turns with zero<1> in
//                        the same run: the cost of gathering beside it
//   demo/zero3/prefetch:0  the same with no unit gathered ahead (config.prefetch = 0)
//   recompute/none       the demo at zero<1> with each recompute policy, the three in turns:
//   recompute/selective  activation memory per rank and step time, against none
//   recompute/full
//
//   build/benchmarks/strategy_train_bench --benchmark_counters_tabular=true
//
// A step is timed on rank 0 from a barrier of all 8 ranks to the next one after train_step: the
// slowest rank's step. Each training run makes a trainer, takes one step of warm-up, then times
// `steps` more; tokens_per_s = global_batch x seq / the median step (best_tokens_per_s: / the
// fastest, what a step takes when no other process has the cores). Memory counters (KiB, peaks in
// the last step, from trainer->memory(); absent with headers that lack it): param, the most
// parameter bytes any rank held (peak_parameters(): weights + gathered_weights); act_max and
// act_rank0, the activations the microbatches in flight keep for their backward, the most any
// rank held and rank 0's. dp_gather_MiB: what rank 0's all-gathers over the DP axis returned per
// step, warm-up included (traced spans: zero<1> gathers the updated parameters, zero<3> each unit
// before its use).
//
// 8 ranks share this machine's cores; each does its GEMMs on one BLAS thread (layer/cblas.hpp).
// The figures mean something on an otherwise idle machine only.
// WEFT_BENCH_TRAIN=small: a tiny model and two steps a run (a smoke test of the program).
// The file compiles against headers without trainer->memory() or strategy_config::prefetch too
// (benchmarks/strategy/before_after.sh builds it against an older revision's).
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/strategy.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using world_type = weft::traced<weft::local::communicator>;
using mesh_3d = weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>;
template <class Sharding, class Recompute>
using demo_strategy = weft::strategy<mesh_3d, weft::pipeline::interleaved<2>, Sharding, Recompute>;

using zero1 = weft::optim::zero<1>;
using zero3 = weft::optim::zero<3>;
using weft::layer::recompute::full;
using weft::layer::recompute::none;
using weft::layer::recompute::selective;

constexpr weft::optim::adamw rule{
    .lr = 2e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};

struct setup {
  weft::layer::gpt_shape model;
  std::size_t global_batch;
  int steps;         // timed steps per training run, after one of warm-up
  int rounds;        // training runs per row (rows that alternate: per policy)
  int prefetch = -1; // zero<3>'s config.prefetch; -1: its default
};

setup chosen() {
  const char* v = std::getenv("WEFT_BENCH_TRAIN");
  if (v != nullptr && std::strcmp(v, "small") == 0) {
    return {{.vocab = 64, .hidden = 32, .heads = 4, .ffn = 0, .seq = 16, .layers = 4}, 16, 2, 1};
  }
  return {{.vocab = 1000, .hidden = 256, .heads = 8, .ffn = 0, .seq = 64, .layers = 4}, 16, 8, 3};
}

struct batch {
  std::vector<std::int32_t> ids, targets;
};

// The demo's data: each sequence counts up through the vocabulary by a stride of 1 to 8.
batch batch_of(const setup& cfg, int step) {
  batch b;
  std::uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(step + 1);
  for (std::size_t q = 0; q < cfg.global_batch; ++q) {
    s ^= s >> 29;
    s *= 0xBF58476D1CE4E5B9ull;
    s ^= s >> 32;
    const std::uint64_t start = s % cfg.model.vocab;
    const std::uint64_t stride = 1 + (s >> 20) % 8;
    for (std::size_t t = 0; t <= cfg.model.seq; ++t) {
      const auto id = static_cast<std::int32_t>((start + stride * t) % cfg.model.vocab);
      if (t < cfg.model.seq) b.ids.push_back(id);
      if (t > 0) b.targets.push_back(id);
    }
  }
  return b;
}

// The headers' strategy_config has zero<3>'s prefetch.
template <class Config>
concept has_prefetch = requires(Config c) {
  c.prefetch = 0;
};

// One rank's memory in the last step, bytes (trainer->memory()'s peaks).
struct rank_memory {
  std::size_t parameters = 0, gathered = 0, activations = 0;
};

// What one training run measured.
struct run_result {
  std::vector<double> step_seconds; // the timed steps
  double last_loss = 0;
  double dp_gather_bytes = 0; // rank 0's, per timed step
  bool has_memory = false;    // the headers have trainer->memory()
  std::vector<rank_memory> memory;
};

template <class S>
run_result train(const setup& cfg) {
  run_result out;
  out.memory.resize(static_cast<std::size_t>(S::size));
  std::vector<batch> batches;
  for (int s = 0; s <= cfg.steps; ++s)
    batches.push_back(batch_of(cfg, s));
  weft::local::options opt;
  opt.timeout = std::chrono::minutes(10);
  weft::local::run(
      S::size,
      [&](weft::local::communicator& c) {
        world_type world(std::move(c), "world");
        const bool lead = world.rank() == 0;
        typename S::config config{
            .model = cfg.model, .micro_batch = 2, .global_batch = cfg.global_batch, .seed = 7};
        if constexpr (has_prefetch<typename S::config>) {
          if (cfg.prefetch >= 0) config.prefetch = cfg.prefetch;
        }
        auto trainer = S::make(world, config, rule);
        world.barrier();
        world.clear_spans();
        for (int s = 0; s <= cfg.steps; ++s) { // step 0: warm-up
          const auto& b = batches[static_cast<std::size_t>(s)];
          world.barrier();
          const auto t0 = std::chrono::steady_clock::now();
          const double loss = trainer->train_step(b.ids, b.targets);
          world.barrier();
          const double took =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (lead && s > 0) out.step_seconds.push_back(took);
          if (lead) out.last_loss = loss;
        }
        if constexpr (requires { trainer->memory(); }) {
          const auto m = trainer->memory();
          out.memory[static_cast<std::size_t>(world.rank())] = {
              m.peak_parameters(), m.gathered_weights.peak, m.activations.peak};
          if (lead) out.has_memory = true;
        }
        // A step's collectives may end on the optimizer's progress thread after train_step
        // returns: the spans are read once the trainer (its thread) is gone, over every step.
        trainer.reset();
        if (lead) {
          double bytes = 0;
          for (const auto& span : world.spans()) {
            if (span.axis == "dp" && span.what == "all_gather")
              bytes += static_cast<double>(span.bytes);
          }
          out.dp_gather_bytes = bytes / (cfg.steps + 1);
        }
      },
      opt);
  return out;
}

// Every run of one configuration in a row.
struct measured {
  std::vector<double> step_seconds;
  double last_loss = 0;
  run_result last;
  void add(run_result r) {
    step_seconds.insert(step_seconds.end(), r.step_seconds.begin(), r.step_seconds.end());
    last_loss = r.last_loss;
    last = std::move(r);
  }
  [[nodiscard]] double median() const {
    std::vector<double> t = step_seconds;
    std::sort(t.begin(), t.end());
    return t.empty() ? 0.0 : t[t.size() / 2];
  }
  [[nodiscard]] double fastest() const {
    return step_seconds.empty() ? 0.0 : *std::min_element(step_seconds.begin(), step_seconds.end());
  }
  [[nodiscard]] double tokens_per_s(const setup& cfg) const {
    return static_cast<double>(cfg.global_batch * cfg.model.seq) / median();
  }
  [[nodiscard]] std::size_t most(std::size_t rank_memory::*field) const {
    std::size_t m = 0;
    for (const auto& r : last.memory)
      m = std::max(m, r.*field);
    return m;
  }
};

constexpr double kib = 1024.0;

// The losses of the configurations a row compares: the same model and data, so one run's last
// loss sits within float reordering of another's. A broken configuration shows here first.
bool same_loss(benchmark::State& state, double a, double b) {
  if (std::isfinite(a) && std::isfinite(b) && std::abs(a - b) <= 1e-4 * std::abs(a)) return true;
  state.SkipWithError(
      ("the losses differ: " + std::to_string(a) + " and " + std::to_string(b)).c_str());
  return false;
}

void report(benchmark::State& state, const setup& cfg, const measured& m) {
  state.SetIterationTime(m.median());
  state.counters["tokens_per_s"] = m.tokens_per_s(cfg);
  state.counters["best_tokens_per_s"] =
      static_cast<double>(cfg.global_batch * cfg.model.seq) / m.fastest();
  state.counters["steps"] = static_cast<double>(m.step_seconds.size());
  state.counters["loss"] = m.last_loss;
  state.counters["dp_gather_MiB"] = m.last.dp_gather_bytes / (1 << 20);
  if (m.last.has_memory) {
    state.counters["param_KiB"] = static_cast<double>(m.most(&rank_memory::parameters)) / kib;
    state.counters["act_max_KiB"] = static_cast<double>(m.most(&rank_memory::activations)) / kib;
    state.counters["act_rank0_KiB"] = static_cast<double>(m.last.memory[0].activations) / kib;
  }
}

void demo_zero1(benchmark::State& state) {
  const setup cfg = chosen();
  measured m;
  for (auto _ : state) {
    for (int r = 0; r < cfg.rounds; ++r)
      m.add(train<demo_strategy<zero1, selective>>(cfg));
  }
  if (!std::isfinite(m.last_loss)) state.SkipWithError("the loss is not finite");
  report(state, cfg, m);
}

// zero<3> with zero<1> beside it, in turns (which goes first alternates by round).
template <int Prefetch>
void demo_zero3(benchmark::State& state) {
  if constexpr (Prefetch >= 0 && !has_prefetch<weft::strategy_config>) {
    for (auto _ : state) {
    }
    state.SkipWithError("these headers' strategy_config has no prefetch");
    return;
  }
  const setup cfg = chosen();
  setup cfg3 = cfg;
  cfg3.prefetch = Prefetch;
  measured one, three;
  for (auto _ : state) {
    for (int r = 0; r < cfg.rounds; ++r) {
      if (r % 2 == 0) one.add(train<demo_strategy<zero1, selective>>(cfg));
      three.add(train<demo_strategy<zero3, selective>>(cfg3));
      if (r % 2 != 0) one.add(train<demo_strategy<zero1, selective>>(cfg));
    }
  }
  if (!same_loss(state, one.last_loss, three.last_loss)) return;
  report(state, cfg, three);
  state.counters["zero1_tokens_per_s"] = one.tokens_per_s(cfg);
  state.counters["vs_zero1"] = three.tokens_per_s(cfg) / one.tokens_per_s(cfg);
  state.counters["zero1_dp_gather_MiB"] = one.last.dp_gather_bytes / (1 << 20);
  if (three.last.has_memory) {
    state.counters["zero1_param_KiB"] =
        static_cast<double>(one.most(&rank_memory::parameters)) / kib;
    state.counters["gathered_KiB"] = static_cast<double>(three.most(&rank_memory::gathered)) / kib;
  }
}

// The three policies, measured once for the three rows: in turns, the order rotating by round.
struct recompute_runs {
  measured none, selective, full;
};

const recompute_runs& recompute_measured(const setup& cfg) {
  static const recompute_runs runs = [&] {
    recompute_runs r;
    using run_fn = run_result (*)(const setup&);
    const std::array<std::pair<measured*, run_fn>, 3> order{
        {{&r.none, &train<demo_strategy<zero1, none>>},
         {&r.selective, &train<demo_strategy<zero1, selective>>},
         {&r.full, &train<demo_strategy<zero1, full>>}}};
    for (int round = 0; round < cfg.rounds; ++round) {
      for (std::size_t k = 0; k < order.size(); ++k) {
        const auto& [into, fn] = order[(k + static_cast<std::size_t>(round)) % order.size()];
        into->add(fn(cfg));
      }
    }
    return r;
  }();
  return runs;
}

template <class Policy>
void recompute_row(benchmark::State& state) {
  const setup cfg = chosen();
  const recompute_runs* runs = nullptr;
  for (auto _ : state)
    runs = &recompute_measured(cfg);
  const measured& base = runs->none;
  const measured& m = std::is_same_v<Policy, none>        ? runs->none
                      : std::is_same_v<Policy, selective> ? runs->selective
                                                          : runs->full;
  if (!same_loss(state, base.last_loss, m.last_loss)) return;
  report(state, cfg, m);
  state.counters["time_cost_pct"] = 100.0 * (m.median() / base.median() - 1.0);
  if (m.last.has_memory) {
    const auto act = [](const measured& x) {
      return static_cast<double>(x.most(&rank_memory::activations));
    };
    state.counters["act_saved_pct"] = 100.0 * (1.0 - act(m) / act(base));
  }
}

BENCHMARK(demo_zero1)
    ->Name("demo/zero1")
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(demo_zero3<-1>)
    ->Name("demo/zero3")
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(demo_zero3<0>)
    ->Name("demo/zero3/prefetch:0")
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(recompute_row<none>)
    ->Name("recompute/none")
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(recompute_row<selective>)
    ->Name("recompute/selective")
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(recompute_row<full>)
    ->Name("recompute/full")
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();
