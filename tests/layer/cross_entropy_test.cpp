// vocab_parallel_cross_entropy at TP 1..4 over vocabularies of 11 and 203 (uneven at 2, 3 and 4),
// float and double: the mean loss and d(loss)/d(logits) against log-sum-exp in double; the loss at
// every TP equal to TP 1's; large logits (stability); no communication in backward; errors. The
// loss mask: targets equal to the ignore index (-100, or the constructor's) add nothing to the loss
// and get zero gradient rows; the counted tokens' summed loss over a divisor (0: their count), the
// gradient over the same divisor; a batch with nothing counted has loss 0 and zero gradient; an
// ignore index inside the vocabulary, and a target outside it that is not the ignore index, are
// refused.
#include <weft/comm/traced.hpp>
#include <weft/layer/cross_entropy.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
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

// The counted tokens' summed loss over `divisor` (0: over their count, 1 when none counts), and its
// gradient; a token whose target is `ignore` adds nothing and has a zero row.
ce_ref reference(const dmat& logits, const std::vector<std::int32_t>& targets,
                 std::int32_t ignore = -100, double divisor = 0) {
  ce_ref r{0.0, dmat(logits.rows(), logits.cols())};
  std::size_t counted = 0;
  for (const auto y : targets)
    counted += y != ignore ? 1 : 0;
  const double n = divisor > 0 ? divisor : static_cast<double>(std::max<std::size_t>(counted, 1));
  for (std::size_t t = 0; t < logits.rows(); ++t) {
    if (targets[t] == ignore) continue;
    double m = logits(t, 0);
    for (std::size_t v = 0; v < logits.cols(); ++v)
      m = std::max(m, logits(t, v));
    double s = 0;
    for (std::size_t v = 0; v < logits.cols(); ++v)
      s += std::exp(logits(t, v) - m);
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
  if (vocab > 11)
    targets.back() = static_cast<std::int32_t>(vocab - 1); // the last rank's last column
  dmat logits = tl::random_dmat(tokens, vocab, 12, 4.0);
  for (auto& v : logits.flat())
    v += offset;
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
      const double loss =
          ce.forward(tl::to<T>(tl::block(logits, 0, tokens, vr.begin, vr.size())), targets);
      EXPECT_EQ(comm.ops().size(), tp > 1 ? 2u : 0u); // max, then target logits and sums packed
      comm.clear();
      weft::matrix<T> g(tokens, vr.size());
      ce.backward(g.view());
      EXPECT_TRUE(comm.ops().empty());
      const double loss_err = std::abs(loss - ref.loss) / std::abs(ref.loss);
      tl::note_error(tl::worst_error<T>(), loss_err);
      EXPECT_LT(loss_err, tol) << "tp=" << tp;
      EXPECT_LT(tl::rel_err(g, tl::block(ref.grad, 0, tokens, vr.begin, vr.size())), tol)
          << "tp=" << tp;
      if (comm.rank() == 0) losses[static_cast<std::size_t>(tp)] = loss;
    });
  }
  for (int tp = 2; tp <= 4; ++tp)
    EXPECT_LT(std::abs(losses[tp] - losses[1]) / losses[1], tol) << "tp=" << tp;
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
  check<float>(1000.0); // exp(1000) overflows without the max shift
  check<double>(1000.0);
}

// The mask at TP 1..4: the loss and every gradient element against the reference, the ignored rows
// exactly 0 (dlogits starts as garbage), everything finite, the same loss on every rank.
template <class T>
void check_masked(std::size_t vocab, const std::vector<std::int32_t>& targets, std::int32_t ignore,
                  double divisor) {
  const std::size_t n = targets.size();
  dmat logits = tl::random_dmat(n, vocab, 21, 3.0);
  tl::round_to<T>(logits);
  const ce_ref ref = reference(logits, targets, ignore, divisor);
  const double tol = tl::tolerance<T>;
  for (int tp = 1; tp <= 4; ++tp) {
    SCOPED_TRACE("tp=" + std::to_string(tp) + " vocab=" + std::to_string(vocab) +
                 " ignore=" + std::to_string(ignore) + " divisor=" + std::to_string(divisor));
    tl::run_ranks(tp, [&](weft::local::communicator& c) {
      using ce_t = wl::vocab_parallel_cross_entropy<T, weft::local::communicator>;
      ce_t ce = ignore == -100 ? ce_t(c, vocab) : ce_t(c, vocab, {}, ignore);
      EXPECT_EQ(ce.ignore_index(), ignore);
      const wl::range vr = ce.vocab_range();
      const double loss =
          ce.forward(tl::to<T>(tl::block(logits, 0, n, vr.begin, vr.size())), targets, divisor);
      weft::matrix<T> g(n, vr.size(), T(123));
      ce.backward(g.view());
      ASSERT_TRUE(std::isfinite(loss));
      if (ref.loss == 0.0) {
        EXPECT_EQ(loss, 0.0);
      } else {
        const double e = std::abs(loss - ref.loss) / std::abs(ref.loss);
        tl::note_error(tl::worst_error<T>(), e);
        EXPECT_LT(e, tol) << loss << " vs " << ref.loss;
      }
      EXPECT_LT(tl::rel_err(g, tl::block(ref.grad, 0, n, vr.begin, vr.size())), tol);
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t v = 0; v < vr.size(); ++v) {
          ASSERT_TRUE(std::isfinite(static_cast<double>(g(t, v))));
          if (targets[t] == ignore) {
            EXPECT_EQ(g(t, v), T{0}) << "token " << t;
          }
        }
      }
    });
  }
}

