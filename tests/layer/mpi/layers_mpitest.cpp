// The tensor-parallel layers on MPI processes, one TP rank each (ctest: mpirun -n 2 and -n 4),
// through weft::traced<weft::mpi::communicator>: a column -> GELU -> row MLP (parallel_mlp), with
// and without sequence parallelism, and a vocab-parallel embedding -> column-parallel LM head ->
// vocab-parallel cross-entropy over a vocabulary that does not divide by 2 or 4, equal the serial
// reference written out in double here (outputs, loss, input and parameter gradients), with the
// expected collectives. The same layers on threads: tests/layer/*_test.cpp.
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/mpi.hpp>
#include <weft/layer/cross_entropy.hpp>
#include <weft/layer/embedding.hpp>
#include <weft/layer/mlp.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "comm/transport/mpi/mpi_support.hpp"
#include "layer/layer_support.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;
using tp_comm = weft::traced<weft::mpi::communicator>;

static_assert(weft::plan_executor<tp_comm>);

tp_comm make_tp() {
  auto& world = weft::test::mpi_world();
  return tp_comm(world.split(0, world.rank()), "tp");
}

double gelu(double x) {
  const double s = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad(double x) {
  const double s = std::sqrt(2.0 / 3.14159265358979323846),
               t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3 * 0.044715 * x * x);
}

template <class T, class SP>
void check_mlp() {
  constexpr std::size_t tokens = 12, hidden = 6, ffn = 10;
  constexpr std::uint64_t seed = 5, id = 2;
  tp_comm tp = make_tp();
  const int p = tp.size();
  dmat x = tl::random_dmat(tokens, hidden, 1), dy = tl::random_dmat(tokens, hidden, 2);
  dmat w1(ffn, hidden), w2(hidden, ffn);
  wl::init_normal(w1.view(), hidden, 0, 0, seed, id, 0.02);
  wl::init_normal(w2.view(), ffn, 0, 0, seed, id + 1, 0.02);
  for (dmat* m : {&x, &dy, &w1, &w2})
    tl::round_to<T>(*m);
  // The serial MLP (biases stay at their initial zero).
  const dmat h = tl::ref_linear(x, w1, nullptr);
  dmat a(tokens, ffn), dh(tokens, ffn);
  for (std::size_t i = 0; i < a.size(); ++i)
    a.flat()[i] = gelu(h.flat()[i]);
  const dmat y = tl::ref_linear(a, w2, nullptr);
  const dmat da = tl::ref_linear_dx(dy, w2);
  for (std::size_t i = 0; i < dh.size(); ++i)
    dh.flat()[i] = da.flat()[i] * gelu_grad(h.flat()[i]);
  const dmat dx = tl::ref_linear_dx(dh, w1), dw1 = tl::ref_linear_dw(dh, x),
             dw2 = tl::ref_linear_dw(dy, a);
  const dmat db2 = tl::ref_colsum(dy, 0, tokens);

  wl::parallel_mlp<T, tp_comm, wl::cblas, SP> m(tp, hidden, ffn, seed, id);
  const wl::range fr = m.fc1().out_range();
  const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(p) : tokens;
  const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(tp.rank()) : 0;
  weft::matrix<T> yl(local, hidden), dxl(local, hidden);
  m.forward(tl::to<T>(tl::block(x, row0, local, 0, hidden)), yl.view());
  m.backward(tl::to<T>(tl::block(dy, row0, local, 0, hidden)), dxl.view());
  auto ps = m.parameters();
  wl::reduce_sequence_parallel_grads(tp, std::span<wl::parameter<T>>(ps));
  const double tol = tl::tolerance<T>;
  const std::string where = "np=" + std::to_string(p) + " rank " + std::to_string(tp.rank());
  EXPECT_LT(tl::rel_err(yl, tl::block(y, row0, local, 0, hidden)), tol) << where;
  EXPECT_LT(tl::rel_err(dxl, tl::block(dx, row0, local, 0, hidden)), tol) << where;
  EXPECT_LT(tl::rel_err(ps[0].grad, tl::block(dw1, fr.begin, fr.size(), 0, hidden)), tol) << where;
  EXPECT_LT(tl::rel_err(ps[2].grad, tl::block(dw2, 0, hidden, fr.begin, fr.size())), tol) << where;
  EXPECT_LT(tl::rel_err(ps[3].grad, db2), tol) << where;
  // Forward and backward: 1 all-reduce each, or 1 all-gather + 1 reduce-scatter each, then the
  // sequence-parallel bias reduction.
  EXPECT_EQ(tp.count(weft::collective::all_reduce), SP::enabled ? 1u : 2u) << where;
  EXPECT_EQ(tp.count(weft::collective::all_gather), SP::enabled ? 2u : 0u) << where;
  EXPECT_EQ(tp.count(weft::collective::reduce_scatter), SP::enabled ? 2u : 0u) << where;
}

