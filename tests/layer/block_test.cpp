// parallel_attention and transformer_block: the attention against causal attention written out in
// the test from the full weights; the block's gradients against central finite differences; and
// the communication of one block, counted by weft::traced, for each sequence-parallel and
// recompute policy.
#include <weft/comm/traced.hpp>
#include <weft/layer/attention.hpp>
#include <weft/layer/block.hpp>
#include <weft/layer/init.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <vector>

#include "layer/layer_support.hpp"
#include "layer/reversed_elements.hpp"

namespace {

using namespace weft::test::layer;
using weft::layer::no_sequence_parallel;
using weft::layer::sequence_parallel;
namespace recompute = weft::layer::recompute;
using comm_t = weft::local::communicator;
using weft::test::layer::reversed_elements;

constexpr std::uint64_t seed = 20261130;

/// Causal multi-head attention, the textbook way: x tokens x hidden (batch sequences of seq rows),
/// wqkv 3*hidden x hidden with head h's q, k, v rows at [3hd, 3hd + 3d), wo hidden x hidden.
dmat ref_attention(const dmat& x, const dmat& wqkv, const dmat& wo, std::size_t heads,
                   std::size_t seq) {
  const std::size_t hidden = x.cols();
  const std::size_t d = hidden / heads;
  const dmat qkv = ref_linear(x, wqkv, nullptr);
  dmat ctx(x.rows(), hidden);
  for (std::size_t b = 0; b < x.rows() / seq; ++b) {
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t i = 0; i < seq; ++i) {
        std::vector<double> w(i + 1);
        double top = -1e300;
        for (std::size_t j = 0; j <= i; ++j) {
          double s = 0.0;
          for (std::size_t e = 0; e < d; ++e)
            s += qkv(b * seq + i, 3 * h * d + e) * qkv(b * seq + j, 3 * h * d + d + e);
          w[j] = s / std::sqrt(static_cast<double>(d));
          top = std::max(top, w[j]);
        }
        double sum = 0.0;
        for (auto& v : w)
          sum += (v = std::exp(v - top));
        for (std::size_t e = 0; e < d; ++e) {
          double o = 0.0;
          for (std::size_t j = 0; j <= i; ++j)
            o += w[j] / sum * qkv(b * seq + j, 3 * h * d + 2 * d + e);
          ctx(b * seq + i, h * d + e) = o;
        }
      }
    }
  }
  return ref_linear(ctx, wo, nullptr);
}

template <class T>
void attention_matches_reference(int tp, std::size_t seq = 5) {
  const std::size_t hidden = 12, heads = 6, batch = 2;
  dmat x = random_dmat(batch * seq, hidden, 3);
  round_to<T>(x);
  dmat wqkv(3 * hidden, hidden), wo(hidden, hidden);
  weft::layer::init_normal(wqkv.view(), hidden, 0, 0, seed, 7, 0.02);
  weft::layer::init_normal(wo.view(), hidden, 0, 0, seed, 8, 0.02);
  // The layer's weights are rounded to T from the same stream; so are the reference's.
  round_to<T>(wqkv);
  round_to<T>(wo);
  // Large weights make the softmax far from uniform, which is what a test of it needs.
  const dmat want = ref_attention(scaled(x, 30.0), wqkv, wo, heads, seq);
  const auto xt = to<T>(scaled(x, 30.0));
  run_ranks(tp, [&](comm_t& c) {
    weft::layer::parallel_attention<T, comm_t> attn(c, hidden, heads, seq, seed, 7);
    weft::matrix<T> y(batch * seq, hidden);
    attn.forward(xt.view(), y.view());
    EXPECT_LT(rel_err(y, want), tolerance<T> * 10) << "tp=" << tp << " rank " << c.rank();
  });
}

TEST(Attention, MatchesSerialReferenceFloat) {
  for (int tp : {1, 2, 3})
    attention_matches_reference<float>(tp);
}
TEST(Attention, MatchesSerialReferenceDouble) {
  for (int tp : {1, 2, 3})
    attention_matches_reference<double>(tp);
}

// Sequences longer than the lanes a softmax row is reduced by (exec.hpp's row_lanes): late rows'
// lanes take several scores each, early rows' lanes some none.
TEST(Attention, SequencesLongerThanTheLanes) {
  for (int tp : {1, 3}) {
    attention_matches_reference<float>(tp, 70);
    attention_matches_reference<double>(tp, 70);
  }
}

