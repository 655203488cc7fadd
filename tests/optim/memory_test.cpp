// memory_report() against the ZeRO paper's per-rank formulas (Rajbhandari et al., 2020) for
// mixed-precision Adam (K = 12: fp32 master weights, momentum, variance), half parameters
// and gradients, Psi parameters on N data-parallel ranks:
//   zero<0>: (2 + 2 + K) Psi      zero<1>: 2 Psi + 2 Psi + K Psi / N
//   zero<2>: 2 Psi + (2 + K) Psi / N      zero<3>: (2 + 2 + K) Psi / N
// with Psi the padded element count the layout reports (every bucket rounded up to a
// multiple of N); padding itself is checked to be under one element per rank per bucket.
#include <weft/comm/transport/local.hpp>
#include <weft/optim.hpp>

#include <gtest/gtest.h>

#include <cstdio>

namespace {

using namespace weft;
namespace wo = weft::optim;

wo::param_set model() {
  wo::param_set ps;
  ps.add("embed", {1000, 7});
  ps.add("fc1.w", {333, 11});
  ps.add("fc1.b", {333});
  ps.add("fc2.w", {5, 333});
  ps.add("fc2.b", {5});
  return ps;
}

struct expected {
  std::size_t params, grads, state_and_master;
};

template <int Stage>
expected formula(std::size_t psi, std::size_t n) {
  const std::size_t k = 12;
  switch (Stage) {
    case 0: return {2 * psi, 2 * psi, k * psi};
    case 1: return {2 * psi, 2 * psi, k * psi / n};
    case 2: return {2 * psi, 2 * psi / n, k * psi / n};
    default: return {2 * psi / n, 2 * psi / n, k * psi / n};
  }
}

template <int Stage>
void check(int n) {
  const auto ps = model();
  local::run(n, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<Stage>, half>(c, ps, wo::adamw{},
                                                             {.bucket_elements = 4000});
    const auto m = opt->memory();
    const auto& l = opt->buckets();
    const std::size_t shards = Stage == 0 ? 1 : static_cast<std::size_t>(n);
    const std::size_t psi = l.padded_elements();
    EXPECT_EQ(psi, ps.elements() + m.padding_elements);
    EXPECT_LT(m.padding_elements,
              shards * l.buckets().size()); // under one element per shard and bucket
    const auto e = formula<Stage>(psi, static_cast<std::size_t>(n));
    EXPECT_EQ(m.parameters, e.params);
    EXPECT_EQ(m.gradients, e.grads);
    EXPECT_EQ(m.optimizer_state + m.master_weights, e.state_and_master);
    EXPECT_EQ(m.master_weights, 4 * psi / (Stage == 0 ? 1 : static_cast<std::size_t>(n)));
    EXPECT_LT(m.slot_gap, 2 * (2064 + 16) * sizeof(float)); // the gap between Adam's two slots
    if (c.rank() == 0) {
      std::printf(
          "zero<%d> N=%d: Psi %zu (+%zu padding) params %zu grads %zu state %zu master %zu total "
          "%zu B "
          "(formula %zu)\n",
          Stage, n, ps.elements(), m.padding_elements, m.parameters, m.gradients, m.optimizer_state,
          m.master_weights, m.total() - m.slot_gap, e.params + e.grads + e.state_and_master);
    }
  });
}

TEST(memory_report, matches_the_zero_formulas) {
  for (int n : {1, 2, 4, 8}) {
    check<0>(n);
    check<1>(n);
    check<2>(n);
    check<3>(n);
  }
}

// zero<2>: the full-size gradient bucket exists only between grad() and its reduction (run
// inline, so that the progress thread's lag does not keep several alive). The gradients come
// as a backward makes them, the last tensor first, which is the order buckets reduce in.
TEST(memory_report, zero2_frees_each_bucket_after_its_reduction) {
  const auto ps = model();
  local::run(4, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<2>, half>(
        c, ps, wo::adamw{}, {.bucket_elements = 4000, .overlap = false});
    for (auto t = ps.tensors().rbegin(); t != ps.tensors().rend(); ++t) {
      for (auto& g : opt->grad(t->name))
        g = half(1.0f);
      opt->grad_ready(t->name);
    }
    (void)opt->step();
    std::size_t biggest = 0;
    for (const auto& b : opt->buckets().buckets())
      biggest = std::max(biggest, b.padded);
    const auto m = opt->memory();
    EXPECT_GT(m.transient_peak, 0u);
    // Not every bucket at once: the whole model's gradients would be 2 * padded bytes.
    EXPECT_EQ(m.transient_peak, 2 * (biggest + biggest / 4)); // one bucket and its reduced shard
  });
}

} // namespace
