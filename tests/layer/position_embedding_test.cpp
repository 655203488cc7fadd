// position_embedding against a serial reference in double (each row plus its position's table
// row; the table's gradient as the sum of the rows at each position, checked by finite
// differences of the forward), float and double: the deterministic init of the table, rows that
// start anywhere in a sequence, TP 1..4 with and without sequence parallelism (the table
// replicated; under sequence parallelism its partial gradients sum to the unsplit one after
// reduce_sequence_parallel_grads), its steps run in reverse order as a device may (the gradient
// bit for bit the host's), two micro-batches stashed and restored, and shape errors.
#include <weft/layer/init.hpp>
#include <weft/layer/position_embedding.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "layer/layer_support.hpp"
#include "layer/reversed_elements.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;

constexpr std::uint64_t seed = 9, id = 2;

struct pos_ref {
  dmat y, dw;
};

// Rows [first_row, first_row + y0.rows()) of a microbatch: y = y0 + w(position), dw(p) = the sum
// of dy over the rows at position p.
pos_ref reference(const dmat& y0, const dmat& dy, const dmat& w, std::uint64_t first_row) {
  const std::size_t seq = w.rows();
  pos_ref r{y0, dmat(seq, w.cols())};
  for (std::size_t i = 0; i < y0.rows(); ++i) {
    const std::size_t p = static_cast<std::size_t>((first_row + i) % seq);
    for (std::size_t c = 0; c < w.cols(); ++c) {
      r.y(i, c) += w(p, c);
      r.dw(p, c) += dy(i, c);
    }
  }
  return r;
}

TEST(PositionEmbeddingReference, GradientMatchesFiniteDifferences) {
  const dmat y0 = tl::random_dmat(11, 3, 1), dy = tl::random_dmat(11, 3, 2),
             w = tl::random_dmat(4, 3, 3);
  const pos_ref r = reference(y0, dy, w, 6);
  const auto loss = [&](const dmat& ww) {
    const dmat y = reference(y0, dy, ww, 6).y;
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i)
      s += dy.flat()[i] * y.flat()[i];
    return s;
  };
  const double h = 1e-6;
  for (std::size_t i = 0; i < w.size(); ++i) {
    dmat wp = w, wm = w;
    wp.flat()[i] += h;
    wm.flat()[i] -= h;
    EXPECT_NEAR(r.dw.flat()[i], (loss(wp) - loss(wm)) / (2 * h), 1e-8) << i;
  }
}

/// The table as the layer initialises it: init_normal over seq x hidden.
dmat init_table(std::size_t seq, std::size_t hidden, double stddev) {
  dmat w(seq, hidden);
  wl::init_normal(w.view(), hidden, 0, 0, seed, id, stddev);
  return w;
}

/// Checks the layer's table against the init (rounded to T), then puts in w.
template <class T, class Layer>
void load_table(Layer& pe, const dmat& w, double stddev) {
  dmat w0 = init_table(w.rows(), w.cols(), stddev);
  tl::round_to<T>(w0);
  auto ps = pe.parameters();
  for (std::size_t p = 0; p < w.rows(); ++p)
    for (std::size_t c = 0; c < w.cols(); ++c) {
      EXPECT_EQ(static_cast<double>(ps[0].value(p, c)), w0(p, c));
      ps[0].value(p, c) = static_cast<T>(w(p, c));
    }
}