// A policy that runs each element-wise stage as a kernel (each_element; reversed_elements runs it
// backwards, as a device may) takes the softmax over all of a sequence's heads in one call, rows
// stacked; the host takes a head at a time. The rows and their sums are the same, so the output,
// dx and every gradient must be equal bit for bit, with the probabilities kept or recomputed.
template <class T>
void stacked_heads_equal_head_by_head(int tp, std::size_t seq, bool keep) {
  const std::size_t hidden = 12, heads = 6, batch = 3;
  const auto x = to<T>(scaled(random_dmat(batch * seq, hidden, 21), 30.0));
  const auto dy = to<T>(random_dmat(batch * seq, hidden, 22));
  run_ranks(tp, [&](comm_t& c) {
    const reversed_elements device_like;
    weft::layer::parallel_attention<T, comm_t> host(c, hidden, heads, seq, seed, 7);
    weft::layer::parallel_attention<T, comm_t, reversed_elements> stacked(c, hidden, heads, seq,
                                                                          seed, 7, device_like);
    host.keep_probabilities(keep);
    stacked.keep_probabilities(keep);
    weft::matrix<T> y1(batch * seq, hidden), y2(batch * seq, hidden), dx1(batch * seq, hidden),
        dx2(batch * seq, hidden);
    host.zero_grad();
    stacked.zero_grad();
    host.forward(x.view(), y1.view());
    stacked.forward(x.view(), y2.view());
    host.backward(dy.view(), dx1.view());
    stacked.backward(dy.view(), dx2.view());
    EXPECT_GT(*device_like.steps, 0u) << "the stages did not go through the policy";
    const auto same = [&](const std::string& what, auto a, auto b) {
      ASSERT_EQ(a.rows(), b.rows());
      ASSERT_EQ(a.cols(), b.cols());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < a.rows(); ++i)
        for (std::size_t j = 0; j < a.cols(); ++j)
          differ += a(i, j) != b(i, j) ? 1 : 0;
      EXPECT_EQ(differ, 0u) << what << ": tp " << tp << " rank " << c.rank() << " seq " << seq
                            << " keep " << keep;
    };
    same("y", y1.view(), y2.view());
    same("dx", dx1.view(), dx2.view());
    auto p1 = host.parameters();
    auto p2 = stacked.parameters();
    ASSERT_EQ(p1.size(), p2.size());
    for (std::size_t i = 0; i < p1.size(); ++i)
      same(p1[i].name, p1[i].grad, p2[i].grad);
  });
}

TEST(Attention, StackedHeadsEqualHeadByHead) {
  for (bool keep : {true, false}) {
    stacked_heads_equal_head_by_head<float>(1, 5, keep);
    stacked_heads_equal_head_by_head<double>(3, 5, keep);
    stacked_heads_equal_head_by_head<float>(2, 70, keep); // rows longer than the lanes
  }
}

// On a device each element-wise stage is a kernel launch: with the heads stacked, their number per
// forward and backward depends on the sequences, not on the heads.
TEST(Attention, StageLaunchesDoNotGrowWithTheHeads) {
  const std::size_t hidden = 12, seq = 5, batch = 2;
  const auto x = to<float>(random_dmat(batch * seq, hidden, 23));
  const auto stages = [&](std::size_t heads) {
    std::size_t n = 0;
    run_ranks(1, [&](comm_t& c) {
      const reversed_elements device_like;
      weft::layer::parallel_attention<float, comm_t, reversed_elements> attn(c, hidden, heads, seq,
                                                                             seed, 7, device_like);
      weft::matrix<float> y(batch * seq, hidden), dx(batch * seq, hidden);
      attn.forward(x.view(), y.view());
      attn.backward(weft::matrix_view<const float>(y.view()), dx.view());
      n = *device_like.steps;
    });
    return n;
  };
  const std::size_t two = stages(2), six = stages(6);
  EXPECT_GT(two, 0u);
  EXPECT_EQ(two, six);
}

TEST(Attention, HeadsMustDivideOverTheGroup) {
  run_ranks(4, [](comm_t& c) {
    expect_error([&] { weft::layer::parallel_attention<float, comm_t> a(c, 12, 6, 4, seed, 0); },
                 "6 heads do not divide");
  });
  run_ranks(1, [](comm_t& c) {
    expect_error([&] { weft::layer::parallel_attention<float, comm_t> a(c, 10, 4, 4, seed, 0); },
                 "does not divide");
  });
}

