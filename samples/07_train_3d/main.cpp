// The main demo: a small GPT trained on 8 ranks as TP2 x PP2 x DP2 with an interleaved pipeline
// schedule and ZeRO-1 (weft::strategy), next to the same model on one rank. The 8 ranks are threads
// of this process (--transport local, the default) or 8 MPI processes (--transport mpi): one
// training function over the communicator type runs on either, and prints the same losses. It
// prints both losses per step (they match), tokens per second, what each axis communicated and
// how much of the step it took, and writes a Chrome trace of the last step (open it in
// https://ui.perfetto.dev or chrome://tracing).
//
//   build/samples/07_train_3d/weft_train_3d [--steps N] [--seed S] [--trace FILE]
//       [--transport local|mpi]
//   mpirun -n 8 build/samples/07_train_3d/weft_train_3d --transport mpi
//
// Under MPI, rank 0 prints; it also runs the 1-rank reference, in-process, while the other seven
// processes wait in a barrier, so that the output and the exit status are the threads run's (a
// flag to skip the reference would save its seconds and leave the 3D losses unchecked). The other
// ranks send rank 0 their spans of the last step for the table and the trace (steady clock
// times: one clock on one machine; across machines their rows are offset by the clocks'). MPI is
// optional at build time: where weft::mpi is missing, --transport mpi is refused. As root, Open MPI
// also needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, and with fewer cores
// than 8, mpirun --oversubscribe.
//
// The data is generated here: each sequence counts up through the vocabulary by a stride of
// 1 to 8 from a random start, so the next token follows from the last two and the loss can
// fall from ln(vocabulary) towards zero.
#include <weft/comm/broadcast.hpp>
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/strategy.hpp>
#ifdef WEFT_SAMPLE_MPI
#include <weft/comm/transport/mpi.hpp>
#endif

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

using mesh_3d = weft::mesh<weft::tp<2>, weft::pp<2>, weft::dp<2>>;
using strategy_3d = weft::strategy<mesh_3d, weft::pipeline::interleaved<2>, weft::optim::zero<1>,
                                   weft::layer::recompute::selective>;
using strategy_1 =
    weft::strategy<weft::mesh<weft::tp<1>, weft::pp<1>, weft::dp<1>>, weft::pipeline::one_f_one_b,
                   weft::optim::zero<0>, weft::layer::recompute::selective>;

constexpr weft::layer::gpt_shape model{
    .vocab = 1000, .hidden = 256, .heads = 8, .ffn = 0, .seq = 64, .layers = 4};
constexpr std::size_t global_batch = 16; // sequences per step
constexpr weft::optim::adamw rule{
    .lr = 2e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};

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

// One timed span of the last step: lane 0 compute (cat "compute"), 1 the rank's own thread's
// communication, 2 the optimizer's progress thread's (cat: the axis).
struct span_record {
  std::string name, cat;
  int lane = 0;
  std::size_t bytes = 0;
  clock_type::time_point begin, end;
};

// What one rank saw in the last step.
struct rank_record {
  weft::mesh_coord coord;
  std::vector<span_record> spans;
  // trainer->memory()'s peaks in the last step: weights, gradients, optimizer state, activations,
  // communication scratch, the layers' workspace (bytes).
  std::array<std::int64_t, 6> memory{};
};

// A rank_record as 64-bit integers, the way it travels to rank 0 (strings as length, characters).
std::vector<std::int64_t> pack(const rank_record& r) {
  std::vector<std::int64_t> v{r.coord.tp, r.coord.pp, r.coord.dp};
  v.insert(v.end(), r.memory.begin(), r.memory.end());
  v.push_back(static_cast<std::int64_t>(r.spans.size()));
  const auto text = [&](const std::string& s) {
    v.push_back(static_cast<std::int64_t>(s.size()));
    for (const char c : s)
      v.push_back(c);
  };
  for (const auto& s : r.spans) {
    v.insert(
        v.end(),
        {s.lane, static_cast<std::int64_t>(s.bytes),
         std::chrono::duration_cast<std::chrono::nanoseconds>(s.begin.time_since_epoch()).count(),
         std::chrono::duration_cast<std::chrono::nanoseconds>(s.end.time_since_epoch()).count()});
    text(s.name);
    text(s.cat);
  }
  return v;
}