// A microbatch of `batch` sequences of `seq` tokens on tp ranks.
template <class T, class SP, class Exec = wl::host_policy>
void check(int tp, std::size_t seq, std::size_t batch, std::size_t hidden = 7) {
  const std::size_t tokens = seq * batch;
  ASSERT_TRUE(!SP::enabled || tokens % static_cast<std::size_t>(tp) == 0);
  dmat y0 = tl::random_dmat(tokens, hidden, 4), dy = tl::random_dmat(tokens, hidden, 5),
       w = tl::random_dmat(seq, hidden, 6);
  for (dmat* m : {&y0, &dy, &w})
    tl::round_to<T>(*m);
  const pos_ref ref = reference(y0, dy, w, 0);
  const double tol = tl::tolerance<T>;
  tl::run_ranks(tp, [&](weft::local::communicator& comm) {
    const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
    const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(comm.rank()) : 0;
    const Exec exec;
    wl::position_embedding<T, SP, Exec> pe(seq, hidden, seed, id, 0.05, exec);
    EXPECT_EQ(pe.seq(), seq);
    EXPECT_EQ(pe.hidden(), hidden);
    load_table<T>(pe, w, 0.05);
    auto y = tl::to<T>(tl::block(y0, row0, local, 0, hidden));
    pe.forward(y.view(), row0);
    pe.backward(tl::to<T>(tl::block(dy, row0, local, 0, hidden)));
    const std::string where = "tp=" + std::to_string(tp) + " rank " + std::to_string(comm.rank());
    EXPECT_LT(tl::rel_err(y, tl::block(ref.y, row0, local, 0, hidden)), tol) << where;
    auto ps = pe.parameters();
    ASSERT_EQ(ps.size(), 1u);
    EXPECT_EQ(ps[0].name, "weight");
    EXPECT_TRUE(ps[0].replicated);
    EXPECT_EQ(ps[0].sequence_partial, SP::enabled);
    EXPECT_TRUE(ps[0].decay);
    EXPECT_FALSE(ps[0].duplicate);
    EXPECT_EQ(ps[0].row0 + ps[0].col0, 0u);
    EXPECT_EQ(ps[0].full_rows, seq);
    EXPECT_EQ(ps[0].full_cols, hidden);
    if constexpr (!std::is_same_v<Exec, wl::host_policy>) {
      EXPECT_EQ(*exec.steps, 2u) << where; // the forward's sums, the gradient's columns
    }
    wl::reduce_sequence_parallel_grads(comm, std::span<wl::parameter<T>>(ps));
    EXPECT_LT(tl::rel_err(ps[0].grad, ref.dw), tol) << where;
    pe.zero_grad();
    EXPECT_EQ(ps[0].grad(0, 0), T{0});
  });
}

TEST(PositionEmbedding, MatchesReference) {
  check<float, wl::no_sequence_parallel>(1, 4, 3);
  check<double, wl::no_sequence_parallel>(1, 4, 3);
  check<double, wl::no_sequence_parallel>(3, 8, 5); // replicated: every rank holds every token
}

// Ranks whose rows start inside a sequence (tp 2 and 4 of 3 sequences), and 22 tokens a position.
TEST(PositionEmbedding, SequenceParallelGradsSumOverRanks) {
  for (int tp = 1; tp <= 4; ++tp) {
    check<float, wl::sequence_parallel>(tp, 4, 3);
    check<double, wl::sequence_parallel>(tp, 8, 3);
    check<double, wl::sequence_parallel>(tp, 6, 22,
                                         3); // rows start inside a sequence at tp 3 and 4 too
  }
}

TEST(PositionEmbedding, DoesNotDependOnTheOrderOfItsSteps) {
  check<double, wl::no_sequence_parallel, tl::reversed_elements>(1, 4, 3);
  check<float, wl::sequence_parallel, tl::reversed_elements>(4, 8, 3);
  // The gradient of a position that repeats, bit for bit the host's (a device's column sums in
  // token order).
  const std::size_t seq = 3, hidden = 5, tokens = 300;
  const auto dy = tl::to<float>(tl::random_dmat(tokens, hidden, 8));
  wl::position_embedding<float> host(seq, hidden, seed, id);
  wl::position_embedding<float, wl::no_sequence_parallel, tl::reversed_elements> reversed(
      seq, hidden, seed, id);
  weft::matrix<float> y(tokens, hidden);
  host.forward(y.view(), 1);
  reversed.forward(y.view(), 1);
  host.backward(dy);
  reversed.backward(dy);
  const auto a = host.parameters()[0].grad, b = reversed.parameters()[0].grad;
  for (std::size_t p = 0; p < seq; ++p)
    for (std::size_t c = 0; c < hidden; ++c)
      EXPECT_EQ(a(p, c), b(p, c)) << p << "," << c;
}