TEST(LayersMpi, MlpFloat) { check_mlp<float, wl::no_sequence_parallel>(); }
TEST(LayersMpi, MlpDouble) { check_mlp<double, wl::no_sequence_parallel>(); }
TEST(LayersMpi, MlpSequenceParallelFloat) { check_mlp<float, wl::sequence_parallel>(); }
TEST(LayersMpi, MlpSequenceParallelDouble) { check_mlp<double, wl::sequence_parallel>(); }

// embedding (vocab 11) -> LM head y W^T (no bias, columns split like the embedding's rows) -> CE.
template <class T>
void check_embedding_cross_entropy() {
  constexpr std::size_t tokens = 8, vocab = 11, hidden = 5;
  const std::vector<std::int32_t> ids = {3, 0, 10, 3, 7, 5, 1, 9},
                                  targets = {0, 10, 4, 4, 7, 3, 9, 1};
  tp_comm tp = make_tp();
  dmat table(vocab, hidden), head(vocab, hidden);
  wl::init_normal(table.view(), hidden, 0, 0, 8, 1, 1.0);
  wl::init_normal(head.view(), hidden, 0, 0, 8, 2, 1.0);
  tl::round_to<T>(table);
  tl::round_to<T>(head);
  dmat e(tokens, hidden);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t c = 0; c < hidden; ++c)
      e(t, c) = table(static_cast<std::size_t>(ids[t]), c);
  const dmat logits = tl::ref_linear(e, head, nullptr);
  double loss = 0;
  dmat dlogits(tokens, vocab);
  for (std::size_t t = 0; t < tokens; ++t) {
    double m = logits(t, 0), s = 0;
    for (std::size_t v = 0; v < vocab; ++v)
      m = std::max(m, logits(t, v));
    for (std::size_t v = 0; v < vocab; ++v)
      s += std::exp(logits(t, v) - m);
    loss += (std::log(s) + m - logits(t, static_cast<std::size_t>(targets[t]))) / tokens;
    for (std::size_t v = 0; v < vocab; ++v)
      dlogits(t, v) = (std::exp(logits(t, v) - m) / s -
                       (v == static_cast<std::size_t>(targets[t]) ? 1.0 : 0.0)) /
                      tokens;
  }
  const dmat dhead = tl::ref_linear_dw(dlogits, e), de = tl::ref_linear_dx(dlogits, head);
  dmat dtable(vocab, hidden);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t c = 0; c < hidden; ++c)
      dtable(static_cast<std::size_t>(ids[t]), c) += de(t, c);

  wl::vocab_parallel_embedding<T, tp_comm> emb(tp, vocab, hidden, 8, 1, 1.0);
  wl::column_parallel_linear<T, tp_comm> lm(
      tp, hidden, vocab, 8, 2, {.bias = false, .gather_output = false, .init_std = 1.0});
  wl::vocab_parallel_cross_entropy<T, tp_comm> ce(tp, vocab);
  const wl::range vr = ce.vocab_range();
  ASSERT_EQ(vr, lm.out_range());
  weft::matrix<T> y(tokens, hidden), lg(tokens, vr.size()), dlg(tokens, vr.size()),
      dy(tokens, hidden);
  emb.forward(ids, y.view());
  lm.forward(y, lg.view());
  const double got = ce.forward(lg, targets);
  ce.backward(dlg.view());
  lm.backward(dlg, dy.view());
  emb.backward(dy);
  const double tol = tl::tolerance<T>;
  const std::string where =
      "np=" + std::to_string(tp.size()) + " rank " + std::to_string(tp.rank());
  const double loss_err = std::abs(got - loss) / loss;
  tl::note_error(tl::worst_error<T>(), loss_err);
  EXPECT_LT(loss_err, tol) << where << " loss " << got << " vs " << loss;
  EXPECT_LT(tl::rel_err(lm.parameters()[0].grad, tl::block(dhead, vr.begin, vr.size(), 0, hidden)),
            tol)
      << where;
  EXPECT_LT(
      tl::rel_err(emb.parameters()[0].grad, tl::block(dtable, vr.begin, vr.size(), 0, hidden)), tol)
      << where;
  // embedding 1 + CE 2 + LM head backward 1 all-reduces.
  EXPECT_EQ(tp.count(weft::collective::all_reduce), 4u) << where;
}

TEST(LayersMpi, EmbeddingCrossEntropyFloat) { check_embedding_cross_entropy<float>(); }
TEST(LayersMpi, EmbeddingCrossEntropyDouble) { check_embedding_cross_entropy<double>(); }

} // namespace
