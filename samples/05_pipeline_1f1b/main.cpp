// A pipeline-parallel MLP: 8 layers y = tanh(W x + b) split into 4 stages of 2 layers, one
// stage per in-process rank (weft::local), trained with plain SGD through
// weft::pipeline::executor and the one_f_one_b schedule, 8 microbatches a step. The same
// model trained serially on one thread, microbatch after microbatch, prints the same losses:
// the executor only decides where and when each stage's forward and backward run, never what
// they compute. Then weft/pipeline/stats.hpp prices the schedule: its bubble against the
// formula, and the activations each rank holds, next to GPipe's.
//
//   build/samples/05_pipeline_1f1b/weft_pipeline_1f1b
//
//   forward   x -> rank 0 (layers 0, 1) -a0-> rank 1 (2, 3) -a1-> rank 2 (4, 5) -a2-> rank 3 (6, 7)
//   backward       rank 0 <-g0- rank 1 <-g1- rank 2 <-g2- rank 3 <- loss gradient
//
// a_i: a microbatch's activations out of rank i; g_i: their gradient. The order in which each
// rank runs its microbatches' F and B is the schedule's (the sample prints it).
#include <weft/comm/transport/local.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/stats.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace pl = weft::pipeline;
using comm_t = weft::local::communicator;

constexpr int stages = 4;
constexpr int microbatches = 8;
constexpr int steps = 8;
constexpr std::size_t rows = 4; // samples per microbatch
// Layer l maps widths[l] inputs to widths[l + 1] outputs.
constexpr std::size_t widths[] = {16, 32, 32, 32, 32, 32, 32, 32, 8};
constexpr std::size_t layers = std::size(widths) - 1;
constexpr std::size_t layers_per_stage = layers / stages;
constexpr float lr = 0.5f;

/// A deterministic value in [-1, 1) from two integers.
float noise(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

struct layer {
  std::size_t in, out;
  std::vector<float> w, b;   // out x in, row-major; out
  std::vector<float> gw, gb; // their gradients, summed over the step's microbatches
};

std::vector<layer> make_model() {
  std::vector<layer> m;
  for (std::size_t l = 0; l < layers; ++l) {
    layer y{widths[l], widths[l + 1], {}, {}, {}, {}};
    const float scale = 1.2f / std::sqrt(static_cast<float>(y.in));
    for (std::size_t k = 0; k < y.in * y.out; ++k)
      y.w.push_back(scale * noise(l, k));
    for (std::size_t k = 0; k < y.out; ++k)
      y.b.push_back(0.1f * noise(100 + l, k));
    y.gw.assign(y.w.size(), 0.0f);
    y.gb.assign(y.b.size(), 0.0f);
    m.push_back(std::move(y));
  }
  return m;
}

// The batch: microbatch i is rows [i * rows, (i + 1) * rows) of both.
const std::vector<float> inputs = [] {
  std::vector<float> v(microbatches * rows * widths[0]);
  for (std::size_t k = 0; k < v.size(); ++k)
    v[k] = noise(1000, k);
  return v;
}();
const std::vector<float> targets = [] {
  std::vector<float> v(microbatches * rows * widths[layers]);
  for (std::size_t k = 0; k < v.size(); ++k)
    v[k] = 0.7f * std::sin(3.0f * noise(2000, k));
  return v;
}();

/// A run of consecutive layers and what their backward needs of each microbatch's forward:
/// one pipeline stage, or (all layers) the serial model.
class block {
public:
  explicit block(std::vector<layer> ls) : layers_(std::move(ls)), saved_(microbatches) {}

  std::vector<float> forward(int mb, std::span<const float> x) {
    auto& acts = saved_[static_cast<std::size_t>(mb)]; // each layer's input, then the output
    acts.assign(1, std::vector<float>(x.begin(), x.end()));
    for (const layer& y : layers_) {
      std::vector<float> next(rows * y.out);
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t o = 0; o < y.out; ++o) {
          float z = y.b[o];
          for (std::size_t i = 0; i < y.in; ++i)
            z += y.w[o * y.in + i] * acts.back()[r * y.in + i];
          next[r * y.out + o] = std::tanh(z);
        }
      }
      acts.push_back(std::move(next));
    }
    return acts.back();
  }

  // The input gradient from the output gradient; adds this microbatch's weight gradients.
  std::vector<float> backward(int mb, std::span<const float> gy) {
    auto& acts = saved_[static_cast<std::size_t>(mb)];
    std::vector<float> g(gy.begin(), gy.end());
    for (std::size_t l = layers_.size(); l-- > 0;) {
      layer& y = layers_[l];
      std::vector<float> gx(rows * y.in, 0.0f);
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t o = 0; o < y.out; ++o) {
          const float out = acts[l + 1][r * y.out + o];
          const float gz = g[r * y.out + o] * (1 - out * out);
          y.gb[o] += gz;
          for (std::size_t i = 0; i < y.in; ++i) {
            y.gw[o * y.in + i] += gz * acts[l][r * y.in + i];
            gx[r * y.in + i] += y.w[o * y.in + i] * gz;
          }
        }
      }
      g = std::move(gx);
    }
    acts.clear(); // this microbatch's activations are no longer needed
    return g;
  }

  void sgd_step() {
    for (layer& y : layers_) {
      for (std::size_t k = 0; k < y.w.size(); ++k)
        y.w[k] -= lr * y.gw[k];
      for (std::size_t k = 0; k < y.b.size(); ++k)
        y.b[k] -= lr * y.gb[k];
      std::fill(y.gw.begin(), y.gw.end(), 0.0f);
      std::fill(y.gb.begin(), y.gb.end(), 0.0f);
    }
  }