// --- a forward refused for its shapes changes nothing that backward uses ---------------------

// Gradients (every parameter's, then dx) of forward(x1) and backward(dy) on each rank, with or
// without a forward of x2 into a y of the wrong shape in between. The refused forward must not
// replace what the layer keeps for backward (the column layer's input; the attention's q, k, v
// and probabilities), or the backward after it would mix the two inputs.
template <class Make>
void refused_forward_changes_nothing(int tp, std::size_t rows, std::size_t hidden, Make make) {
  run_ranks(tp, [&](comm_t& c) {
    const auto grads = [&](bool refuse) {
      auto layer = make(c);
      const std::size_t in = hidden;
      const dmat x1 = random_dmat(rows, in, 21 + static_cast<unsigned>(c.rank()));
      const dmat x2 = scaled(random_dmat(rows, in, 31), 3.0);
      const dmat dy = random_dmat(rows, hidden, 41 + static_cast<unsigned>(c.rank()));
      dmat y(rows, hidden), bad_y(rows, hidden + 1), dx(rows, in);
      layer->forward(x1.view(), y.view());
      if (refuse) expect_error([&] { layer->forward(x2.view(), bad_y.view()); }, "y is");
      layer->backward(dy.view(), dx.view());
      std::vector<double> g;
      for (auto& p : layer->parameters())
        for (std::size_t i = 0; i < p.grad.rows(); ++i)
          for (std::size_t j = 0; j < p.grad.cols(); ++j)
            g.push_back(p.grad(i, j));
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < in; ++j)
          g.push_back(dx(i, j));
      return g;
    };
    EXPECT_EQ(grads(true), grads(false)) << "rank " << c.rank();
  });
}

TEST(Layers, ARefusedForwardChangesNothingBackwardUses) {
  using weft::layer::cblas;
  // The column layer gathers its output (y: tokens x hidden on every rank).
  refused_forward_changes_nothing(2, 8, 6, [](comm_t& c) {
    return std::make_unique<weft::layer::column_parallel_linear<double, comm_t>>(
        c, 6, 6, seed, 1,
        weft::layer::column_parallel_linear<double, comm_t>::options{.gather_output = true});
  });
  refused_forward_changes_nothing(2, 8, 8, [](comm_t& c) {
    return std::make_unique<weft::layer::parallel_attention<double, comm_t>>(c, 8, 2, 4, seed, 1);
  });
  refused_forward_changes_nothing(2, 4, 8, [](comm_t& c) { // sequence parallel: 4 of 8 tokens each
    return std::make_unique<
        weft::layer::parallel_attention<double, comm_t, cblas, sequence_parallel>>(c, 8, 2, 4, seed,
                                                                                   1);
  });
  refused_forward_changes_nothing(2, 8, 8, [](comm_t& c) {
    return std::make_unique<weft::layer::parallel_mlp<double, comm_t>>(c, 8, 12, seed, 1);
  });
}

// --- the block's gradients against finite differences (double, one rank) ---------------------

