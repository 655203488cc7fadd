// column_parallel_linear and row_parallel_linear at TP 1..4 (uneven splits included), with and
// without sequence parallelism, in float and double, against the unsplit layer written out in
// double in layer_support.hpp: outputs, input gradients, weight and bias gradients (accumulated
// over two backward passes), the communication each one issues (through weft::traced), and the
// shape errors.
#include <weft/comm/traced.hpp>
#include <weft/layer/linear.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <vector>

#include "layer/layer_support.hpp"
#include "layer/reversed_elements.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;
using weft::collective;

template <class T, class SP>
struct config {
  using type = T;
  using sp = SP;
};

template <class C>
class linear : public ::testing::Test {};

using configs =
    ::testing::Types<config<float, wl::no_sequence_parallel>,
                     config<double, wl::no_sequence_parallel>, config<float, wl::sequence_parallel>,
                     config<double, wl::sequence_parallel>>;
TYPED_TEST_SUITE(linear, configs);

constexpr std::size_t default_tokens = 12; // divides by 1..4
constexpr std::uint64_t seed = 42;
constexpr double init_std = 0.5; // of the layers' weights, and of full_weight's references

template <class T>
dmat full_weight(std::size_t out, std::size_t in, std::uint64_t id, double stddev) {
  dmat w(out, in);
  wl::init_normal(w.view(), in, 0, 0, seed, id, stddev);
  tl::round_to<T>(w);
  return w;
}

// A linear layer's inputs at T's precision (x, dy and the bias drawn from seeds first, first + 1
// and first + 2; the weight as the layer draws it for `id`), and the unsplit layer's results on
// them, in double.
template <class T>
struct linear_case {
  dmat x, dy, b, w, y_ref, dx_ref, dw_ref;
  linear_case(std::size_t tokens, std::size_t in, std::size_t out, std::uint32_t first,
              std::uint64_t id, bool bias)
      : x(rounded(tl::random_dmat(tokens, in, first))),
        dy(rounded(tl::random_dmat(tokens, out, first + 1))),
        b(rounded(tl::random_dmat(1, out, first + 2))),
        w(full_weight<T>(out, in, id, init_std)),
        y_ref(tl::ref_linear(x, w, bias ? &b : nullptr)),
        dx_ref(tl::ref_linear_dx(dy, w)),
        dw_ref(tl::ref_linear_dw(dy, x)) {}
  static dmat rounded(dmat m) {
    tl::round_to<T>(m);
    return m;
  }
};

// The options of Layer under test: the bias if asked, the weights drawn as linear_case's.
template <class Layer>
typename Layer::options options_with(bool bias) {
  typename Layer::options opt;
  opt.bias = bias;
  opt.init_std = init_std;
  return opt;
}

// The token rows a rank of tp holds: all of them, or under sequence parallelism its share.
template <class SP>
wl::range token_rows(std::size_t tokens, int tp, int rank) {
  const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
  const std::size_t row0 = SP::enabled ? static_cast<std::size_t>(rank) * local : 0;
  return {row0, row0 + local};
}

// The collectives of Megatron-LM's f at `width` features, the operator before a column-parallel
// layer: the identity one way (its gathering side) and an all-reduce the other (its reducing
// side); under sequence parallelism an all-gather and a reduce-scatter of the rank's tokens. Its
// conjugate g, after a row-parallel layer, is the same with the directions swapped.
struct conjugate_ops {
  std::vector<weft::traced_op> gathering, reducing;
};
template <class T, class SP>
conjugate_ops f_ops(int tp, std::size_t tokens, std::size_t local, std::size_t width) {
  if (tp == 1) return {};
  if (SP::enabled) {
    return {{{collective::all_gather, local * width, weft::dtype_of<T>, "tp"}},
            {{collective::reduce_scatter, local * width, weft::dtype_of<T>, "tp"}}};
  }
  return {{}, {{collective::all_reduce, tokens * width, weft::dtype_of<T>, "tp"}}};
}

// A forward and a backward of fc, and the collectives each one issued.
struct pass_ops {
  std::vector<weft::traced_op> fwd, bwd;
};
template <class Comm, class Layer, class X, class Y, class DY, class DX>
pass_ops forward_backward(Comm& comm, Layer& fc, X x, Y y, DY dy, DX dx) {
  pass_ops ops;
  comm.clear();
  fc.forward(x, y);
  ops.fwd = comm.ops();
  comm.clear();
  fc.backward(dy, dx);
  ops.bwd = comm.ops();
  return ops;
}

