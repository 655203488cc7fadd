// parallel_mlp (column -> GELU -> row) at TP 1..4 with an ffn size that does not divide by 3 or
// 4, with and without sequence parallelism, float and double, against the unsplit MLP written out
// in double here: output, input gradient, every parameter gradient, and its communication (one
// all-reduce each way; with sequence parallelism one all-gather and one reduce-scatter each way).
// Also with a GEMM policy that runs the element-wise steps backwards, as a device may.
#include <weft/comm/traced.hpp>
#include <weft/layer/mlp.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <type_traits>

#include "layer/layer_support.hpp"
#include "layer/mlp_reference.hpp"
#include "layer/reversed_elements.hpp"

namespace {

namespace wl = weft::layer;
namespace tl = weft::test::layer;
using tl::dmat;
using weft::collective;

constexpr std::size_t tokens = 12, hidden = 6, ffn = 10;
constexpr std::uint64_t seed = 3, id = 20;

using tl::reversed_elements;

template <class C>
class mlp : public ::testing::Test {};
template <class T, class SP, class G = wl::cblas>
struct config {
  using type = T;
  using sp = SP;
  using gemm = G;
};
using configs =
    ::testing::Types<config<float, wl::no_sequence_parallel>,
                     config<double, wl::no_sequence_parallel>, config<float, wl::sequence_parallel>,
                     config<double, wl::sequence_parallel>,
                     config<float, wl::no_sequence_parallel, reversed_elements>,
                     config<double, wl::sequence_parallel, reversed_elements>>;
TYPED_TEST_SUITE(mlp, configs);

TYPED_TEST(mlp, MatchesSerial) {
  using T = typename TypeParam::type;
  using SP = typename TypeParam::sp;
  using G = typename TypeParam::gemm;
  const tl::mlp_case ref = tl::mlp_reference<T>(tokens, hidden, ffn, seed, id);
  const dmat &x = ref.x, &dy = ref.dy, &w1 = ref.w1, &b1 = ref.b1, &w2 = ref.w2, &b2 = ref.b2;
  const dmat &y = ref.y, &dx = ref.dx, &dw1 = ref.dw1, &db1 = ref.db1, &dw2 = ref.dw2,
             &db2 = ref.db2;
  const double tol = tl::tolerance<T>;

  for (int tp = 1; tp <= 4; ++tp) {
    tl::run_ranks(tp, [&](weft::local::communicator& c) {
      weft::traced<weft::local::communicator> comm(std::move(c), "tp");
      const G gemm;
      wl::parallel_mlp<T, decltype(comm), G, SP> m(comm, hidden, ffn, seed, id, gemm);
      const wl::range fr = m.fc1().out_range();
      const std::size_t local = SP::enabled ? tokens / static_cast<std::size_t>(tp) : tokens;
      const std::size_t row0 = SP::enabled ? local * static_cast<std::size_t>(comm.rank()) : 0;
      // Put in the scaled weights and the biases (the test's copies of the deterministic init).
      auto ps = m.parameters();
      ASSERT_EQ(ps.size(), 4u);
      EXPECT_EQ(ps[0].name, "fc1.weight");
      EXPECT_EQ(ps[3].name, "fc2.bias");
      for (std::size_t i = 0; i < fr.size(); ++i) {
        for (std::size_t j = 0; j < hidden; ++j) {
          EXPECT_NEAR(static_cast<double>(ps[0].value(i, j)) * 40, w1(fr.begin + i, j), 1e-6);
          ps[0].value(i, j) = static_cast<T>(w1(fr.begin + i, j));
          ps[2].value(j, i) = static_cast<T>(w2(j, fr.begin + i));
        }
        ps[1].value(0, i) = static_cast<T>(b1(0, fr.begin + i));
      }
      for (std::size_t j = 0; j < hidden; ++j)
        ps[3].value(0, j) = static_cast<T>(b2(0, j));
      weft::matrix<T> yl(local, hidden), dxl(local, hidden);
      m.forward(tl::to<T>(tl::block(x, row0, local, 0, hidden)), yl.view());
      const auto fwd = comm.ops();
      comm.clear();
      m.backward(tl::to<T>(tl::block(dy, row0, local, 0, hidden)), dxl.view());
      const auto bwd = comm.ops();
      if constexpr (std::is_same_v<G, reversed_elements>) {
        // Every element-wise step went through the policy. Forward: the linears' input copies
        // (SP: fc1 gathers instead, a copy only at TP 1), two biases, the GELU, the copy out of the
        // reduction (SP: at TP 1 only); backward: two bias column sums (two steps each: the lanes,
        // then their sums), the GELU's, dx's copy out of its reduction (SP: at TP 1 only), and SP's
        // dy gather (a copy at TP 1).
        const std::size_t want = !SP::enabled ? 12 : tp == 1 ? 13 : 9;
        EXPECT_EQ(*gemm.steps, want) << "tp=" << tp;
      }
      const std::string where = "tp=" + std::to_string(tp) + " rank " + std::to_string(comm.rank());
      EXPECT_LT(tl::rel_err(yl, tl::block(y, row0, local, 0, hidden)), tol) << where;
      EXPECT_LT(tl::rel_err(dxl, tl::block(dx, row0, local, 0, hidden)), tol) << where;
      EXPECT_LT(tl::rel_err(ps[0].grad, tl::block(dw1, fr.begin, fr.size(), 0, hidden)), tol)
          << where;
      EXPECT_LT(tl::rel_err(ps[1].grad, tl::block(db1, 0, 1, fr.begin, fr.size())), tol) << where;
      EXPECT_LT(tl::rel_err(ps[2].grad, tl::block(dw2, 0, hidden, fr.begin, fr.size())), tol)
          << where;
      comm.clear();
      wl::reduce_sequence_parallel_grads(comm, std::span<wl::parameter<T>>(ps));
      EXPECT_LT(tl::rel_err(ps[3].grad, db2), tol) << where;
      if (tp > 1) {
        if (SP::enabled) {
          EXPECT_EQ(fwd.size(), 2u);
          EXPECT_EQ(comm.ops().size(), 1u); // the bias gradient's reduction
          for (const auto* ops : {&fwd, &bwd}) {
            ASSERT_EQ(ops->size(), 2u) << where;
            EXPECT_EQ((*ops)[0].count + (*ops)[1].count, 2 * local * hidden);
          }
          EXPECT_EQ(fwd[0].kind, collective::all_gather);
          EXPECT_EQ(fwd[1].kind, collective::reduce_scatter);
          EXPECT_EQ(bwd[0].kind, collective::all_gather);
          EXPECT_EQ(bwd[1].kind, collective::reduce_scatter);
        } else {
          const std::vector<weft::traced_op> one = {
              {collective::all_reduce, tokens * hidden, weft::dtype_of<T>, "tp"}};
          EXPECT_EQ(fwd, one) << where;
          EXPECT_EQ(bwd, one) << where;
        }
      } else {
        EXPECT_TRUE(fwd.empty() && bwd.empty());
      }
    });
  }
}

TEST(ParallelMlp, ShapeError) {
  tl::run_ranks(1, [](weft::local::communicator& c) {
    wl::parallel_mlp<float, weft::local::communicator> m(c, 4, 8, 1, 1);
    weft::matrix<float> x(3, 5), y(3, 4);
    tl::expect_error([&] { m.forward(x, y.view()); }, "parallel_mlp::forward: x is 3 x 5");
  });
}

} // namespace