rank_record unpack(const std::vector<std::int64_t>& v) {
  std::size_t at = 0;
  const auto next = [&] { return v.at(at++); };
  const auto text = [&] {
    std::string s(static_cast<std::size_t>(next()), ' ');
    for (char& c : s)
      c = static_cast<char>(next());
    return s;
  };
  const auto time = [&] {
    return clock_type::time_point(
        std::chrono::duration_cast<clock_type::duration>(std::chrono::nanoseconds(next())));
  };
  rank_record r;
  r.coord.tp = static_cast<int>(next());
  r.coord.pp = static_cast<int>(next());
  r.coord.dp = static_cast<int>(next());
  for (auto& m : r.memory)
    m = next();
  r.spans.resize(static_cast<std::size_t>(next()));
  for (auto& s : r.spans) {
    s.lane = static_cast<int>(next());
    s.bytes = static_cast<std::size_t>(next());
    s.begin = time();
    s.end = time();
    s.name = text();
    s.cat = text();
  }
  return r;
}

// Every rank's record, on rank 0 (in rank order; empty elsewhere): the others send theirs.
template <weft::communicator World>
std::vector<rank_record> gather(World& world, const rank_record& mine) {
  if (world.rank() != 0) {
    const std::vector<std::int64_t> v = pack(mine);
    const std::int64_t n[1] = {static_cast<std::int64_t>(v.size())};
    world.send(std::span<const std::int64_t>(n), 0);
    world.send(std::span<const std::int64_t>(v), 0);
    return {};
  }
  std::vector<rank_record> all{mine};
  for (int r = 1; r < world.size(); ++r) {
    std::int64_t n[1] = {0};
    world.recv(std::span<std::int64_t>(n), r);
    std::vector<std::int64_t> v(static_cast<std::size_t>(n[0]));
    world.recv(std::span<std::int64_t>(v), r);
    all.push_back(unpack(v));
  }
  return all;
}

std::string json_escape_free(std::string_view s) {
  return std::string(s);
} // our names need no escapes

void write_trace(std::ostream& out, const std::vector<rank_record>& ranks) {
  clock_type::time_point t0 = clock_type::time_point::max();
  for (const auto& r : ranks) {
    for (const auto& s : r.spans)
      t0 = std::min(t0, s.begin);
  }
  const auto us = [&](clock_type::time_point t) {
    return std::chrono::duration<double, std::micro>(t - t0).count();
  };
  out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  const auto event = [&](std::size_t pid, int tid, std::string_view name, std::string_view cat,
                         clock_type::time_point b, clock_type::time_point e) {
    out << (first ? "" : ",\n") << "  {\"name\": \"" << json_escape_free(name) << "\", \"cat\": \""
        << cat << "\", \"ph\": \"X\", \"pid\": " << pid << ", \"tid\": " << tid
        << ", \"ts\": " << us(b) << ", \"dur\": " << std::max(0.0, us(e) - us(b)) << "}";
    first = false;
  };
  const auto meta = [&](std::size_t pid, int tid, std::string_view what, const std::string& name) {
    out << (first ? "" : ",\n") << "  {\"name\": \"" << what
        << "\", \"ph\": \"M\", \"pid\": " << pid << ", \"tid\": " << tid
        << ", \"args\": {\"name\": \"" << name << "\"}}";
    first = false;
  };
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& c = ranks[r].coord;
    meta(r, 0, "process_name",
         "rank " + std::to_string(r) + " (tp " + std::to_string(c.tp) + ", pp " +
             std::to_string(c.pp) + ", dp " + std::to_string(c.dp) + ")");
    meta(r, 0, "thread_name", "compute");
    meta(r, 1, "thread_name", "communication");
    meta(r, 2, "thread_name", "optimizer progress thread");
    for (const auto& s : ranks[r].spans)
      event(r, s.lane, s.name, s.cat, s.begin, s.end);
  }
  out << "\n]}\n";
}