template <class T, class SP>
void check_column(int tp, std::size_t in, std::size_t out, bool gather_output, bool bias,
                  bool strided = false, std::size_t tokens = default_tokens) {
  const linear_case<T> d(tokens, in, out, 1, 7, bias);
  const dmat db_ref = tl::ref_colsum(d.dy, 0, tokens);
  const double tol = tl::tolerance<T>;
  tl::run_ranks(tp, [&](weft::local::communicator& c) {
    weft::traced<weft::local::communicator> comm(std::move(c), "tp");
    using layer_t = wl::column_parallel_linear<T, decltype(comm), wl::cblas, SP>;
    auto opt = options_with<layer_t>(bias);
    opt.gather_output = gather_output;
    layer_t fc(comm, in, out, seed, 7, opt);
    const wl::range o = fc.out_range();
    EXPECT_EQ(o, wl::split_range(out, tp, comm.rank()));
    const wl::range rows = token_rows<SP>(tokens, tp, comm.rank());
    const std::size_t local = rows.size(), row0 = rows.begin;
    const std::string where = "tp=" + std::to_string(tp) + " rank " + std::to_string(comm.rank()) +
                              (gather_output ? " gather_output" : "") + (bias ? "" : " no bias");
    EXPECT_EQ(tl::rel_err(fc.weight(), tl::block(d.w, o.begin, o.size(), 0, in)), 0.0) << where;
    if (bias) {
      auto bl = tl::to<T>(tl::block(d.b, 0, 1, o.begin, o.size()));
      std::copy(bl.flat().begin(), bl.flat().end(), fc.bias().data());
    }
    tl::embedded<T> xl(tl::to<T>(tl::block(d.x, row0, local, 0, in)), strided);
    const std::size_t ycols = gather_output ? out : o.size();
    tl::embedded<T> dyl(tl::to<T>(tl::block(d.dy, 0, tokens, gather_output ? 0 : o.begin, ycols)),
                        strided);
    tl::embedded<T> y(tokens, ycols, strided), dx(local, in, strided);
    for (int pass = 1; pass <= 2; ++pass) {
      const auto [fwd, bwd] =
          forward_backward(comm, fc, xl.cview(), y.view(), dyl.cview(), dx.view());
      EXPECT_LT(
          tl::rel_err(y.view(), tl::block(d.y_ref, 0, tokens, gather_output ? 0 : o.begin, ycols)),
          tol)
          << where;
      EXPECT_LT(tl::rel_err(dx.view(), tl::block(d.dx_ref, row0, local, 0, in)), tol) << where;
      EXPECT_TRUE(y.border_intact() && dx.border_intact()) << where;
      const auto params = fc.parameters();
      ASSERT_EQ(params.size(), bias ? 2u : 1u);
      EXPECT_FALSE(params[0].replicated);
      EXPECT_LT(tl::rel_err(params[0].grad,
                            tl::scaled(tl::block(d.dw_ref, o.begin, o.size(), 0, in), pass)),
                tol)
          << where << " pass " << pass;
      if (bias) {
        EXPECT_LT(tl::rel_err(params[1].grad,
                              tl::scaled(tl::block(db_ref, 0, 1, o.begin, o.size()), pass)),
                  tol)
            << where;
        EXPECT_FALSE(params[1].sequence_partial);
      }
      // Communication: f is the identity forward, an all-reduce backward;
      // SP: all-gather / reduce-scatter.
      auto [want_fwd, want_bwd] = f_ops<T, SP>(tp, tokens, local, in);
      if (tp > 1 && gather_output) {
        want_fwd.push_back({collective::all_gather, tokens * wl::split_range(out, tp, 0).size(),
                            weft::dtype_of<T>, "tp"});
      }
      EXPECT_EQ(fwd, want_fwd) << where;
      EXPECT_EQ(bwd, want_bwd) << where;
    }
    fc.zero_grad();
    for (const auto& prm : fc.parameters())
      for (std::size_t i = 0; i < prm.grad.rows(); ++i)
        for (std::size_t j = 0; j < prm.grad.cols(); ++j)
          EXPECT_EQ(prm.grad(i, j), T{0});
  });
}

