// Data-parallel training with weft::optim on 4 in-process ranks (weft::local), once for each
// ZeRO stage: zero<0> (plain DDP), zero<1>, zero<2>, zero<3>. The model is a small MLP in
// half precision with fp32 master weights, AdamW and dynamic loss scaling; each rank computes
// the gradient of its quarter of the batch. The four runs print the same losses (sharding
// changes where the optimizer's data lives, not what it computes: zero<1..3> agree to the bit,
// zero<0> sums the fp16 gradients in another order and agrees to within fp16 rounding), and
// each rank's memory() shrinks with the stage exactly as the ZeRO paper's formulas say
// (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
// SC20, Figure 1):
//
//   Psi parameters, N data-parallel ranks, fp16 parameters and gradients (2 + 2 bytes),
//   K = 12 bytes of optimizer state per parameter (fp32 master weight, momentum, variance):
//     zero<0>  (2 + 2 + K) Psi        zero<1>  2 Psi + 2 Psi + K Psi / N
//     zero<2>  2 Psi + (2 + K) Psi / N                   zero<3>  (2 + 2 + K) Psi / N
//
//   build/samples/06_zero_training/weft_zero_training
#include <weft/comm/transport/local.hpp>
#include <weft/optim.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

namespace wo = weft::optim;
using weft::half;

constexpr int ranks = 4;
constexpr int batch = 64; // samples per step, batch / ranks on each rank
constexpr int steps = 10;
// fc1: 32 -> 256, tanh; fc2: 256 -> 256, tanh; fc3: 256 -> 10, linear.
constexpr std::size_t widths[] = {32, 256, 256, 10};
constexpr std::size_t layers = std::size(widths) - 1;