// A whole number in [low, high], else nothing ("abc", "2x", "-1"): main refuses it rather than
// run with a value nobody asked for.
std::optional<std::uint64_t> whole_number(std::string_view s, std::uint64_t low,
                                          std::uint64_t high) {
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc{} || end != s.data() + s.size() || n < low || n > high) return std::nullopt;
  return n;
}

struct options {
  int steps = 30;
  std::uint64_t seed = 7; // the model's initialisation
  std::string trace_path = "weft_train_3d_trace.json";
  std::string transport = "local";
  // Set when the command line says to stop: the exit status and what to print (to stderr when
  // the status is not 0).
  int exit_status = -1;
  std::string say;
};

options parse(int argc, char** argv) {
  options o;
  const auto stop = [&](int status, std::string what) {
    if (o.exit_status < 0) { // the first complaint; the rest is still read for --transport
      o.exit_status = status;
      o.say = std::move(what);
    }
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--steps" && i + 1 < argc) {
      const auto n = whole_number(argv[++i], 1, INT_MAX);
      if (!n)
        stop(2, std::string("weft_train_3d: --steps takes a whole number from 1, not '") + argv[i] +
                    "'\n");
      o.steps = n ? static_cast<int>(*n) : o.steps;
    } else if (a == "--seed" && i + 1 < argc) {
      const auto n = whole_number(argv[++i], 0, UINT64_MAX);
      if (!n)
        stop(2, std::string("weft_train_3d: --seed takes a whole number, not '") + argv[i] + "'\n");
      o.seed = n.value_or(o.seed);
    } else if (a == "--trace" && i + 1 < argc) {
      o.trace_path = argv[++i];
    } else if (a == "--transport" && i + 1 < argc) {
      o.transport = argv[++i];
      if (o.transport != "local" && o.transport != "mpi") {
        stop(2,
             "weft_train_3d: --transport takes local (8 threads) or mpi (8 processes under mpirun "
             "-n 8), not '" +
                 o.transport + "'\n");
      }
    } else {
      stop(a == "--help" || a == "-h" ? 0 : 2,
           std::string("usage: ") + argv[0] +
               " [--steps N] [--seed S] [--trace FILE] [--transport local|mpi]\n");
    }
  }
  return o;
}

// What differs between the transports.
struct transport_traits {
  const char* ranks;  // in the heading: "8 in-process ranks"
  bool overlap;       // the ZeRO collectives on the optimizer's progress thread
  bool progress_line; // the 1-rank run's steps on one rewritten line, on a terminal (mpirun
                      // gives rank 0 one, but forwards it a line at a time)
};

