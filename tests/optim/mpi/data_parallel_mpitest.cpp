// Sharded data-parallel training over MPI processes equals single-rank full-batch training:
// every ZeRO stage and hybrid sharding, SGD / Adam / AdamW, with and without clipping, the
// collectives on the progress thread and inline; and a checkpoint saved here reloads. ctest
// runs it under mpirun with 2 and 4 processes; data_parallel_test.cpp runs the same on threads.
#include <weft/comm/transport/mpi.hpp>
#include <weft/optim.hpp>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "comm/transport/mpi/mpi_support.hpp"
#include "optim/support.hpp"

namespace {

using namespace weft::test::optim;
namespace wo = weft::optim;
using weft::mpi::communicator;

constexpr int batch = 24;
constexpr int steps = 10;

template <class Policy, class Rule>
std::vector<float> train(const model& m, Rule rule, float multiplier, float clip, bool overlap) {
  communicator& c = weft::test::mpi_world();
  const int dp = c.size();
  const wo::data_parallel_options o{.bucket_elements = 20,
                                    .overlap = overlap,
                                    .max_grad_norm = clip,
                                    .inner_size = dp % 2 == 0 ? 2 : 1};
  auto opt = wo::make_data_parallel<Policy, float>(c, m.params, rule, o);
  opt->set_parameters(m.initial());
  train_steps(*opt, m, batch * c.rank() / dp, batch * (c.rank() + 1) / dp, steps, multiplier);
  auto out = opt->gather_parameters();
  weft::test::expect_identical_across_processes(c, out, "parameters");
  return out;
}

template <class Policy>
void check_all() {
  const mlp f(batch);
  const l1_linear i(batch);
  for (bool overlap : {true, false}) {
    for (float clip : {0.0f, 0.05f}) {
      EXPECT_LT(relative_error(train<Policy>(f, sgd_rule(), 1.0f, clip, overlap),
                               train_serial(f, batch, rule_kind::sgd, steps, 1.0f, clip)),
                1e-5);
      EXPECT_LT(relative_error(train<Policy>(f, adam_rule(), 1.0f, clip, overlap),
                               train_serial(f, batch, rule_kind::adam, steps, 1.0f, clip)),
                1e-5);
      EXPECT_LT(relative_error(train<Policy>(f, adamw_rule(), 1.0f, clip, overlap),
                               train_serial(f, batch, rule_kind::adamw, steps, 1.0f, clip)),
                1e-5);
      EXPECT_EQ(train<Policy>(i, sgd_rule(), 1.0f / batch, clip * 10, overlap),
                train_serial(i, batch, rule_kind::sgd, steps, 1.0f / batch, clip * 10));
    }
  }
}

TEST(optim_mpi, zero0) { check_all<wo::zero<0>>(); }
TEST(optim_mpi, zero1) { check_all<wo::zero<1>>(); }
TEST(optim_mpi, zero2) { check_all<wo::zero<2>>(); }
TEST(optim_mpi, zero3) { check_all<wo::zero<3>>(); }
TEST(optim_mpi, hybrid) {
  check_all<wo::hybrid<wo::zero<1>, wo::zero<0>>>();
  check_all<wo::hybrid<wo::zero<3>, wo::zero<0>>>();
}

TEST(optim_mpi, checkpoint_round_trip) {
  communicator& c = weft::test::mpi_world();
  const l1_linear m(batch);
  const wo::adamw rule{};
  const wo::data_parallel_options o{.bucket_elements = 5, .overlap = false};
  // Every process names the same directory: rank 0's pid, broadcast.
  long id = static_cast<long>(::getpid());
  ASSERT_EQ(MPI_Bcast(&id, 1, MPI_LONG, 0, c.native()), MPI_SUCCESS);
  const auto dir = std::filesystem::temp_directory_path() / ("weft_ckpt_mpi_" + std::to_string(id));
  std::vector<float> saved;
  {
    auto opt = wo::make_data_parallel<wo::zero<2>, float>(c, m.params, rule, o);
    opt->set_parameters(m.initial());
    for (const auto& t : m.params.tensors()) {
      auto g = opt->grad(t.name);
      for (std::size_t k = 0; k < g.size(); ++k)
        g[k] = static_cast<float>(k % 3) - 1.0f;
      opt->grad_ready(t.name);
    }
    (void)opt->step();
    wo::checkpoint::save(*opt, c, dir);
    saved = opt->gather_parameters();
  }
  auto opt = wo::make_data_parallel<wo::zero<3>, float>(c, m.params, rule, o);
  wo::checkpoint::load(*opt, c, dir);
  EXPECT_EQ(opt->gather_parameters(), saved);
  EXPECT_EQ(opt->steps(), 1);
  c.barrier();
  if (c.rank() == 0) std::filesystem::remove_all(dir);
}

} // namespace
