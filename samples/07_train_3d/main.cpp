// The main demo: a small GPT trained on 8 in-process ranks as TP2 x PP2 x DP2 with an interleaved
// pipeline schedule and ZeRO-1 (weft::strategy), next to the same model on one rank. It prints
// both losses per step (they match), tokens per second, what each axis communicated and how
// much of the step it took, and writes a Chrome trace of the last step (open it in
// https://ui.perfetto.dev or chrome://tracing).
//
//   build/samples/07_train_3d/weft_train_3d [--steps N] [--trace FILE]
//
// The data is generated here: each sequence counts up through the vocabulary by a stride of
// 1 to 8 from a random start, so the next token follows from the last two and the loss can
// fall from ln(vocabulary) towards zero.
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/strategy.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock;

using mesh_3d = weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>;
using strategy_3d = weft::strategy<mesh_3d, weft::pipeline::interleaved<2>, weft::optim::zero<1>,
                                   weft::layer::recompute::selective>;
using strategy_1 = weft::strategy<weft::mesh<weft::tp<1>, weft::pp<1>, weft::dp<1>>, weft::pipeline::one_f_one_b,
                                  weft::optim::zero<0>, weft::layer::recompute::selective>;

constexpr weft::layer::gpt_shape model{.vocab = 1000, .hidden = 256, .heads = 8, .ffn = 0, .seq = 64, .layers = 4};
constexpr std::size_t global_batch = 16;  // sequences per step
constexpr weft::optim::adamw rule{.lr = 2e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};

struct batch {
  std::vector<std::int32_t> ids, targets;
};

batch batch_of(int step) {
  batch b;
  std::uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(step + 1);
  for (std::size_t q = 0; q < global_batch; ++q) {
    s ^= s >> 29;
    s *= 0xBF58476D1CE4E5B9ull;
    s ^= s >> 32;
    const std::uint64_t start = s % model.vocab;
    const std::uint64_t stride = 1 + (s >> 20) % 8;
    for (std::size_t t = 0; t <= model.seq; ++t) {
      const auto id = static_cast<std::int32_t>((start + stride * t) % model.vocab);
      if (t < model.seq) b.ids.push_back(id);
      if (t > 0) b.targets.push_back(id);
    }
  }
  return b;
}

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

// What one rank saw in the last step.
struct rank_record {
  weft::mesh_coord coord;
  std::vector<strategy_3d::trainer<weft::optim::adamw, weft::traced<weft::local::communicator>>::span> compute;
  std::vector<weft::traced_span> comm;
  std::thread::id main_thread;
};

std::string json_escape_free(std::string_view s) { return std::string(s); }  // our names need no escapes

void write_trace(std::ostream& out, const std::vector<rank_record>& ranks) {
  clock_type::time_point t0 = clock_type::time_point::max();
  for (const auto& r : ranks) {
    for (const auto& s : r.compute) t0 = std::min(t0, s.begin);
    for (const auto& s : r.comm) t0 = std::min(t0, s.begin);
  }
  const auto us = [&](clock_type::time_point t) { return std::chrono::duration<double, std::micro>(t - t0).count(); };
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  const auto event = [&](std::size_t pid, int tid, std::string_view name, std::string_view cat, clock_type::time_point b,
                         clock_type::time_point e) {
    out << (first ? "" : ",\n") << "  {\"name\": \"" << json_escape_free(name) << "\", \"cat\": \"" << cat
        << "\", \"ph\": \"X\", \"pid\": " << pid << ", \"tid\": " << tid << ", \"ts\": " << us(b)
        << ", \"dur\": " << std::max(0.0, us(e) - us(b)) << "}";
    first = false;
  };
  const auto meta = [&](std::size_t pid, int tid, std::string_view what, const std::string& name) {
    out << (first ? "" : ",\n") << "  {\"name\": \"" << what << "\", \"ph\": \"M\", \"pid\": " << pid
        << ", \"tid\": " << tid << ", \"args\": {\"name\": \"" << name << "\"}}";
    first = false;
  };
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& c = ranks[r].coord;
    meta(r, 0, "process_name",
         "rank " + std::to_string(r) + " (tp " + std::to_string(c.tp) + ", pp " + std::to_string(c.pp) + ", dp " +
             std::to_string(c.dp) + ")");
    meta(r, 0, "thread_name", "compute");
    meta(r, 1, "thread_name", "communication");
    meta(r, 2, "thread_name", "optimizer progress thread");
    for (const auto& s : ranks[r].compute) event(r, 0, s.name, "compute", s.begin, s.end);
    for (const auto& s : ranks[r].comm) {
      const std::string name = s.axis + " " + std::string(s.what);
      event(r, s.thread == ranks[r].main_thread ? 1 : 2, name, s.axis, s.begin, s.end);
    }
  }
  out << "\n]}\n";
}