private:
  std::vector<layer> layers_;
  std::vector<std::vector<std::vector<float>>> saved_; // [microbatch][layer]
};

// Mean squared error over the whole batch, so each microbatch's gradient is divided by it.
pl::loss_result<float> mse(int mb, std::span<const float> y) {
  const auto t = pl::microbatch(std::span<const float>(targets), widths[layers], microbatches, mb);
  const auto n = static_cast<float>(microbatches * rows);
  pl::loss_result<float> r;
  for (std::size_t k = 0; k < y.size(); ++k) {
    const float d = y[k] - t[k];
    r.loss += 0.5 * static_cast<double>(d) * d / n;
    r.gradient.push_back(d / n);
  }
  return r;
}

std::span<const float> input(int mb) {
  return pl::microbatch(std::span<const float>(inputs), widths[0], microbatches, mb);
}

// The executor's view of one rank: its block is the stage's (one chunk: `chunk` is always 0).
struct stage_fns {
  block layers;
  std::span<const float> input(int mb) const { return ::input(mb); }
  std::vector<float> forward(int mb, int /*chunk*/, std::span<const float> x) {
    return layers.forward(mb, x);
  }
  pl::loss_result<float> loss(int mb, std::span<const float> y) const { return mse(mb, y); }
  std::vector<float> backward(int mb, int /*chunk*/, std::span<const float> gy) {
    return layers.backward(mb, gy);
  }
};

std::vector<double> train_serial() {
  block model(make_model());
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    double loss = 0;
    for (int mb = 0; mb < microbatches; ++mb) {
      const auto y = model.forward(mb, input(mb));
      const auto l = mse(mb, y);
      loss += l.loss;
      (void)model.backward(mb, l.gradient);
    }
    model.sgd_step();
    losses.push_back(loss);
  }
  return losses;
}

std::vector<double> train_pipeline() {
  const std::vector<layer> all = make_model();
  std::vector<stage_fns> fns;
  for (std::size_t r = 0; r < stages; ++r) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(r * layers_per_stage);
    fns.push_back(stage_fns{block({first, first + static_cast<std::ptrdiff_t>(layers_per_stage)})});
  }
  // What crosses each stage boundary per microbatch: rows x the width there.
  std::vector<std::size_t> boundaries;
  for (std::size_t r = 1; r < stages; ++r)
    boundaries.push_back(rows * widths[r * layers_per_stage]);
  std::vector<double> losses(steps);
  weft::local::run(stages, [&](comm_t& c) {
    pl::executor<pl::one_f_one_b, comm_t> ex(c, microbatches, boundaries);
    stage_fns& mine = fns[static_cast<std::size_t>(c.rank())];
    for (int s = 0; s < steps; ++s) {
      const std::vector<double> l = ex.run(mine); // the microbatches' losses, on the last rank only
      mine.layers.sgd_step();                     // each rank updates its own layers
      if (ex.has_loss()) {
        for (double x : l)
          losses[static_cast<std::size_t>(s)] += x;
      }
    }
  });
  return losses;
}

} // namespace