float noise(std::uint64_t a, std::uint64_t b) {
  std::uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<float>(x >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

const std::vector<float> inputs = [] {
  std::vector<float> v(batch * widths[0]);
  for (std::size_t k = 0; k < v.size(); ++k)
    v[k] = noise(1, k);
  return v;
}();
const std::vector<float> targets = [] {
  std::vector<float> v(batch * widths[layers]);
  for (std::size_t k = 0; k < v.size(); ++k)
    v[k] = 0.5f * std::sin(3.0f * noise(2, k));
  return v;
}();

wo::param_set make_params() {
  wo::param_set ps;
  for (std::size_t l = 0; l < layers; ++l) {
    ps.add("fc" + std::to_string(l + 1) + ".w", {widths[l + 1], widths[l]});
    ps.add("fc" + std::to_string(l + 1) + ".b", {widths[l + 1]});
  }
  return ps;
}

std::vector<float> initial_weights(const wo::param_set& ps) {
  std::vector<float> w(ps.elements());
  for (const auto& t : ps.tensors()) {
    const float scale =
        t.shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(t.shape[1])) : 0.1f;
    for (std::size_t i = 0; i < t.count; ++i)
      w[t.offset + i] = scale * noise(3 + t.offset, i);
  }
  return w;
}

/// Forward and backward of samples [begin, end) with the full weights `w` (param_set order):
/// returns their share of the batch's mean squared error and adds its gradient to `g`.
double loss_and_gradient(const wo::param_set& ps, const std::vector<float>& w, int begin, int end,
                         std::vector<float>& g) {
  const auto& ts = ps.tensors(); // fc1.w fc1.b fc2.w fc2.b ...
  double loss = 0;
  for (int n = begin; n < end; ++n) {
    std::vector<std::vector<float>> acts{
        {inputs.begin() + n * static_cast<std::ptrdiff_t>(widths[0]),
         inputs.begin() + (n + 1) * static_cast<std::ptrdiff_t>(widths[0])}};
    for (std::size_t l = 0; l < layers; ++l) {
      const float* wl = w.data() + ts[2 * l].offset;
      const float* bl = w.data() + ts[2 * l + 1].offset;
      std::vector<float> y(widths[l + 1]);
      for (std::size_t o = 0; o < widths[l + 1]; ++o) {
        float z = bl[o];
        for (std::size_t i = 0; i < widths[l]; ++i)
          z += wl[o * widths[l] + i] * acts[l][i];
        y[o] = l + 1 < layers ? std::tanh(z) : z;
      }
      acts.push_back(std::move(y));
    }
    std::vector<float> gy(widths[layers]);
    for (std::size_t o = 0; o < widths[layers]; ++o) {
      const float d = acts[layers][o] - targets[static_cast<std::size_t>(n) * widths[layers] + o];
      loss += 0.5 * static_cast<double>(d) * d / batch;
      gy[o] = d / batch;
    }
    for (std::size_t l = layers; l-- > 0;) {
      const float* wl = w.data() + ts[2 * l].offset;
      float* gw = g.data() + ts[2 * l].offset;
      float* gb = g.data() + ts[2 * l + 1].offset;
      std::vector<float> gx(widths[l], 0.0f);
      for (std::size_t o = 0; o < widths[l + 1]; ++o) {
        gb[o] += gy[o];
        for (std::size_t i = 0; i < widths[l]; ++i) {
          gw[o * widths[l] + i] += gy[o] * acts[l][i];
          gx[i] += wl[o * widths[l] + i] * gy[o];
        }
      }
      if (l > 0) { // through the tanh that made this layer's input
        for (std::size_t i = 0; i < widths[l]; ++i)
          gx[i] *= 1 - acts[l][i] * acts[l][i];
      }
      gy = std::move(gx);
    }
  }
  return loss;
}

struct run_result {
  std::vector<double> losses; // the whole batch's, per step
  int skipped = 0;            // steps skipped for an overflow (loss scaling)
  float loss_scale = 0;       // after the last step
  wo::memory_report memory;   // rank 0's
  std::size_t psi = 0;        // padded elements: what the formulas count
  std::size_t buckets = 0;
};

template <int Stage>
run_result train(const wo::param_set& ps) {
  run_result out;
  std::vector<std::vector<double>> partial(ranks, std::vector<double>(steps, 0.0));
  std::vector<int> skipped(ranks, 0);
  weft::local::run(ranks, [&](weft::local::communicator& c) {
    // Buckets of at least 32K elements: fc1 and fc2.w in one, fc2.b and fc3 in another.
    auto opt = wo::make_data_parallel<wo::zero<Stage>, half>(
        c, ps, wo::adamw{.lr = 5e-4f, .weight_decay = 0.01f}, {.bucket_elements = 32768});
    opt->set_parameters(initial_weights(ps));
    const auto r = static_cast<std::size_t>(c.rank());
    const int begin = batch / ranks * c.rank(), end = begin + batch / ranks;
    const auto& ts = ps.tensors();
    for (int s = 0; s < steps; ++s) {
      std::vector<float> w(ps.elements());
      for (const auto& t : ts) { // zero<3>: each bucket all-gathered here, the next prefetched
        const auto p = opt->param(t.name);
        for (std::size_t i = 0; i < t.count; ++i)
          w[t.offset + i] = static_cast<float>(p[i]);
        opt->release(t.name);
      }
      std::vector<float> g(ps.elements(), 0.0f);
      partial[r][static_cast<std::size_t>(s)] = loss_and_gradient(ps, w, begin, end, g);
      const float scale = opt->loss_scale();
      // The backward's order: the last layer's gradients first.
      for (auto t = ts.rbegin(); t != ts.rend(); ++t) {
        const auto gs = opt->grad(t->name);
        for (std::size_t i = 0; i < t->count; ++i)
          gs[i] = half(g[t->offset + i] * scale);
        opt->grad_ready(t->name); // a complete bucket starts reducing on the progress thread
      }
      if (opt->step().skipped) ++skipped[r];
    }
    if (r == 0) {
      out.memory = opt->memory();
      out.loss_scale = opt->loss_scale();
      out.psi = opt->buckets().padded_elements();
      out.buckets = opt->buckets().buckets().size();
    }
  });
  for (int s = 0; s < steps; ++s) {
    double l = 0;
    for (int r = 0; r < ranks; ++r)
      l += partial[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)];
    out.losses.push_back(l);
  }
  out.skipped = skipped[0];
  return out;
}

// The paper's bytes per rank: {parameters, gradients, optimizer state with master weights}.
struct formula {
  std::size_t params, grads, state;
};
formula zero_formula(int stage, std::size_t psi) {
  constexpr std::size_t k = 12, n = ranks;
  switch (stage) {
    case 0: return {2 * psi, 2 * psi, k * psi};
    case 1: return {2 * psi, 2 * psi, k * psi / n};
    case 2: return {2 * psi, 2 * psi / n, k * psi / n};
    default: return {2 * psi / n, 2 * psi / n, k * psi / n};
  }
}

} // namespace