template <class T, class SP>
void check_row(int tp, std::size_t in, std::size_t out, bool bias, bool strided = false,
               std::size_t tokens = default_tokens) {
  const linear_case<T> d(tokens, in, out, 4, 9, bias);
  const double tol = tl::tolerance<T>;
  tl::run_ranks(tp, [&](weft::local::communicator& c) {
    weft::traced<weft::local::communicator> comm(std::move(c), "tp");
    using layer_t = wl::row_parallel_linear<T, decltype(comm), wl::cblas, SP>;
    layer_t fc(comm, in, out, seed, 9, options_with<layer_t>(bias));
    const wl::range ir = fc.in_range();
    EXPECT_EQ(ir, wl::split_range(in, tp, comm.rank()));
    const wl::range rows = token_rows<SP>(tokens, tp, comm.rank());
    const std::size_t local = rows.size(), row0 = rows.begin;
    const std::string where = "tp=" + std::to_string(tp) + " rank " + std::to_string(comm.rank()) +
                              (bias ? "" : " no bias");
    EXPECT_EQ(tl::rel_err(fc.weight(), tl::block(d.w, 0, out, ir.begin, ir.size())), 0.0) << where;
    if (bias) {
      auto bl = tl::to<T>(d.b);
      std::copy(bl.flat().begin(), bl.flat().end(), fc.bias().data());
    }
    tl::embedded<T> xl(tl::to<T>(tl::block(d.x, 0, tokens, ir.begin, ir.size())), strided);
    tl::embedded<T> dyl(tl::to<T>(tl::block(d.dy, row0, local, 0, out)), strided);
    tl::embedded<T> y(local, out, strided), dx(tokens, ir.size(), strided);
    for (int pass = 1; pass <= 2; ++pass) {
      const auto [fwd, bwd] =
          forward_backward(comm, fc, xl.cview(), y.view(), dyl.cview(), dx.view());
      EXPECT_LT(tl::rel_err(y.view(), tl::block(d.y_ref, row0, local, 0, out)), tol) << where;
      if (ir.size() > 0) {
        EXPECT_LT(tl::rel_err(dx.view(), tl::block(d.dx_ref, 0, tokens, ir.begin, ir.size())), tol)
            << where;
      }
      EXPECT_TRUE(y.border_intact() && dx.border_intact()) << where;
      auto params = fc.parameters();
      ASSERT_EQ(params.size(), bias ? 2u : 1u);
      if (ir.size() > 0) {
        EXPECT_LT(tl::rel_err(params[0].grad,
                              tl::scaled(tl::block(d.dw_ref, 0, out, ir.begin, ir.size()), pass)),
                  tol)
            << where;
      }
      if (bias) {
        EXPECT_TRUE(params[1].replicated);
        EXPECT_EQ(params[1].sequence_partial, SP::enabled);
        // Without SP every rank has every token's dy: the full sum. With it, this rank's rows only.
        EXPECT_LT(tl::rel_err(params[1].grad, tl::scaled(tl::ref_colsum(d.dy, row0, local), pass)),
                  tol)
            << where;
      }
      // Communication: g, f's conjugate: an all-reduce forward, the identity backward; SP:
      // reduce-scatter / all-gather.
      const auto [want_bwd, want_fwd] = f_ops<T, SP>(tp, tokens, local, out);
      EXPECT_EQ(fwd, want_fwd) << where;
      EXPECT_EQ(bwd, want_bwd) << where;
    }
    if (bias) {
      // After the sequence-parallel reduction every rank holds the full bias gradient (x2 passes).
      comm.clear();
      auto params = fc.parameters();
      wl::reduce_sequence_parallel_grads(comm, std::span<wl::parameter<T>>(params));
      EXPECT_EQ(comm.ops().size(), (SP::enabled && tp > 1) ? 1u : 0u);
      EXPECT_LT(tl::rel_err(params[1].grad, tl::scaled(tl::ref_colsum(d.dy, 0, tokens), 2)), tol)
          << where;
    }
  });
}

TYPED_TEST(linear, ColumnParallelMatchesSerial) {
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  for (int tp = 1; tp <= 4; ++tp) {
    check_column<T, SP>(tp, 7, 10, false, true); // 10 over 3 and 4: uneven
    check_column<T, SP>(tp, 5, 6, false, false);
  }
}

TYPED_TEST(linear, ColumnParallelGatherOutput) {
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  for (int tp = 1; tp <= 4; ++tp)
    check_column<T, SP>(tp, 7, 10, true, true);
}

TYPED_TEST(linear, RowParallelMatchesSerial) {
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  for (int tp = 1; tp <= 4; ++tp) {
    check_row<T, SP>(tp, 10, 7, true); // in = 10 over 3 and 4: uneven
    check_row<T, SP>(tp, 6, 5, false);
  }
}

