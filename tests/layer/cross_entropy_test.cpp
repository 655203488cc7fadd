// vocab_parallel_cross_entropy at TP 1..4 over vocabularies of 11 and 203 (uneven at 2, 3 and 4), float
// and double: the mean loss and d(loss)/d(logits) against log-sum-exp in double; the loss at every
// TP equal to TP 1's; large logits (stability); no communication in backward; errors.
#include <weft/comm/traced.hpp>
#include <weft/layer/cross_entropy.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "layer/layer_support.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;

constexpr std::size_t tokens = 9;

struct ce_ref {
  double loss = 0;
  dmat grad;
};

ce_ref reference(const dmat& logits, const std::vector<std::int32_t>& targets) {
  ce_ref r{0.0, dmat(logits.rows(), logits.cols())};
  const double n = static_cast<double>(logits.rows());
  for (std::size_t t = 0; t < logits.rows(); ++t) {
    double m = logits(t, 0);
    for (std::size_t v = 0; v < logits.cols(); ++v) m = std::max(m, logits(t, v));
    double s = 0;
    for (std::size_t v = 0; v < logits.cols(); ++v) s += std::exp(logits(t, v) - m);
    const auto y = static_cast<std::size_t>(targets[t]);
    r.loss += (std::log(s) + m - logits(t, y)) / n;
    for (std::size_t v = 0; v < logits.cols(); ++v)
      r.grad(t, v) = (std::exp(logits(t, v) - m) / s - (v == y ? 1.0 : 0.0)) / n;
  }
  return r;
}

template <class T>
void check(double offset, std::size_t vocab = 11) {
  std::vector<std::int32_t> targets = {0, 10, 4, 4, 7, 3, 9, 1, 6};
  if (vocab > 11) targets.back() = static_cast<std::int32_t>(vocab - 1);  // the last rank's last column
  dmat logits = tl::random_dmat(tokens, vocab, 12, 4.0);
  for (auto& v : logits.flat()) v += offset;
  tl::round_to<T>(logits);
  const ce_ref ref = reference(logits, targets);
  const double tol = tl::tolerance<T>;
  std::vector<double> losses(5);
  for (int tp = 1; tp <= 4; ++tp) {
    tl::run_ranks(tp, [&](weft::local::communicator& c) {
      weft::traced<weft::local::communicator> comm(std::move(c), "tp");
      wl::vocab_parallel_cross_entropy<T, decltype(comm)> ce(comm, vocab);
      const wl::range vr = ce.vocab_range();
      EXPECT_EQ(vr, wl::split_range(vocab, tp, comm.rank()));
      const double loss = ce.forward(tl::to<T>(tl::block(logits, 0, tokens, vr.begin, vr.size())), targets);
      EXPECT_EQ(comm.ops().size(), tp > 1 ? 2u : 0u);  // max, then target logits and sums packed
      comm.clear();
      weft::matrix<T> g(tokens, vr.size());
      ce.backward(g.view());
      EXPECT_TRUE(comm.ops().empty());
      const double loss_err = std::abs(loss - ref.loss) / std::abs(ref.loss);
      tl::note_error(tl::worst_error<T>(), loss_err);
      EXPECT_LT(loss_err, tol) << "tp=" << tp;
      EXPECT_LT(tl::rel_err(g, tl::block(ref.grad, 0, tokens, vr.begin, vr.size())), tol) << "tp=" << tp;
      if (comm.rank() == 0) losses[static_cast<std::size_t>(tp)] = loss;
    });
  }
  for (int tp = 2; tp <= 4; ++tp) EXPECT_LT(std::abs(losses[tp] - losses[1]) / losses[1], tol) << "tp=" << tp;
}

TEST(VocabParallelCrossEntropy, FloatMatchesReference) { check<float>(0.0); }
TEST(VocabParallelCrossEntropy, DoubleMatchesReference) { check<double>(0.0); }
// Rows wider than the lanes a row's statistics are taken by (exec.hpp's row_lanes), so that every
// lane sums several columns, unevenly, on every TP size.
TEST(VocabParallelCrossEntropy, RowsWiderThanTheLanes) {
  check<float>(0.0, 203);
  check<double>(0.0, 203);
}
TEST(VocabParallelCrossEntropy, LargeLogitsStayFinite) {
  check<float>(1000.0);  // exp(1000) overflows without the max shift
  check<double>(1000.0);
}

TEST(VocabParallelCrossEntropy, Errors) {
  tl::run_ranks(2, [](weft::local::communicator& c) {
    wl::vocab_parallel_cross_entropy<float, weft::local::communicator> ce(c, 5);
    weft::matrix<float> logits(2, c.rank() == 0 ? 3 : 2), bad(2, 4);
    tl::expect_error([&] { ce.backward(logits.view()); }, "before forward");
    const std::vector<std::int32_t> ok = {0, 4}, big = {0, 5};
    tl::expect_error([&] { (void)ce.forward(logits, big); }, "token 1 has target 5, outside the vocabulary [0, 5)");
    tl::expect_error([&] { (void)ce.forward(bad, ok); }, "logits is 2 x 4");
  });
}

} // namespace