int main() try {
  std::printf(
      "An MLP of %zu layers in %d pipeline stages (weft::local threads),\n"
      "%d microbatches of %zu samples a step, schedule one_f_one_b\n\n",
      layers, stages, microbatches, rows);
  const auto serial = train_serial();
  const auto piped = train_pipeline();
  std::printf("step   loss (serial, 1 thread)   loss (1F1B, 4 stages)   difference\n");
  double worst = 0;
  int not_finite = -1; // the first step whose losses differ by NaN or infinity
  for (int s = 0; s < steps; ++s) {
    const auto k = static_cast<std::size_t>(s);
    const double diff = std::abs(piped[k] - serial[k]);
    // std::max(worst, NaN) is worst: a NaN or infinite loss has to be caught on its own.
    if (!std::isfinite(diff / serial[k])) {
      if (not_finite < 0) not_finite = s;
    } else {
      worst = std::max(worst, diff / serial[k]);
    }
    std::printf("%4d   %23.9f   %21.9f   %10.3g\n", s, serial[k], piped[k], diff);
  }
  const bool same = not_finite < 0 && worst <= 1e-6;
  const bool learned = serial.back() < 0.8 * serial.front();
  if (not_finite >= 0) {
    std::printf("MISMATCH: at step %d a loss is not a finite number (serial %g, 1F1B %g)\n",
                not_finite, serial[static_cast<std::size_t>(not_finite)],
                piped[static_cast<std::size_t>(not_finite)]);
  } else {
    std::printf("largest relative difference %.3g: %s\n", worst,
                same ? "the same losses" : "MISMATCH");
  }

  // Priced with stats.hpp's default costs per microbatch and stage: T_F = 1, and T_B = 2 for the
  // input and the weight gradients.
  const pl::schedule one = pl::one_f_one_b::make(stages, microbatches);
  const pl::schedule gp = pl::gpipe::make(stages, microbatches);
  const pl::statistics s1 = pl::analyze(one), sg = pl::analyze(gp);
  std::printf("\nThe 1F1B schedule each rank ran (F/B<microbatch>.<chunk>):\n%s",
              pl::to_text(one).c_str());
  constexpr double p = stages, m = microbatches;
  std::printf("\nThe schedules priced by pipeline/stats.hpp (T_F = 1, T_B = 2, p = %d, m = %d):\n",
              stages, microbatches);
  std::printf("%-8s %28s %24s   %s\n", "schedule", "bubble over the ideal step", "ranks' time idle",
              "microbatches held per rank");
  for (const auto& [name, st] : {std::pair{"1f1b", &s1}, std::pair{"gpipe", &sg}}) {
    std::printf("%-8s %28.4f %24.4f  ", name, st->bubble_over_ideal, st->idle_fraction);
    for (int x : st->peak_in_flight)
      std::printf(" %d", x);
    std::printf("\n");
  }
  char bubble[64], idle[64];
  std::snprintf(bubble, sizeof bubble, "(p-1)/m = %.4f", (p - 1) / m);
  std::snprintf(idle, sizeof idle, "(p-1)/(m+p-1) = %.4f", (p - 1) / (m + p - 1));
  std::printf("%-8s %28s %24s\n", "formula", bubble, idle);
  std::printf(
      "A step takes %.0f time units where each rank computes for %.0f. GPipe's bubble is the\n"
      "same, but it holds the activations of all %d microbatches; 1F1B at most p = %d.\n",
      s1.step_time, s1.ideal_time, microbatches, stages);
  const bool bubble_ok = std::abs(s1.bubble_over_ideal - (p - 1) / m) < 1e-9;

  if (!same || !learned || !bubble_ok) {
    std::fprintf(stderr, "weft_pipeline_1f1b: check failed:%s%s%s\n",
                 same              ? ""
                 : not_finite >= 0 ? " a loss is not a finite number"
                                   : " losses differ",
                 learned ? "" : " the loss did not fall",
                 bubble_ok ? "" : " bubble off the formula");
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "weft_pipeline_1f1b: %s\n", e.what());
  return 1;
}
