// vocab_parallel_embedding at TP 1..4 over a vocabulary of 11 (uneven at 2, 3 and 4), with and
// without sequence parallelism, float and double, against a plain table lookup: the output, the
// table gradient with repeated ids (accumulated), the communication, and out-of-range ids.
#include <weft/comm/traced.hpp>
#include <weft/layer/embedding.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "layer/layer_support.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;
using weft::collective;

constexpr std::size_t tokens = 12, vocab = 11, hidden = 5;

template <class T, class SP>
void check(int tp) {
  const std::vector<std::int32_t> ids = {3, 0, 10, 3, 7,  5,
                                         5, 5, 1,  9, 10, 2}; // repeats, both ends
  dmat table(vocab, hidden);
  wl::init_normal(table.view(), hidden, 0, 0, 8, 1, 0.02);
  tl::round_to<T>(table);
  dmat dy = tl::random_dmat(tokens, hidden, 3);
  tl::round_to<T>(dy);
  dmat y(tokens, hidden), dw(vocab, hidden);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t c = 0; c < hidden; ++c) {
      y(t, c) = table(static_cast<std::size_t>(ids[t]), c);
      dw(static_cast<std::size_t>(ids[t]), c) += dy(t, c);
    }
  const double tol = tl::tolerance<T>;
  tl::run_ranks(tp, [&](weft::local::communicator& c) {
    weft::traced<weft::local::communicator> comm(std::move(c), "tp");
    wl::vocab_parallel_embedding<T, decltype(comm), SP> emb(comm, vocab, hidden, 8, 1);
    const wl::range vr = emb.vocab_range();
    EXPECT_EQ(vr, wl::split_range(vocab, tp, comm.rank()));
    const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
    const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(comm.rank()) : 0;
    weft::matrix<T> yl(local, hidden);
    const auto dyl = tl::to<T>(tl::block(dy, row0, local, 0, hidden));
    for (int pass = 1; pass <= 2; ++pass) {
      comm.clear();
      emb.forward(ids, yl.view());
      emb.backward(dyl);
      EXPECT_LT(tl::rel_err(yl, tl::block(y, row0, local, 0, hidden)), tol);
      EXPECT_LT(tl::rel_err(emb.parameters()[0].grad,
                            tl::scaled(tl::block(dw, vr.begin, vr.size(), 0, hidden), pass)),
                tol);
      std::vector<weft::traced_op> want;
      if (tp > 1) {
        if (SP::enabled) {
          want = {{collective::reduce_scatter, local * hidden, weft::dtype_of<T>, "tp"},
                  {collective::all_gather, local * hidden, weft::dtype_of<T>, "tp"}};
        } else {
          want = {{collective::all_reduce, tokens * hidden, weft::dtype_of<T>, "tp"}};
        }
      }
      EXPECT_EQ(comm.ops(), want);
    }
  });
}

TEST(VocabParallelEmbedding, MatchesLookup) {
  for (int tp = 1; tp <= 4; ++tp) {
    check<float, wl::no_sequence_parallel>(tp);
    check<double, wl::no_sequence_parallel>(tp);
    check<float, wl::sequence_parallel>(tp);
    check<double, wl::sequence_parallel>(tp);
  }
}

TEST(VocabParallelEmbedding, Errors) {
  tl::run_ranks(2, [](weft::local::communicator& c) {
    wl::vocab_parallel_embedding<float, weft::local::communicator> emb(c, 5, 3, 1, 1);
    weft::matrix<float> y(2, 3), bad(2, 4);
    tl::expect_error([&] { emb.backward(y); }, "before forward");
    const std::vector<std::int32_t> big = {1, 5}, neg = {-1, 0}, ok = {1, 2};
    tl::expect_error([&] { emb.forward(big, y.view()); },
                     "token 1 has id 5, outside the vocabulary [0, 5)");
    tl::expect_error([&] { emb.forward(neg, y.view()); }, "token 0 has id -1");
    tl::expect_error([&] { emb.forward(ok, bad.view()); }, "y is 2 x 4, expected 2 x 3");
    wl::vocab_parallel_embedding<float, weft::local::communicator, wl::sequence_parallel> sp(
        c, 5, 3, 1, 1);
    const std::vector<std::int32_t> three = {1, 2, 3};
    weft::matrix<float> y1(1, 3);
    tl::expect_error([&] { sp.forward(three, y1.view()); }, "3 tokens over 2 ranks");
  });
}

// The device gradient's run functor on the host: the tokens sorted by id here (std::stable_sort
// of the token indices), the functor called for every (k, c) backwards (no order between threads),
// on a rank holding ids [2, 9); against the token-order loop dw(id) += g(t), bit for bit (values
// that round, so a changed order shows).
TEST(VocabParallelEmbedding, GradientByRunsMatchesTokenOrder) {
  const std::vector<std::int32_t> ids = {3, 0, 8, 3, 7, 5, 5, 5, 1, 9, 8, 2, 3, 10, 2};
  const std::size_t n = ids.size(), cols = 3, begin = 2, rows = 7;
  weft::matrix<float> g(n, cols);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t c = 0; c < cols; ++c)
      g(t, c) = 1.0f / static_cast<float>(3 + t * cols + c);
  weft::matrix<float> expected(rows, cols), got(rows, cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      expected(r, c) = got(r, c) = 0.25f * static_cast<float>(r + c); // gradients accumulate
  for (std::size_t t = 0; t < n; ++t) {
    const auto id = static_cast<std::size_t>(ids[t]);
    if (id < begin || id >= begin + rows) continue;
    for (std::size_t c = 0; c < cols; ++c)
      expected(id - begin, c) += g(t, c);
  }
  std::vector<std::int32_t> positions(n);
  for (std::size_t t = 0; t < n; ++t)
    positions[t] = static_cast<std::int32_t>(t);
  std::stable_sort(positions.begin(), positions.end(), [&](std::int32_t a, std::int32_t b) {
    return ids[static_cast<std::size_t>(a)] < ids[static_cast<std::size_t>(b)];
  });
  std::vector<std::int32_t> sorted(n);
  for (std::size_t k = 0; k < n; ++k)
    sorted[k] = ids[static_cast<std::size_t>(positions[k])];
  const wl::detail::embedding_grad_run<float> run{
      sorted.data(),
      positions.data(),
      n,
      weft::matrix_view<const float>(g.data(), n, cols, cols),
      got.view(),
      begin};
  for (std::size_t k = n; k-- > 0;)
    for (std::size_t c = cols; c-- > 0;)
      run(k, c);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      EXPECT_EQ(got(r, c), expected(r, c)) << "row " << r + begin << " column " << c;
}

} // namespace
