// weft::pipeline::executor over MPI processes: training the MLP of pipeline/mlp.hpp through
// every schedule gives the serial reference's losses and gradients on every rank. ctest runs
// it under mpirun with 2 and 4 processes (the stages); executor_test.cpp runs the same on
// threads, with the error cases.
#include <weft/comm/transport/mpi.hpp>
#include <weft/pipeline/executor.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/transport/mpi/mpi_support.hpp"
#include "pipeline/mlp.hpp"

namespace {

namespace pl = weft::pipeline;
namespace mlp = weft::test::mlp;
using weft::mpi::communicator;

static_assert(pl::point_to_point<communicator, float>);

// Trains on this process's rank for two steps (gradients zeroed between them) and checks it
// against the reference. Returns false where the generator refuses (p, m).
template <class Policy, bool Split>
bool train_and_check(int microbatches) {
  communicator& c = weft::test::mpi_world();
  const int p = c.size();
  std::optional<pl::schedule> s;
  try {
    s = Policy::make(p, microbatches);
  } catch (const weft::error&) {
    return false;
  }
  const mlp::model model = mlp::make(s->virtual_stages(), microbatches);
  const mlp::reference_result ref = mlp::reference(model);
  mlp::stage<Split> st(model, c.rank(), p);
  pl::executor<Policy, communicator> ex(c, microbatches, model.boundaries());
  const std::string where = s->name + " p=" + std::to_string(p) +
                            " m=" + std::to_string(microbatches) + " rank " +
                            std::to_string(c.rank());
  for (int step = 0; step < 2; ++step) {
    st.grads = mlp::gradients<float>(model);
    const std::vector<double> losses = ex.run(st);
    mlp::expect_matches(model, ref, st, st.grads, s->chunks, losses, ex.has_loss(),
                        where + " step " + std::to_string(step));
  }
  EXPECT_EQ(ex.has_loss(), c.rank() == p - 1) << where;
  return true;
}

template <class Policy>
class executor_mpi : public ::testing::Test {};

using policies = ::testing::Types<pl::gpipe, pl::one_f_one_b, pl::interleaved<2>,
                                  pl::interleaved<3>, pl::zero_bubble_h1>;
TYPED_TEST_SUITE(executor_mpi, policies);

TYPED_TEST(executor_mpi, gives_the_serial_losses_and_gradients) {
  const int p = weft::test::mpi_world().size();
  int ran = 0;
  for (const int m : {p, p + 1, 2 * p, 4 * p}) {
    if (train_and_check<TypeParam, true>(m)) ++ran;
  }
  EXPECT_GE(ran, 2) << "too few microbatch counts are valid for this schedule";
  if constexpr (!TypeParam::split_backward) {
    EXPECT_TRUE((train_and_check<TypeParam, false>(2 * p))) << "a stage without weight_grad";
  }
}

TEST(executor_mpi_order, receives_messages_out_of_the_order_they_were_sent) {
  if (weft::test::mpi_world().size() != 2) GTEST_SKIP() << "the schedule is for 2 ranks";
  EXPECT_TRUE((train_and_check<mlp::reversed_receiver, true>(4)));
}

// Activations far above MPI's eager limit (256 KiB): with blocking sends 1F1B's steady
// state deadlocks (both neighbours send first); the executor posts them instead.
struct wide_stage {
  static constexpr std::size_t width = std::size_t{1} << 16;
  std::vector<float> input(int mb) { return std::vector<float>(width, static_cast<float>(mb)); }
  std::vector<float> forward(int, int, std::span<const float> x) {
    std::vector<float> y(x.begin(), x.end());
    for (float& v : y)
      v += 1.0f;
    return y;
  }
  pl::loss_result<float> loss(int, std::span<const float> y) {
    return {static_cast<double>(y[0]) + static_cast<double>(y[width - 1]),
            std::vector<float>(width, 1.0f)};
  }
  std::vector<float> backward(int, int, std::span<const float> dy) {
    return {dy.begin(), dy.end()};
  }
};

TEST(executor_mpi_sizes, activations_above_the_eager_limit_do_not_deadlock) {
  communicator& c = weft::test::mpi_world();
  const int p = c.size();
  const int m = 2 * p;
  pl::executor<pl::one_f_one_b, communicator> ex(c, m, wide_stage::width);
  wide_stage st;
  const std::vector<double> losses = ex.run(st);
  if (c.rank() == p - 1) {
    ASSERT_EQ(losses.size(), static_cast<std::size_t>(m));
    // Each of the p stages adds 1 to every element: microbatch mb ends at mb + p, twice.
    for (int mb = 0; mb < m; ++mb)
      EXPECT_EQ(losses[static_cast<std::size_t>(mb)], 2.0 * (mb + p)) << mb;
  }
}

} // namespace