// The demo on one rank of the 8 (its world): every rank trains, rank 0 also runs the 1-rank
// reference and prints. Returns the exit status, the same on every rank.
template <weft::communicator World>
int train(World& world, const options& o, const transport_traits& how) {
  const bool lead = world.rank() == 0;
  // Opened before training, so that a path it cannot write fails now rather than after the run.
  std::ofstream trace;
  std::int32_t verdict[1] = {0};
  if (lead) {
    trace.open(o.trace_path);
    if (!trace) {
      std::fprintf(stderr, "weft_train_3d: cannot write the trace to %s: %s\n",
                   o.trace_path.c_str(), std::strerror(errno));
      verdict[0] = 2;
    }
  }
  weft::broadcast(world, std::span<std::int32_t>(verdict), 0);
  if (verdict[0] != 0) return verdict[0];

  const int steps = o.steps;
  const std::size_t tokens = global_batch * model.seq;
  weft::strategy_config config_3d{
      .model = model, .micro_batch = 2, .global_batch = global_batch, .seed = o.seed};
  config_3d.optimizer.overlap = how.overlap;

  // The same model on one rank first, on rank 0 while the others wait: the whole batch at once,
  // and cut into 2 microbatches (which adds the gradients in another order: how far two equally
  // right float runs drift apart).
  const bool tty = lead && how.progress_line && isatty(fileno(stdout)) != 0;
  double seconds_1 = 0;
  const auto run_1 = [&](std::size_t micro_batch, const char* what) {
    std::vector<double> losses(static_cast<std::size_t>(steps));
    weft::strategy_config c = config_3d;
    c.micro_batch = micro_batch;
    weft::local::run(1, [&](weft::local::communicator& one) {
      auto trainer = strategy_1::make(one, c, rule);
      for (int s = 0; s < steps; ++s) {
        const auto b = batch_of(s);
        const auto t = clock_type::now();
        losses[static_cast<std::size_t>(s)] = trainer->train_step(b.ids, b.targets);
        if (micro_batch == global_batch) seconds_1 += seconds(clock_type::now() - t);
        if (tty)
          std::printf("\r  %s: step %d/%d, loss %.4f", what, s + 1, steps,
                      losses[static_cast<std::size_t>(s)]);
        std::fflush(stdout);
      }
    });
    if (tty) std::printf("\r%70s\r", "");
    return losses;
  };
  std::vector<double> loss_1, loss_1_halves;
  double floor = 0;
  if (lead) {
    std::printf(
        "weft: a GPT of %zu layers (hidden %zu, %zu heads, vocabulary %zu, sequence %zu) trained "
        "for %d "
        "steps\n  on %s as TP 2 x PP 2 x DP 2, interleaved schedule with 2 chunks per rank, "
        "ZeRO-1,\n"
        "  selective recompute, AdamW; next to the same model on 1 rank. %zu sequences (%zu "
        "tokens) per "
        "step.\n\n",
        model.layers, model.hidden, model.heads, model.vocab, model.seq, steps, how.ranks,
        global_batch, tokens);
    loss_1 = run_1(global_batch, "1 rank");
    loss_1_halves = run_1(global_batch / 2, "1 rank, 2 microbatches");
    for (int s = 0; s < steps; ++s) {
      const auto i = static_cast<std::size_t>(s);
      floor = std::max(floor, std::abs(loss_1_halves[i] - loss_1[i]) / loss_1[i]);
    }
    std::printf("  step   loss, 8 ranks (3D)   loss, 1 rank   relative difference\n");
  }
  world.barrier();

  // The check below: the first steps within early_bound, every step within bound.
  const int early_steps = std::min(steps, 3);
  constexpr double early_bound = 1e-6, bound = 1e-3;
  double seconds_3d = 0, worst = 0, worst_early = 0;
  int first_not_finite = 0; // the first step (from 1) whose losses differ by NaN or infinity
  double not_finite_3d = 0, not_finite_1 = 0; // its losses
  std::vector<double> step_seconds(static_cast<std::size_t>(steps));
  auto trainer = strategy_3d::make(world, config_3d, rule);
  for (int s = 0; s < steps; ++s) {
    const auto b = batch_of(s);
    world.clear_spans();
    world.barrier(); // every rank starts the step together, so the step time is the slowest's
    const auto t = clock_type::now();
    const double loss = trainer->train_step(b.ids, b.targets);
    const double took = seconds(clock_type::now() - t);
    if (lead) {
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
        if (s < early_steps) worst_early = std::max(worst_early, diff);
      }
      seconds_3d += took;
      step_seconds[static_cast<std::size_t>(s)] = took;
      std::printf("  %4d   %18.6f   %12.6f   %19.1e\n", s + 1, loss, ref, diff);
      std::fflush(stdout);
    }
  }
  const weft::memory_account held = trainer->memory();
  const auto peak = [](weft::memory_account::amount a) {
    return static_cast<std::int64_t>(a.peak);
  };
  rank_record me{.coord = trainer->comms().coord(),
                 .spans = {},
                 .memory = {peak(held.weights) + peak(held.gathered_weights),
                            peak(held.gradients) + peak(held.gradient_buckets),
                            peak(held.optimizer_state) + peak(held.master_weights),
                            peak(held.activations), peak(held.scratch), peak(held.workspace)}};
  for (const auto& c : trainer->timeline())
    me.spans.push_back({c.name, "compute", 0, 0, c.begin, c.end});
  for (const auto& c : world.spans()) {
    me.spans.push_back({c.axis + " " + std::string(c.what), c.axis,
                        c.thread == std::this_thread::get_id() ? 1 : 2, c.bytes, c.begin, c.end});
  }
  const std::vector<rank_record> ranks = gather(world, me);
  if (!lead) {
    weft::broadcast(world, std::span<std::int32_t>(verdict), 0);
    return verdict[0];
  }

  // Float sums in another order drift apart as training goes on, and faster the longer it goes:
  // the same 1-rank model with its batch cut into microbatches shows by how much; tensor
  // parallelism reorders more sums (each row-parallel product adds two halves, the softmax sums
  // split over the vocabulary), and the host BLAS's kernels order them by the CPU (over 30 steps
  // they differ by up to 4e-5 with OpenBLAS's AVX2 kernels, 1.3e-4 with its AVX-512 ones). So the
  // first steps, before the drift has grown, are held tight: a wrong gradient moves the second
  // step's loss, the first after an update, far more than the 1e-8 a right one differs by (the
  // targets of one sequence of 16 shifted by a token in the 3D run's first step, and nothing
  // else, move the second step by 3e-4). Every later step is held to 1e-3. A loss that is NaN or
  // infinite (a broken gradient's likeliest symptom) never matches.
  const bool match = first_not_finite == 0 && worst_early < early_bound && worst < bound;
  if (first_not_finite != 0) {
    std::printf(
        "\n  the two runs DO NOT MATCH: at step %d the loss is %g on 8 ranks and %g on 1 rank, and "
        "a loss\n"
        "  that is not a finite number never matches (the finite steps differ by up to %.1e).\n",
        first_not_finite, not_finite_3d, not_finite_1, worst);
  } else {
    std::printf(
        "\n  the two runs %s: largest relative difference %.1e in the first %d steps (bound "
        "%.0e),\n"
        "  %.1e in all (bound %.0e). For scale, the 1-rank run with its batch cut into 2 "
        "microbatches\n"
        "  differs from it by up to %.1e: float sums in another order drift apart over the steps,\n"
        "  and tensor parallelism reorders more of them.\n",
        match ? "match" : "DO NOT MATCH", worst_early, early_steps, early_bound, worst, bound,
        floor);
  }
  std::printf("  loss from %.3f to %.3f (ln %zu = %.3f: guessing)\n", loss_1.front(), loss_1.back(),
              model.vocab, std::log(static_cast<double>(model.vocab)));
  std::printf(
      "  tokens/s: %.0f on 8 ranks, %.0f on 1 rank (this machine has %u cores; 8 ranks share "
      "them)\n\n",
      static_cast<double>(tokens) * steps / seconds_3d,
      static_cast<double>(tokens) * steps / seconds_1, std::thread::hardware_concurrency());

  // The last step's communication, per axis, averaged over the ranks.
  struct axis_total {
    std::size_t calls = 0, bytes = 0;
    double seconds = 0;
  };
  std::map<std::string, axis_total> per_axis;
  for (const auto& r : ranks) {
    for (const auto& s : r.spans) {
      if (s.lane == 0) continue; // compute
      auto& a = per_axis[s.cat];
      ++a.calls;
      a.bytes += s.bytes;
      a.seconds += seconds(s.end - s.begin);
    }
  }
  const double last = step_seconds.back();
  std::printf("  communication in the last step (%.0f ms), per rank on average:\n", last * 1e3);
  std::printf("    axis   calls   MiB handed over   time in calls   share of the step\n");
  for (const auto& [axis, a] : per_axis) {
    std::printf("    %-4s   %5.0f   %15.2f   %10.1f ms   %16.0f%%\n", axis.c_str(),
                static_cast<double>(a.calls) / 8.0, static_cast<double>(a.bytes) / 8.0 / (1 << 20),
                a.seconds / 8.0 * 1e3, a.seconds / 8.0 / last * 100.0);
  }
  std::printf(
      "    (tp: the layers' all-reduces; pp: activations and gradients between stages, and the "
      "all-reduce\n"
      "     that sums the step's loss over the stages; dp: the ZeRO-1 reduce-scatter and "
      "all-gather, on\n"
      "     the optimizer's progress thread, and the all-reduce that sums the loss over the "
      "replicas;\n"
      "     world: the demo's barrier. Time in calls includes waiting for the other ranks.)\n");
  // What each rank held (trainer->memory()): the layers compute in the optimizer's buffers, so
  // weights are counted once; ZeRO-1 shards the optimizer state over the 2 DP ranks.
  std::printf("\n  memory in the last step, per rank, at its peak (KiB; trainer->memory()):\n");
  std::printf(
      "    rank   tp pp dp   weights   gradients   optimizer state   activations   scratch   "
      "workspace\n");
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const auto& c = ranks[r].coord;
    const auto& m = ranks[r].memory;
    const auto kib = [](std::int64_t b) { return static_cast<double>(b) / 1024.0; };
    std::printf("    %4zu   %2d %2d %2d   %7.0f   %9.0f   %15.0f   %11.0f   %7.0f   %9.0f\n", r,
                c.tp, c.pp, c.dp, kib(m[0]), kib(m[1]), kib(m[2]), kib(m[3]), kib(m[4]), kib(m[5]));
  }
  write_trace(trace, ranks);
  trace.close(); // flushes: a full disk shows here
  if (!trace) {
    std::fprintf(stderr, "weft_train_3d: could not write the trace to %s\n", o.trace_path.c_str());
    verdict[0] = 1;
  } else {
    std::printf("\n  trace of the last step: %s (open in https://ui.perfetto.dev)\n",
                o.trace_path.c_str());
    std::fflush(stdout);
    verdict[0] = match ? 0 : 1;
  }
  weft::broadcast(world, std::span<std::int32_t>(verdict), 0);
  return verdict[0];
}