// --steps: a whole number from 1 up, else 0 ("abc", "2x", "-1"), which main refuses rather
// than train a step count nobody asked for.
int steps_of(std::string_view s) {
  int n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc{} || end != s.data() + s.size() || n < 1) return 0;
  return n;
}

} // namespace

int main(int argc, char** argv) try {
  int steps = 30;
  std::string trace_path = "weft_train_3d_trace.json";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      steps = steps_of(argv[++i]);
      if (steps == 0) {
        std::fprintf(stderr, "weft_train_3d: --steps takes a whole number from 1, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--trace" && i + 1 < argc) {
      trace_path = argv[++i];
    } else {
      std::printf("usage: %s [--steps N] [--trace FILE]\n", argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  // Opened before training, so that a path it cannot write fails now rather than after the run.
  std::ofstream trace(trace_path);
  if (!trace) {
    std::fprintf(stderr, "weft_train_3d: cannot write the trace to %s: %s\n", trace_path.c_str(),
                 std::strerror(errno));
    return 2;
  }
  const std::size_t tokens = global_batch * model.seq;
  const weft::strategy_config config_3d{.model = model, .micro_batch = 2, .global_batch = global_batch, .seed = 7};
  weft::strategy_config config_1 = config_3d;
  config_1.micro_batch = global_batch;

  std::printf("weft: a GPT of %zu layers (hidden %zu, %zu heads, vocabulary %zu, sequence %zu) trained for %d steps\n",
              model.layers, model.hidden, model.heads, model.vocab, model.seq, steps);
  std::printf("  on 8 in-process ranks as TP 2 x PP 2 x DP 2, interleaved schedule with 2 chunks per rank, ZeRO-1,\n"
              "  selective recompute, AdamW; next to the same model on 1 rank. %zu sequences (%zu tokens) per step.\n\n",
              global_batch, tokens);

  // The same model on one rank first: the whole batch at once, and cut into 2 microbatches (which
  // adds the gradients in another order: how far two equally right float runs drift apart).
  const bool tty = isatty(fileno(stdout)) != 0;
  double seconds_1 = 0;
  const auto run_1 = [&](std::size_t micro_batch, const char* what) {
    std::vector<double> losses(static_cast<std::size_t>(steps));
    weft::strategy_config c = config_1;
    c.micro_batch = micro_batch;
    weft::local::run(1, [&](weft::local::communicator& world) {
      auto trainer = strategy_1::make(world, c, rule);
      for (int s = 0; s < steps; ++s) {
        const auto b = batch_of(s);
        const auto t = clock_type::now();
        losses[static_cast<std::size_t>(s)] = trainer->train_step(b.ids, b.targets);
        if (micro_batch == global_batch) seconds_1 += seconds(clock_type::now() - t);
        if (tty) std::printf("\r  %s: step %d/%d, loss %.4f", what, s + 1, steps, losses[static_cast<std::size_t>(s)]);
        std::fflush(stdout);
      }
    });
    if (tty) std::printf("\r%70s\r", "");
    return losses;
  };
  const std::vector<double> loss_1 = run_1(global_batch, "1 rank");
  const std::vector<double> loss_1_halves = run_1(global_batch / 2, "1 rank, 2 microbatches");
  double floor = 0;
  for (int s = 0; s < steps; ++s) {
    const auto i = static_cast<std::size_t>(s);
    floor = std::max(floor, std::abs(loss_1_halves[i] - loss_1[i]) / loss_1[i]);
  }

  std::printf("  step   loss, 8 ranks (3D)   loss, 1 rank   relative difference\n");
  std::vector<rank_record> ranks(8);
  double seconds_3d = 0, worst = 0;
  int first_not_finite = 0;  // the first step (from 1) whose losses differ by NaN or infinity
  double not_finite_3d = 0, not_finite_1 = 0;  // its losses
  std::vector<double> step_seconds(static_cast<std::size_t>(steps));
  weft::local::run(8, [&](weft::local::communicator& c) {
    weft::traced<weft::local::communicator> world(std::move(c), "world");
    auto trainer = strategy_3d::make(world, config_3d, rule);
    auto& me = ranks[static_cast<std::size_t>(world.rank())];
    for (int s = 0; s < steps; ++s) {
      const auto b = batch_of(s);
      world.clear_spans();
      world.barrier();  // every rank starts the step together, so the step time is the slowest's
      const auto t = clock_type::now();
      const double loss = trainer->train_step(b.ids, b.targets);
      const double took = seconds(clock_type::now() - t);
      if (world.rank() == 0) {
        const double ref = loss_1[static_cast<std::size_t>(s)];
        const double diff = std::abs(loss - ref) / ref;
        // A NaN is no difference to std::max (NaN < x is false): such a step is counted apart.
        if (!std::isfinite(diff)) {
          if (first_not_finite == 0) {
            first_not_finite = s + 1;
            not_finite_3d = loss;
            not_finite_1 = ref;
          }
        } else {
          worst = std::max(worst, diff);
        }
        seconds_3d += took;
        step_seconds[static_cast<std::size_t>(s)] = took;
        std::printf("  %4d   %18.6f   %12.6f   %19.1e\n", s + 1, loss, ref, diff);
        std::fflush(stdout);
      }
    }
    me.coord = trainer->comms().coord();
    me.compute = trainer->timeline();
    me.comm = world.spans();
    me.main_thread = std::this_thread::get_id();
  });

  // Float sums in another order drift apart as training goes on: the same 1-rank model with its
  // batch cut into microbatches shows by how much; tensor parallelism reorders more sums (each
  // row-parallel product adds two halves, the softmax sums split over the vocabulary). A wrong
  // gradient (a microbatch's activations mixed up, a missing reduction) moves the loss by 1e-2
  // and more within a few steps; beyond 1e-4 relative something would be wrong.
  // A loss that is NaN or infinite (a broken gradient's likeliest symptom) never matches.
  const bool match = first_not_finite == 0 && worst < 1e-4;
  if (first_not_finite != 0) {
    std::printf("\n  the two runs DO NOT MATCH: at step %d the loss is %g on 8 ranks and %g on 1 rank, and a loss\n"
                "  that is not a finite number never matches (the finite steps differ by up to %.1e).\n",
                first_not_finite, not_finite_3d, not_finite_1, worst);
  } else {
    std::printf("\n  the two runs %s: largest relative difference %.1e (bound 1e-4). For scale, the 1-rank run\n"
                "  with its batch cut into 2 microbatches differs from it by up to %.1e: float sums in another\n"
                "  order drift apart over the steps, and tensor parallelism reorders more of them.\n",
                match ? "match" : "DO NOT MATCH", worst, floor);
  }
  std::printf("  loss from %.3f to %.3f (ln %zu = %.3f: guessing)\n", loss_1.front(), loss_1.back(), model.vocab,
              std::log(static_cast<double>(model.vocab)));
  std::printf("  tokens/s: %.0f on 8 ranks, %.0f on 1 rank (this machine has %u cores; 8 ranks share them)\n\n",
              static_cast<double>(tokens) * steps / seconds_3d, static_cast<double>(tokens) * steps / seconds_1,
              std::thread::hardware_concurrency());

  // The last step's communication, per axis, averaged over the ranks.
  struct axis_total {
    std::size_t calls = 0, bytes = 0;
    double seconds = 0;
  };
  std::map<std::string, axis_total> per_axis;
  for (const auto& r : ranks) {
    for (const auto& s : r.comm) {
      auto& a = per_axis[s.axis];
      ++a.calls;
      a.bytes += s.bytes;
      a.seconds += s.seconds();
    }
  }
  const double last = step_seconds.back();
  std::printf("  communication in the last step (%.0f ms), per rank on average:\n", last * 1e3);
  std::printf("    axis   calls   MiB handed over   time in calls   share of the step\n");
  for (const auto& [axis, a] : per_axis) {
    std::printf("    %-4s   %5.0f   %15.2f   %10.1f ms   %16.0f%%\n", axis.c_str(), static_cast<double>(a.calls) / 8.0,
                static_cast<double>(a.bytes) / 8.0 / (1 << 20), a.seconds / 8.0 * 1e3, a.seconds / 8.0 / last * 100.0);
  }
  std::printf("    (tp: the layers' all-reduces; pp: activations and gradients between stages, and the all-reduce\n"
              "     that sums the step's loss over the stages; dp: the ZeRO-1 reduce-scatter and all-gather, on\n"
              "     the optimizer's progress thread, and the all-reduce that sums the loss over the replicas;\n"
              "     world: the demo's barrier. Time in calls includes waiting for the other ranks.)\n");
  write_trace(trace, ranks);
  trace.close();  // flushes: a full disk shows here
  if (!trace) throw std::runtime_error("could not write the trace to " + trace_path);
  std::printf("\n  trace of the last step: %s (open in https://ui.perfetto.dev)\n", trace_path.c_str());
  return match ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "weft_train_3d: %s\n", e.what());
  return 1;
}