int main() try {
  const wo::param_set ps = make_params();
  const run_result runs[] = {train<0>(ps), train<1>(ps), train<2>(ps), train<3>(ps)};
  std::printf(
      "An MLP of %zu parameters (fp16, fp32 master weights, AdamW, loss scaling)\n"
      "on %d data-parallel ranks, a batch of %d\n\n",
      ps.elements(), ranks, batch);
  std::printf("step   loss zero<0>   loss zero<1>   loss zero<2>   loss zero<3>\n");
  double worst = 0;
  bool sharded_identical = true;
  int not_finite = -1; // the first step with a loss that is NaN or infinite, in any run
  for (int s = 0; s < steps; ++s) {
    const auto k = static_cast<std::size_t>(s);
    std::printf("%4d", s);
    for (const auto& r : runs) {
      std::printf("   %12.8f", r.losses[k]);
      // std::max skips a NaN difference, and the to-the-bit check compares zero<1..3> only: a
      // NaN in zero<0>'s losses alone would pass both, so every loss must be finite.
      if (!std::isfinite(r.losses[k]) && not_finite < 0) not_finite = s;
      worst = std::max(worst, std::abs(r.losses[k] - runs[0].losses[k]) / runs[0].losses[k]);
      sharded_identical = sharded_identical && (&r == &runs[0] || r.losses[k] == runs[1].losses[k]);
    }
    std::printf("\n");
  }
  if (not_finite >= 0) {
    std::printf("MISMATCH: at step %d a loss is not a finite number\n", not_finite);
  }
  // zero<1..3> reduce-scatter each bucket, so they sum every fp16 gradient in the same order
  // and agree to the bit. zero<0> all-reduces it (another algorithm, another order), and an
  // fp16 sum rounds differently in another order: its gradients differ in the last bit
  // (fp16 keeps 11 bits: 1 part in 2048), and the losses by far less than that.
  const bool same = not_finite < 0 && sharded_identical && worst <= 1e-4;
  const bool learned = runs[0].losses.back() < 0.8 * runs[0].losses.front();
  std::printf("zero<1>, zero<2>, zero<3>: %s\n",
              sharded_identical ? "the same losses to the bit" : "DIFFERENT losses");
  std::printf("zero<0>: at most %.2g from them, relative (%s)\n", worst,
              worst <= 1e-4 ? "its all-reduce sums the fp16 gradients in another order"
                            : "MORE than fp16 rounding explains");
  std::printf("steps skipped for an fp16 overflow: %d (loss scale %g at the end)\n\n",
              runs[0].skipped, static_cast<double>(runs[0].loss_scale));

  bool memory_ok = true;
  std::printf("%-24s %8s %12s %10s %16s %9s   %-20s %9s\n", "bytes per rank", "Psi", "parameters",
              "gradients", "optimizer state", "total", "ZeRO formula", "transient");
  std::printf("%-24s %8s %12s %10s %16s %9s   %-20s %9s\n", "(memory())", "", "", "",
              "+ fp32 master", "", "", "peak");
  const char* formulas[] = {"16 Psi", "4 Psi + 12 Psi/N", "2 Psi + 14 Psi/N", "16 Psi/N"};
  for (int stage = 0; stage < 4; ++stage) {
    const auto& r = runs[stage];
    const auto& m = r.memory;
    const formula f = zero_formula(stage, r.psi);
    const std::size_t state = m.optimizer_state + m.master_weights;
    const std::size_t total = m.parameters + m.gradients + state;
    const bool ok = m.parameters == f.params && m.gradients == f.grads && state == f.state;
    memory_ok = memory_ok && ok;
    std::printf("zero<%d> %25zu %12zu %10zu %16zu %9zu   %-16s %s %9zu\n", stage, r.psi,
                m.parameters, m.gradients, state, total, formulas[stage], ok ? "ok " : "BAD",
                m.transient_peak);
  }
  std::printf(
      "N = %d ranks, K = 12. Psi counts the padding that makes each of the %zu buckets\n"
      "split into N equal shards (zero<1..3>: %zu elements on %zu parameters).\n"
      "Not in the total: the bytes between Adam's two state arrays (slot_gap; zero<1>: %zu),\n"
      "and the short-lived buffers of the last column: zero<2>'s full-size gradient buckets\n"
      "before their reduce-scatter, zero<3>'s gathered parameters, zero<1>/<2>'s staging.\n",
      ranks, runs[1].buckets, runs[1].memory.padding_elements, ps.elements(),
      runs[1].memory.slot_gap);

  if (!same || !learned || !memory_ok) {
    std::fprintf(stderr, "weft_zero_training: check failed:%s%s%s\n",
                 same              ? ""
                 : not_finite >= 0 ? " a loss is not a finite number"
                                   : " losses differ",
                 learned ? "" : " the loss did not fall",
                 memory_ok ? "" : " memory off the formulas");
    return 1;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "weft_zero_training: %s\n", e.what());
  return 1;
}