template <class T>
void every_mask() {
  for (const std::size_t vocab : {std::size_t{11}, std::size_t{203}}) {
    const auto last = static_cast<std::int32_t>(vocab - 1);
    const std::vector<std::int32_t> some = {0, -100, 4, last, -100, 3, 9, 1, -100, 6};
    for (const double divisor : {0.0, 2.5, 20.0})
      check_masked<T>(vocab, some, -100, divisor);
    // A custom negative ignore index: -100 is then an ordinary (bad) target, tested with the
    // errors.
    const std::vector<std::int32_t> custom = {-7, 2, -7, last, 5, 5, -7};
    check_masked<T>(vocab, custom, -7, 0.0);
    check_masked<T>(vocab, custom, -7, 6.0);
    // An ignore index past the vocabulary's end is no token either.
    const auto past = static_cast<std::int32_t>(vocab);
    check_masked<T>(vocab, {past, 1, past, last}, past, 0.0);
    // Nothing counted: loss 0, zero gradient, with or without a divisor.
    check_masked<T>(vocab, {-100, -100, -100}, -100, 0.0);
    check_masked<T>(vocab, {-100, -100, -100}, -100, 4.0);
    check_masked<T>(vocab, {-7, -7}, -7, 0.0);
  }
}

TEST(VocabParallelCrossEntropy, IgnoredTargetsFloat) { every_mask<float>(); }
TEST(VocabParallelCrossEntropy, IgnoredTargetsDouble) { every_mask<double>(); }

TEST(VocabParallelCrossEntropy, IgnoreIndexErrors) {
  using ce_t = wl::vocab_parallel_cross_entropy<double, weft::local::communicator>;
  tl::run_ranks(2, [](weft::local::communicator& c) {
    // An ignore index that is a token of the vocabulary would silently drop that token.
    for (const std::int32_t bad : {0, 3, 10}) {
      tl::expect_error([&] { ce_t ce(c, 11, {}, bad); },
                       "ignore_index " + std::to_string(bad) + " is a token");
    }
    weft::matrix<double> logits(2, c.rank() == 0 ? 6 : 5);
    ce_t plain(c, 11);
    tl::expect_error(
        [&] {
          (void)plain.forward(logits, std::vector<std::int32_t>{1, -5});
        },
        "token 1 has target -5, outside the vocabulary [0, 11) and not the ignore_index -100");
    tl::expect_error(
        [&] {
          (void)plain.forward(logits, std::vector<std::int32_t>{11, 1});
        },
        "token 0 has target 11, outside the vocabulary [0, 11)");
    tl::expect_error(
        [&] {
          (void)plain.forward(logits, std::vector<std::int32_t>{1, 2}, -1.0);
        },
        "divisor");
    ce_t custom(c, 11, {}, -7);
    tl::expect_error(
        [&] {
          (void)custom.forward(logits, std::vector<std::int32_t>{-7, -100});
        },
        "token 1 has target -100, outside the vocabulary [0, 11) and not the ignore_index -7");
  });
}

TEST(VocabParallelCrossEntropy, Errors) {
  tl::run_ranks(2, [](weft::local::communicator& c) {
    wl::vocab_parallel_cross_entropy<float, weft::local::communicator> ce(c, 5);
    weft::matrix<float> logits(2, c.rank() == 0 ? 3 : 2), bad(2, 4);
    tl::expect_error([&] { ce.backward(logits.view()); }, "before forward");
    const std::vector<std::int32_t> ok = {0, 4}, big = {0, 5};
    tl::expect_error([&] { (void)ce.forward(logits, big); },
                     "token 1 has target 5, outside the vocabulary [0, 5)");
    tl::expect_error([&] { (void)ce.forward(bad, ok); }, "logits is 2 x 4");
  });
}

} // namespace