template <class Recompute>
void block_matches_finite_differences() {
  const weft::layer::block_shape shape{.hidden = 8, .heads = 2, .ffn = 12, .seq = 4};
  const std::size_t rows = 2 * shape.seq;
  const dmat x0 = scaled(random_dmat(rows, shape.hidden, 11), 2.0);
  const dmat r = random_dmat(rows, shape.hidden, 12); // L = sum(y .* r), so dL/dy = r
  run_ranks(1, [&](comm_t& c) {
    weft::layer::transformer_block<double, comm_t, weft::layer::cblas, no_sequence_parallel,
                                   Recompute>
        blk(c, shape, seed, 1);
    // Weights 10x the 0.02 default, nonzero biases: every path of the block matters in the loss,
    // and the softmax stays soft (much larger weights saturate it, and q, k's gradients vanish).
    for (auto& p : blk.parameters()) {
      for (std::size_t i = 0; i < p.value.rows(); ++i)
        for (std::size_t j = 0; j < p.value.cols(); ++j)
          p.value(i, j) = p.value(i, j) * 10.0 +
                          0.02 * std::sin(static_cast<double>(3 * i + 7 * j + p.name.size()));
    }
    dmat x = x0, y(rows, shape.hidden), dx(rows, shape.hidden);
    auto loss = [&] {
      blk.forward(x.view(), y.view());
      double l = 0.0;
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < shape.hidden; ++j)
          l += y(i, j) * r(i, j);
      return l;
    };
    blk.zero_grad();
    loss();
    blk.backward(r.view(), dx.view());
    const double h = 1e-6;
    auto numeric = [&](double& v) {
      const double keep = v;
      v = keep + h;
      const double up = loss();
      v = keep - h;
      const double down = loss();
      v = keep;
      return (up - down) / (2 * h);
    };
    auto check = [&](const std::string& what, double analytic, double& v) {
      const double n = numeric(v);
      EXPECT_NEAR(analytic, n, 1e-6 * (1.0 + std::abs(n))) << what;
    };
    for (std::size_t i = 0; i < rows; i += 3)
      for (std::size_t j = 0; j < shape.hidden; j += 2)
        check("dx(" + std::to_string(i) + "," + std::to_string(j) + ")", dx(i, j), x(i, j));
    for (auto& p : blk.parameters()) {
      // A handful of entries of every parameter, spread over its shape.
      const std::size_t n = p.value.rows() * p.value.cols();
      for (std::size_t k = 0; k < n; k += std::max<std::size_t>(1, n / 7)) {
        const std::size_t i = k / p.value.cols(), j = k % p.value.cols();
        check(p.name + "(" + std::to_string(i) + "," + std::to_string(j) + ")", p.grad(i, j),
              p.value(i, j));
      }
    }
  });
}

TEST(Block, GradientsMatchFiniteDifferences) {
  block_matches_finite_differences<recompute::none>();
}
TEST(Block, GradientsMatchFiniteDifferencesSelectiveRecompute) {
  block_matches_finite_differences<recompute::selective>();
}
TEST(Block, GradientsMatchFiniteDifferencesFullRecompute) {
  block_matches_finite_differences<recompute::full>();
}

// --- communication of one block ---------------------------------------------------------------

struct counts {
  std::size_t all_reduce = 0, all_gather = 0, reduce_scatter = 0, other = 0;
};
counts count_ops(const std::vector<weft::traced_op>& ops, std::size_t from, std::size_t to) {
  counts c;
  for (std::size_t i = from; i < to; ++i) {
    switch (ops[i].kind) {
      case weft::collective::all_reduce: ++c.all_reduce; break;
      case weft::collective::all_gather: ++c.all_gather; break;
      case weft::collective::reduce_scatter: ++c.reduce_scatter; break;
      default: ++c.other; break;
    }
  }
  return c;
}

template <class SP, class Recompute>
void block_communication(counts fwd, counts bwd) {
  const weft::layer::block_shape shape{.hidden = 8, .heads = 2, .ffn = 16, .seq = 4};
  const std::size_t tokens = 2 * shape.seq;
  run_ranks(2, [&](comm_t& c) {
    weft::traced<comm_t> tp(std::move(c), "tp");
    weft::layer::transformer_block<float, weft::traced<comm_t>, weft::layer::cblas, SP, Recompute>
        blk(tp, shape, seed, 1);
    const std::size_t rows = SP::enabled ? tokens / 2 : tokens;
    const auto x = to<float>(random_dmat(rows, shape.hidden, 5));
    weft::matrix<float> y(rows, shape.hidden), dx(rows, shape.hidden);
    blk.forward(x.view(), y.view());
    const std::size_t after_forward = tp.ops().size();
    blk.backward(y.view(), dx.view());
    const auto f = count_ops(tp.ops(), 0, after_forward);
    const auto b = count_ops(tp.ops(), after_forward, tp.ops().size());
    EXPECT_EQ(f.all_reduce, fwd.all_reduce);
    EXPECT_EQ(f.all_gather, fwd.all_gather);
    EXPECT_EQ(f.reduce_scatter, fwd.reduce_scatter);
    EXPECT_EQ(f.other, 0u);
    EXPECT_EQ(b.all_reduce, bwd.all_reduce);
    EXPECT_EQ(b.all_gather, bwd.all_gather);
    EXPECT_EQ(b.reduce_scatter, bwd.reduce_scatter);
    EXPECT_EQ(b.other, 0u);
    // Every collective of the block moves tokens x hidden elements in all (per rank: all of it for
    // an all-reduce, a 1/tp share for the gathers and scatters).
    for (const auto& op : tp.ops()) {
      EXPECT_EQ(op.axis, "tp");
      EXPECT_EQ(op.type, weft::dtype::float32);
      const std::size_t want = op.kind == weft::collective::all_reduce ? tokens * shape.hidden
                                                                       : tokens * shape.hidden / 2;
      EXPECT_EQ(op.count, want) << weft::name_of(op.kind);
    }
  });
}

