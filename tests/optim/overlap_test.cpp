// Overlap: with an artificial delay per backward layer and links slow enough that a bucket's
// all-reduce costs about as much as a layer (emulated: 2 nodes, 0.1 GB/s), starting each
// bucket's reduction as soon as its layer's gradient is ready finishes the step sooner than
// reducing everything after the backward. The ratio is printed. zero<0>: the sharded stages
// add a parameter all-gather after the update that neither schedule overlaps (yet).
#include <weft/comm/transport/local.hpp>
#include <weft/optim.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "support/scale.hpp"

namespace {

using namespace weft;
namespace wo = weft::optim;
using clock_type = std::chrono::steady_clock;

constexpr int layers = 6;
constexpr std::size_t per_layer =
    std::size_t{1} << 17; // 512 KiB of float per layer: ~5 ms to all-reduce on 2 ranks
constexpr auto delay = std::chrono::milliseconds(8);

double step_seconds(bool overlapped) {
  wo::param_set ps;
  for (int l = 0; l < layers; ++l)
    ps.add("layer" + std::to_string(l), {per_layer});
  double took = 0;
  local::run(
      topology::parse("2x1,inter=net:0.1GB/s:50us"),
      [&](local::communicator& c) {
        auto opt = wo::make_data_parallel<wo::zero<0>>(c, ps, wo::sgd{.lr = 0.1f},
                                                       {.bucket_elements = per_layer});
        c.barrier();
        const auto t0 = clock_type::now();
        for (int l = layers - 1; l >= 0; --l) { // backward: last layer first
          const std::string name = "layer" + std::to_string(l);
          std::this_thread::sleep_for(delay); // the layer's backward compute
          auto g = opt->grad(name);
          for (std::size_t i = 0; i < g.size(); i += 1024)
            g[i] = 1.0f;
          if (overlapped) opt->grad_ready(name); // its bucket's reduction starts now
        }
        (void)opt->step(); // otherwise: every bucket is reduced here, after the backward
        if (c.rank() == 0) took = std::chrono::duration<double>(clock_type::now() - t0).count();
      },
      local::options{.emulate_links = true});
  return took;
}

TEST(overlap, bucketed_async_reduction_finishes_the_step_sooner) {
  if (test::sanitized) GTEST_SKIP() << "timing test: not under a sanitizer";
  double best_ratio = 1e9, seq = 0, ovl = 0;
  for (int attempt = 0; attempt < 3 && best_ratio > 0.8;
       ++attempt) { // a loaded machine can delay either run
    seq = step_seconds(false);
    ovl = step_seconds(true);
    best_ratio = std::min(best_ratio, ovl / seq);
    std::printf(
        "backward + step: reduce after backward %.1f ms, bucketed async %.1f ms, ratio %.2f\n",
        seq * 1e3, ovl * 1e3, ovl / seq);
  }
  EXPECT_LT(best_ratio, 0.8);
}

} // namespace
