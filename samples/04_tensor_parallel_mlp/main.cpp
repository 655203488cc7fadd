// A tensor-parallel MLP (column-parallel -> GELU -> row-parallel), trained with plain SGD to
// imitate a fixed "teacher" function, on 1 rank and on 2 in-process ranks: the two print the same
// losses, and weft::traced shows what the split costs: one all-reduce in the forward (after the
// row-parallel layer) and one in the backward (of the column-parallel layer's input gradient).
//
//   build/samples/04_tensor_parallel_mlp/weft_tensor_parallel_mlp
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/layer/mlp.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <mutex>
#include <vector>

namespace {

namespace wl = weft::layer;
using comm_t = weft::traced<weft::local::communicator>;

constexpr std::size_t tokens = 64, hidden = 32, ffn = 128;
constexpr int steps = 10;

// The data: inputs x and targets sin(x) . 0.5 (the same on every rank: without sequence
// parallelism every TP rank sees every token).
float input(std::size_t t, std::size_t c) {
  return std::sin(0.37f * static_cast<float>(t * hidden + c));
}
float target(std::size_t t, std::size_t c) { return 0.5f * std::sin(3.0f * input(t, c)); }

std::vector<double> train(int tp, bool print_ops) {
  std::vector<double> losses;
  std::mutex mu;
  weft::local::run(tp, [&](weft::local::communicator& c) {
    comm_t comm(std::move(c), "tp");
    wl::parallel_mlp<float, comm_t> mlp(comm, hidden, ffn, /*seed*/ 7, /*tensor id*/ 0);
    // Initial weights 5x the default 0.02, so that a few steps show progress.
    for (auto& p : mlp.parameters())
      for (std::size_t r = 0; r < p.value.rows(); ++r)
        for (std::size_t k = 0; k < p.value.cols(); ++k)
          p.value(r, k) *= 5.0f;
    weft::matrix<float> x(tokens, hidden), y(tokens, hidden), dy(tokens, hidden),
        dx(tokens, hidden);
    for (std::size_t t = 0; t < tokens; ++t)
      for (std::size_t k = 0; k < hidden; ++k)
        x(t, k) = input(t, k);
    for (int step = 0; step < steps; ++step) {
      mlp.zero_grad();
      comm.clear();
      mlp.forward(x.view(), y.view());
      double loss = 0.0; // mean squared error; every rank has all of y after the all-reduce
      for (std::size_t t = 0; t < tokens; ++t)
        for (std::size_t k = 0; k < hidden; ++k) {
          const float e = y(t, k) - target(t, k);
          loss += 0.5 * e * e / tokens;
          dy(t, k) = e / static_cast<float>(tokens);
        }
      mlp.backward(dy.view(), dx.view());
      for (auto& p : mlp.parameters())
        for (std::size_t r = 0; r < p.value.rows(); ++r)
          for (std::size_t k = 0; k < p.value.cols(); ++k)
            p.value(r, k) -= 0.05f * p.grad(r, k);
      if (comm.rank() == 0) {
        std::lock_guard lock(mu);
        losses.push_back(loss);
        if (print_ops && step == 0) {
          std::printf("rank 0's collectives in one step at TP=%d:\n", tp);
          for (const auto& op : comm.ops()) {
            std::printf("  %-14s %6zu floats on axis %s\n",
                        std::string(weft::name_of(op.kind)).c_str(), op.count, op.axis.c_str());
          }
        }
      }
    }
  });
  return losses;
}

} // namespace

int main() try {
  const auto one = train(1, false);
  const auto two = train(2, true);
  // TP=2 adds the row-parallel layer's two halves and the column-parallel input gradient's in
  // another order than TP=1 does in one GEMM: the losses agree to float rounding, not to the bit.
  // A wrong split or a missing all-reduce moves them by far more than 1e-5 within a step or two.
  constexpr double bound = 1e-5;
  double worst = 0;
  int not_finite =
      -1; // the first step whose losses differ by NaN or infinity (std::max skips a NaN)
  std::printf("\nstep   loss (TP=1)   loss (TP=2)   relative difference\n");
  for (int s = 0; s < steps; ++s) {
    const double diff = std::abs(two[s] - one[s]) / one[s];
    if (!std::isfinite(diff)) {
      if (not_finite < 0) not_finite = s;
    } else {
      worst = std::max(worst, diff);
    }
    std::printf("%4d   %11.6f   %11.6f   %19.1e\n", s, one[s], two[s], diff);
  }
  const bool same = not_finite < 0 && worst <= bound;
  if (not_finite >= 0) {
    std::printf("MISMATCH: at step %d a loss is not a finite number\n", not_finite);
  } else {
    std::printf("largest relative difference %.1e (bound %.0e): %s\n", worst, bound,
                same ? "the same losses" : "MISMATCH");
  }
  if (!same)
    std::fprintf(stderr, "weft_tensor_parallel_mlp: check failed: TP=1 and TP=2 losses differ\n");
  return same ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "weft_tensor_parallel_mlp: %s\n", e.what());
  return 1;
}