TEST(Block, TwoAllReducesEachWay) {
  block_communication<no_sequence_parallel, recompute::none>({.all_reduce = 2}, {.all_reduce = 2});
  block_communication<no_sequence_parallel, recompute::selective>({.all_reduce = 2},
                                                                  {.all_reduce = 2});
}
TEST(Block, SequenceParallelGathersAndScatters) {
  block_communication<sequence_parallel, recompute::none>({.all_gather = 2, .reduce_scatter = 2},
                                                          {.all_gather = 2, .reduce_scatter = 2});
  block_communication<sequence_parallel, recompute::selective>(
      {.all_gather = 2, .reduce_scatter = 2}, {.all_gather = 2, .reduce_scatter = 2});
}
TEST(Block, FullRecomputeRepeatsTheForwardsCommunication) {
  block_communication<no_sequence_parallel, recompute::full>({.all_reduce = 2}, {.all_reduce = 4});
  block_communication<sequence_parallel, recompute::full>({.all_gather = 2, .reduce_scatter = 2},
                                                          {.all_gather = 4, .reduce_scatter = 4});
}

TEST(Block, SelectiveRecomputeKeepsNoProbabilities) {
  const weft::layer::block_shape shape{.hidden = 8, .heads = 2, .ffn = 16, .seq = 16};
  run_ranks(1, [&](comm_t& c) {
    weft::layer::transformer_block<float, comm_t> keep(c, shape, seed, 1);
    weft::layer::transformer_block<float, comm_t, weft::layer::cblas, no_sequence_parallel,
                                   recompute::selective>
        drop(c, shape, seed, 1);
    const auto x = to<float>(random_dmat(2 * shape.seq, shape.hidden, 5));
    weft::matrix<float> y1(x.rows(), shape.hidden), y2(x.rows(), shape.hidden);
    keep.forward(x.view(), y1.view());
    drop.forward(x.view(), y2.view());
    // batch 2 x heads 2 x 16 x 16 probabilities, 4 bytes each.
    EXPECT_EQ(keep.attention().saved_bytes() - drop.attention().saved_bytes(),
              2u * 2 * 16 * 16 * 4);
    EXPECT_EQ(rel_err(y2,
                      [&] {
                        dmat d(y1.rows(), y1.cols());
                        for (std::size_t i = 0; i < d.rows(); ++i)
                          for (std::size_t j = 0; j < d.cols(); ++j)
                            d(i, j) = y1(i, j);
                        return d;
                      }()),
              0.0);
  });
}

TEST(Block, FullRecomputeKeepsOnlyTheInput) {
  const weft::layer::block_shape shape{.hidden = 8, .heads = 2, .ffn = 16, .seq = 16};
  run_ranks(2, [&](comm_t& c) {
    weft::layer::transformer_block<float, comm_t> keep(c, shape, seed, 1);
    weft::layer::transformer_block<float, comm_t, weft::layer::cblas, no_sequence_parallel,
                                   recompute::full>
        drop(c, shape, seed, 1);
    const auto x = to<float>(random_dmat(2 * shape.seq, shape.hidden, 5));
    weft::matrix<float> y(x.rows(), shape.hidden), dx1(x.rows(), shape.hidden),
        dx2(x.rows(), shape.hidden);
    keep.forward(x.view(), y.view());
    drop.forward(x.view(), y.view());
    EXPECT_EQ(drop.saved_bytes(), x.size() * sizeof(float));
    // Without recompute the block holds at least the first norm's input (as x-hat, in double), this
    // rank's q/k/v (32 rows x 3 * 8 / 2 columns) and its probabilities
    // (2 sequences x 1 head x 16 x 16).
    EXPECT_GE(keep.saved_bytes(),
              x.size() * sizeof(double) + (32 * 12 + 2 * 16 * 16) * sizeof(float));
    keep.backward(y.view(), dx1.view());
    drop.backward(y.view(), dx2.view());
    for (std::size_t i = 0; i < x.rows(); ++i)
      for (std::size_t j = 0; j < shape.hidden; ++j)
        EXPECT_EQ(dx1(i, j), dx2(i, j));
  });
}

} // namespace