TYPED_TEST(linear, MoreRanksThanFeatures) {
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  check_column<T, SP>(4, 5, 3, false, true); // rank 3 holds no output column
  check_row<T, SP>(4, 3, 5, true);           // rank 3 holds no input column
}

TYPED_TEST(
    linear,
    StridedViews) { // inputs and outputs with ld > cols, and the memory around them untouched
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  for (int tp = 1; tp <= 4; ++tp) {
    check_column<T, SP>(tp, 7, 10, false, true, true);
    check_column<T, SP>(tp, 7, 10, true, true, true);
    check_row<T, SP>(tp, 10, 7, true, true);
  }
}

// More tokens than the lanes the bias gradient's column sums are taken by (exec.hpp's
// sum_rows_by_lanes): every lane sums several rows, unevenly (under sequence parallelism at TP 2,
// 36 rows a rank).
TYPED_TEST(linear, MoreTokensThanLanes) {
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  for (int tp : {1, 2}) {
    check_column<T, SP>(tp, 7, 10, false, true, false, 72);
    check_row<T, SP>(tp, 10, 7, true, false, 72);
  }
}

// The bias gradient's column sums as a device runs them (a thread per lane and column, then one per
// column: the reversed_elements policy) and as the host does (row after row into the lanes): the
// same bits, and the sums of a double reference; added to what db held.
TEST(LinearColumnSums, EveryPolicyGivesTheSameSums) {
  const std::size_t rows = 75, cols = 9;
  dmat dy = tl::random_dmat(rows, cols, 11);
  tl::round_to<float>(dy);
  const auto dyf = tl::to<float>(dy);
  dmat want = tl::ref_colsum(dy, 0, rows);
  for (std::size_t c = 0; c < cols; ++c)
    want(0, c) += 1.0;
  weft::matrix<float> host_db(1, cols, 1.0f), device_db(1, cols, 1.0f);
  weft::matrix<double> host_lanes, device_lanes;
  const tl::reversed_elements device_like;
  wl::detail::accumulate_column_sums(wl::cblas{}, weft::matrix_view<const float>(dyf.view()),
                                     host_db, host_lanes);
  wl::detail::accumulate_column_sums(device_like, weft::matrix_view<const float>(dyf.view()),
                                     device_db, device_lanes);
  EXPECT_EQ(*device_like.steps, 2u); // the lanes, then their sums
  for (std::size_t c = 0; c < cols; ++c)
    EXPECT_EQ(host_db(0, c), device_db(0, c)) << c;
  EXPECT_LT(tl::rel_err(host_db, want), tl::tolerance<float>);
}

TEST(LinearErrors, BadShapes) {
  tl::run_ranks(2, [](weft::local::communicator& c) {
    wl::column_parallel_linear<float, weft::local::communicator> col(c, 4, 6, seed, 1);
    wl::row_parallel_linear<float, weft::local::communicator> row(c, 6, 4, seed, 2);
    weft::matrix<float> x(8, 4), bad_x(8, 5), y(8, 3), bad_y(8, 6), dx(8, 4);
    tl::expect_error([&] { col.backward(y.view(), dx.view()); }, "before forward");
    tl::expect_error([&] { col.forward(bad_x, y.view()); },
                     "column_parallel_linear::forward: x is 8 x 5");
    tl::expect_error([&] { col.forward(x, bad_y.view()); }, "y is 8 x 6, expected 8 x 3");
    col.forward(x, y.view());
    tl::expect_error([&] { col.backward(y, bad_x.view()); }, "dx is 8 x 5");
    weft::matrix<float> rx(8, 3), ry(8, 4), bad_ry(4, 4), rdx(8, 3);
    tl::expect_error([&] { row.backward(ry, rdx.view()); }, "before forward");
    tl::expect_error([&] { row.forward(x, ry.view()); },
                     "row_parallel_linear::forward: x is 8 x 4");
    tl::expect_error([&] { row.forward(rx, bad_ry.view()); }, "y is 4 x 4, expected 8 x 4");
    tl::expect_error([] { (void)wl::split_range(4, 0, 0); }, "split_range");
  });
}

TEST(LinearErrors, SequenceParallelTokensMustDivide) {
  tl::run_ranks(2, [](weft::local::communicator& c) {
    wl::row_parallel_linear<double, weft::local::communicator, wl::cblas, wl::sequence_parallel>
        row(c, 6, 4, seed, 2);
    weft::matrix<double> x(7, 3), y(3, 4);
    tl::expect_error([&] { row.forward(x, y.view()); }, "7 tokens over 2 ranks");
  });
}

} // namespace