#ifdef WEFT_SAMPLE_MPI
// The pipeline's sends must not block (pipeline/executor.hpp): over MPI they are post()s, which
// weft::traced passes on, or neighbouring stages that both send first would deadlock.
static_assert(requires(weft::traced<weft::mpi::communicator> & c, std::span<const float> v) {
  c.post(v, 0, 0);
});

// The 8 ranks as MPI processes, one each. A refused command line is said once, by rank 0.
int run_mpi(int& argc, char**& argv, const options& o) {
  // The ZeRO collectives run on the optimizer's progress thread while this one runs the
  // pipeline's: two threads in MPI at once, which takes MPI_THREAD_MULTIPLE. Where MPI provides
  // less, they run on this thread (the same losses, without the overlap).
  weft::mpi::environment env(argc, argv, MPI_THREAD_MULTIPLE);
  try {
    weft::traced<weft::mpi::communicator> world(weft::mpi::world(), "world");
    if (o.exit_status >= 0) {
      if (world.rank() == 0) std::fputs(o.say.c_str(), o.exit_status == 0 ? stdout : stderr);
      return o.exit_status;
    }
    if (world.size() != strategy_3d::size) {
      if (world.rank() == 0) {
        std::fprintf(
            stderr,
            "weft_train_3d: --transport mpi trains on %d processes (mpirun -n %d), not %d\n",
            strategy_3d::size, strategy_3d::size, world.size());
      }
      return 2;
    }
    return train(world, o, {"8 MPI processes", env.thread_level() >= MPI_THREAD_MULTIPLE, false});
  } catch (const std::exception& e) {
    // A failed rank ends the job, so that no other process waits for it.
    std::fprintf(stderr, "weft_train_3d: %s\n", e.what());
    env.abort(1);
    return 1;
  }
}
#endif

} // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  if (o.transport == "mpi") {
#ifdef WEFT_SAMPLE_MPI
    return run_mpi(argc, argv, o);
#else
    if (o.exit_status < 0) {
      std::fprintf(
          stderr,
          "weft_train_3d: --transport mpi needs weft::mpi, and this build has no MPI (configure "
          "weft where MPI is found)\n");
      return 2;
    }
#endif
  }
  if (o.exit_status >= 0) {
    std::fputs(o.say.c_str(), o.exit_status == 0 ? stdout : stderr);
    return o.exit_status;
  }
  try {
    int status = 1;
    weft::local::run(strategy_3d::size, [&](weft::local::communicator& c) {
      weft::traced<weft::local::communicator> world(std::move(c), "world");
      const int s = train(world, o, {"8 in-process ranks", true, true});
      if (world.rank() == 0) status = s;
    });
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft_train_3d: %s\n", e.what());
    return 1;
  }
}
