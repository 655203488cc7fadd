// One transformer block on the device path (weft::layer::cublas, one emulated rank, float): the
// issue-6 block (hidden 1024, 16 heads, sequence 256, micro-batch 4), forward and backward, timed
// with CUDA events over back-to-back iterations, against the same block's twelve dense GEMMs
// (QKV, output projection, MLP in and out: forward, input gradient, weight gradient) run alone
// through cuBLAS on the same stream in the same run. gemm_share = GEMM-only time / block time:
// what the rest (attention core, softmax, LayerNorm, GELU, bias, residuals, copies) costs on top.
// The inputs, output gradients and the GEMMs' operands are random (on zeros the GPU clocks
// higher). Without a GPU each row reports "no CUDA device" (SkipWithError).
//
//   build/benchmarks/cuda_layer_block_bench --benchmark_counters_tabular=true
#include <weft/cuda/emulated.cuh>
#include <weft/layer/block.hpp>
#include <weft/layer/cuda/cublas.cuh>
#include <weft/layer/cuda/matrix.cuh>

#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace {

namespace wl = weft::layer;
namespace emulated = weft::cuda::emulated;

constexpr std::size_t hidden = 1024, heads = 16, seq = 256, batch = 4, tokens = seq * batch;
constexpr int warmup = 3, timed = 20;

struct timing {
  double block_s = 0;
  double gemm_s = 0;
};

// Uniform values in [-1, 1) from a fixed seed, copied into m: GEMMs on zeros draw less power
// and so run at higher clocks than on real data.
void fill_random(weft::device_matrix<float>& m, std::uint32_t seed, cudaStream_t s) {
  weft::matrix<float> h(m.rows(), m.cols());
  for (std::size_t r = 0; r < h.rows(); ++r) {
    for (std::size_t c = 0; c < h.cols(); ++c) {
      seed = seed * 1664525u + 1013904223u;
      h(r, c) = static_cast<float>(seed >> 8) / 8388608.0f - 1.0f;
    }
  }
  m.copy_from(h.view(), s);
}

timing measure() {
  timing t;
  emulated::run(1, [&](emulated::communicator& c) {
    const cudaStream_t s = c.stream();
    const wl::cublas gemm(s);
    wl::transformer_block<float, emulated::communicator, wl::cublas> blk(
        c, {.hidden = hidden, .heads = heads, .ffn = 4 * hidden, .seq = seq}, 1, 1, gemm);
    weft::device_matrix<float> x(tokens, hidden, s), y(tokens, hidden, s), dy(tokens, hidden, s),
        dx(tokens, hidden, s);
    fill_random(x, 1, s);
    fill_random(dy, 2, s);
    const auto step = [&] {
      blk.forward(x.cview(), y.view());
      blk.backward(dy.cview(), dx.view());
    };
    const weft::cuda::event start(true), stop(true);
    for (int i = 0; i < warmup; ++i)
      step();
    start.record(s);
    for (int i = 0; i < timed; ++i)
      step();
    stop.record(s);
    t.block_s = stop.elapsed_ms(start) * 1e-3 / timed;

    // The dense GEMMs alone: for each linear (in -> out), y = x W^T, dx = dy W, dW += dy^T x.
    // x, dy and W are inputs that no call writes: fed back (x = dy W, dy = x W^T, unscaled), the
    // operands grew some 600x per call and were inf/NaN from about the 12th of the 23 calls.
    const std::array<std::array<std::size_t, 2>, 4> linears{
        {{hidden, 3 * hidden}, {hidden, hidden}, {hidden, 4 * hidden}, {4 * hidden, hidden}}};
    std::array<weft::device_matrix<float>, 4> w, dw, xs, ys, dys, dxs;
    for (std::size_t l = 0; l < 4; ++l) {
      const auto [i, o] = linears[l];
      w[l].resize(o, i, s);
      dw[l].resize(o, i, s);
      xs[l].resize(tokens, i, s);
      dxs[l].resize(tokens, i, s);
      ys[l].resize(tokens, o, s);
      dys[l].resize(tokens, o, s);
      fill_random(w[l], 10 + static_cast<std::uint32_t>(l), s);
      fill_random(xs[l], 20 + static_cast<std::uint32_t>(l), s);
      fill_random(dys[l], 30 + static_cast<std::uint32_t>(l), s);
    }
    const auto gemms = [&] {
      for (std::size_t l = 0; l < 4; ++l) {
        gemm(wl::trans::n, wl::trans::t, 1.0f, xs[l].cview(), w[l].cview(), 0.0f, ys[l].view());
        gemm(wl::trans::n, wl::trans::n, 1.0f, dys[l].cview(), w[l].cview(), 0.0f, dxs[l].view());
        // dW only accumulates the same bounded product (23 times in all): it cannot overflow.
        gemm(wl::trans::t, wl::trans::n, 1.0f, dys[l].cview(), xs[l].cview(), 1.0f, dw[l].view());
      }
    };
    for (int i = 0; i < warmup; ++i)
      gemms();
    start.record(s);
    for (int i = 0; i < timed; ++i)
      gemms();
    stop.record(s);
    t.gemm_s = stop.elapsed_ms(start) * 1e-3 / timed;
  });
  return t;
}

void block_forward_backward(benchmark::State& state) {
  if (const std::string why = weft::cuda::no_device_reason(); !why.empty()) {
    state.SkipWithError(why.c_str());
    return;
  }
  timing t;
  for (auto _ : state) {
    t = measure();
    state.SetIterationTime(t.block_s);
  }
  const double h = hidden, n = tokens;
  const double dense = 3 * 24 * n * h * h; // forward + backward of the four linears
  const double core = 3 * 4 * n * seq * h; // QK^T and PV (the full square), forward + backward
  state.counters["block_ms"] = t.block_s * 1e3;
  state.counters["gemm_ms"] = t.gemm_s * 1e3;
  state.counters["gemm_share"] = t.gemm_s / t.block_s;
  state.counters["block_TFLOPs"] = (dense + core) / t.block_s / 1e12;
  state.counters["gemm_TFLOPs"] = dense / t.gemm_s / 1e12;
}

BENCHMARK(block_forward_backward)
    ->Name("layer_block/float/tp1")
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();