// Rows that start anywhere: first_row counts from the microbatch's first token, so it can be large.
TEST(PositionEmbedding, FirstRowAnywhere) {
  const std::size_t seq = 6, hidden = 4, rows = 10;
  const std::uint64_t first = 1'000'000'000'009; // 1 mod 6
  dmat y0 = tl::random_dmat(rows, hidden, 9), dy = tl::random_dmat(rows, hidden, 10),
       w = tl::random_dmat(seq, hidden, 11);
  const pos_ref ref = reference(y0, dy, w, first);
  wl::position_embedding<double> pe(seq, hidden, seed, id);
  load_table<double>(pe, w, 0.02);
  auto y = tl::to<double>(y0);
  pe.forward(y.view(), first);
  pe.backward(tl::to<double>(dy));
  EXPECT_LT(tl::rel_err(y, ref.y), tl::tolerance<double>);
  EXPECT_LT(tl::rel_err(pe.parameters()[0].grad, ref.dw), tl::tolerance<double>);
}

// Two micro-batches forward (rows at different offsets), each stashed; restored and run backward
// in the other order: the table's gradient is the sum of both.
template <class T>
void check_stash() {
  const std::size_t seq = 5, hidden = 4;
  dmat y1 = tl::random_dmat(6, hidden, 12), y2 = tl::random_dmat(9, hidden, 13);
  dmat dy1 = tl::random_dmat(6, hidden, 14), dy2 = tl::random_dmat(9, hidden, 15),
       w = tl::random_dmat(seq, hidden, 16);
  for (dmat* m : {&y1, &y2, &dy1, &dy2, &w})
    tl::round_to<T>(*m);
  const pos_ref r1 = reference(y1, dy1, w, 2), r2 = reference(y2, dy2, w, 8);
  dmat dw(seq, hidden);
  for (std::size_t i = 0; i < dw.size(); ++i)
    dw.flat()[i] = r1.dw.flat()[i] + r2.dw.flat()[i];

  wl::position_embedding<T> pe(seq, hidden, seed, id, 0.02, {}, /*decay*/ false);
  EXPECT_FALSE(pe.parameters()[0].decay);
  load_table<T>(pe, w, 0.02);
  auto a = tl::to<T>(y1), b = tl::to<T>(y2);
  pe.forward(a.view(), 2);
  auto s1 = pe.stash();
  tl::expect_error([&] { pe.backward(tl::to<T>(dy1)); },
                   "position_embedding::backward: called before forward");
  pe.forward(b.view(), 8);
  auto s2 = pe.stash();
  pe.restore(s2);
  pe.backward(tl::to<T>(dy2));
  pe.restore(s1);
  tl::expect_error([&] { pe.backward(tl::to<T>(dy2)); },
                   "position_embedding::backward: dy is 9 x 4, expected 6 x 4");
  pe.backward(tl::to<T>(dy1));
  const double tol = tl::tolerance<T>;
  EXPECT_LT(tl::rel_err(a, r1.y), tol);
  EXPECT_LT(tl::rel_err(b, r2.y), tol);
  EXPECT_LT(tl::rel_err(pe.parameters()[0].grad, dw), tol);
  EXPECT_EQ(pe.saved_bytes(), 0u);
  pe.release();
  tl::expect_error([&] { pe.backward(tl::to<T>(dy1)); }, "called before forward");
}

TEST(PositionEmbedding, StashRestoreRoundTrip) {
  check_stash<float>();
  check_stash<double>();
}

TEST(PositionEmbedding, Errors) {
  wl::position_embedding<float> pe(4, 3, seed, id);
  weft::matrix<float> y(2, 3), bad(2, 5);
  tl::expect_error([&] { pe.backward(y); }, "position_embedding::backward: called before forward");
  tl::expect_error([&] { pe.forward(bad.view(), 0); },
                   "position_embedding::forward: y is 2 x 5, expected 2 x 3");
  pe.forward(y.view(), 0);
  tl::expect_error([&] { pe.backward(bad); },
                   "position_embedding::backward: dy is 2 x 5, expected 2 x 3");
  tl::expect_error([] { wl::position_embedding<float> z(0, 3, seed, id); },
                   "position_embedding: seq and hidden must be positive");
  tl::expect_error([] { wl::position_embedding<float> z(4, 0, seed, id); },
                   "position_embedding: seq and hidden must be positive");
}

} // namespace
