// weft::pipeline::executor on the local transport: training an MLP through every schedule gives
// the serial reference's losses and gradients; messages received out of the sender's order;
// results that view the executor's own buffers; and the errors, each naming rank, action and
// microbatch. The same training runs under MPI in mpi/executor_mpitest.cpp.
#include <weft/comm/traced.hpp>
#include <weft/comm/transport/local.hpp>
#include <weft/pipeline/executor.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/mlp.hpp"

namespace {

namespace pl = weft::pipeline;
namespace mlp = weft::test::mlp;
using pl::action;
using pl::action_kind;
using weft::local::communicator;

constexpr auto timeout = std::chrono::seconds(30);

static_assert(pl::point_to_point<communicator, float>);
static_assert(pl::schedule_policy<pl::interleaved<2>>);

::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" is not in \"" << text << "\"";
}

// The message of the weft::error that body() throws, or "" when it throws none.
template <class F>
std::string failure_of(F&& body) {
  try {
    body();
  } catch (const weft::error& e) {
    return e.what();
  }
  return "";
}

// --- training matches the serial reference --------------------------------------------------

// Trains the MLP for two steps on p ranks, gradients zeroed between them, and checks each
// rank's gradients and losses of both steps against the reference. Returns false where the
// generator refuses (p, m).
template <class Policy, bool Split>
bool train_and_check(int p, int microbatches) {
  std::optional<pl::schedule> s;
  try {
    s = Policy::make(p, microbatches);
  } catch (const weft::error&) {
    return false;
  }
  const mlp::model model = mlp::make(s->virtual_stages(), microbatches);
  const mlp::reference_result ref = mlp::reference(model);
  std::vector<mlp::stage<Split>> stages;
  for (int r = 0; r < p; ++r)
    stages.emplace_back(model, r, p);
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(p) * 2);
  std::vector<mlp::gradients<float>> first_step(static_cast<std::size_t>(p),
                                                mlp::gradients<float>(model));
  std::vector<char> has_loss(static_cast<std::size_t>(p));
  weft::local::run(p, [&](communicator& c) {
    c.set_timeout(timeout);
    const auto r = static_cast<std::size_t>(c.rank());
    pl::executor<Policy, communicator> ex(c, microbatches, model.boundaries());
    has_loss[r] = ex.has_loss() ? 1 : 0;
    losses[2 * r] = ex.run(stages[r]);
    first_step[r] = std::exchange(stages[r].grads, mlp::gradients<float>(model));
    losses[2 * r + 1] = ex.run(stages[r]);
  });
  for (int r = 0; r < p; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    const std::string where = s->name + " p=" + std::to_string(p) +
                              " m=" + std::to_string(microbatches) + " rank " + std::to_string(r);
    mlp::expect_matches(model, ref, stages[ur], first_step[ur], s->chunks, losses[2 * ur],
                        has_loss[ur] != 0, where + " step 0");
    mlp::expect_matches(model, ref, stages[ur], stages[ur].grads, s->chunks, losses[2 * ur + 1],
                        has_loss[ur] != 0, where + " step 1");
  }
  EXPECT_EQ(has_loss[static_cast<std::size_t>(p - 1)], 1);
  return true;
}

template <class Policy>
class executor_training : public ::testing::Test {};

using policies = ::testing::Types<pl::gpipe, pl::one_f_one_b, pl::interleaved<2>,
                                  pl::interleaved<3>, pl::zero_bubble_h1>;
TYPED_TEST_SUITE(executor_training, policies);

// Virtual stages of 1, 3, 2, 1, 3, ... layers (mlp::make): the uneven split is the stage
// functions' business, and the boundaries carry different sizes.
TYPED_TEST(executor_training, gives_the_serial_losses_and_gradients) {
  int ran = 0;
  for (int p = 1; p <= 4; ++p) {
    for (const int m : {p, p + 1, 2 * p, 4 * p}) {
      if (train_and_check<TypeParam, true>(p, m)) ++ran;
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GE(ran, 6) << "too few (p, m) are valid for this schedule: the test checks little";
}

// A stage without weight_grad: B is the whole backward (schedules that do not split it).
TYPED_TEST(executor_training, runs_stages_whose_backward_does_everything) {
  if constexpr (TypeParam::split_backward) {
    GTEST_SKIP() << "this schedule splits the backward: the stage needs weight_grad";
  } else {
    EXPECT_TRUE((train_and_check<TypeParam, false>(3, 6)));
  }
}

// --- messages out of the sender's order -----------------------------------------------------

TEST(executor, receives_messages_out_of_the_order_they_were_sent) {
  EXPECT_TRUE((train_and_check<mlp::reversed_receiver, true>(2, 4)));
}

// --- results that view the executor's own buffers -------------------------------------------

// forward and backward return their argument (forward's is a vector input() returned by
// value; backward's the executor's buffer); the loss gradient is a span of the stage's
// storage. Each microbatch's loss is the sum of its input, which passes through every stage
// unchanged.
struct pass_through {
  std::vector<float> batch;
  std::vector<float> ones;
  std::vector<float> input(int mb) const {
    const auto x = pl::microbatch(std::span<const float>(batch), 1, 4, mb);
    return {x.begin(), x.end()};
  }
  std::span<const float> forward(int, int, std::span<const float> x) const { return x; }
  std::span<const float> backward(int, int, std::span<const float> g) const { return g; }
  struct result {
    double loss;
    std::span<const float> gradient;
  };
  result loss(int, std::span<const float> y) const {
    double sum = 0;
    for (float v : y)
      sum += v;
    return {sum, std::span<const float>(ones).first(y.size())};
  }
};

TEST(executor, stage_results_may_view_their_argument) {
  for (const int p : {1, 2, 3}) {
    std::vector<std::vector<double>> losses(static_cast<std::size_t>(p));
    weft::local::run(p, [&](communicator& c) {
      c.set_timeout(timeout);
      pass_through st{{1, 2, 3, 4, 5, 6, 7, 8}, std::vector<float>(2, 1.0f)};
      pl::executor<pl::one_f_one_b, communicator> ex(c, 4, 2);
      losses[static_cast<std::size_t>(c.rank())] = ex.run(st);
    });
    EXPECT_EQ(losses.back(), (std::vector<double>{3, 7, 11, 15})) << "p=" << p;
  }
}

// --- errors -----------------------------------------------------------------------------------

// Sends `width` ones forward and back; fails as told.
struct faulty {
  std::size_t width = 4;
  int fail_rank = -1;
  int fail_microbatch = -1;
  enum class fault { none, forward_throws, forward_size, backward_size, loss_size } kind{};
  int rank = 0;

  bool here(int mb) const { return rank == fail_rank && mb == fail_microbatch; }
  std::vector<float> input(int) const { return std::vector<float>(width, 1.0f); }
  std::vector<float> forward(int mb, int, std::span<const float>) const {
    if (here(mb) && kind == fault::forward_throws) throw std::runtime_error("boom");
    return std::vector<float>(width + (here(mb) && kind == fault::forward_size ? 1 : 0), 1.0f);
  }
  std::vector<float> backward(int mb, int, std::span<const float>) const {
    return std::vector<float>(width - (here(mb) && kind == fault::backward_size ? 1 : 0), 1.0f);
  }
  pl::loss_result<float> loss(int mb, std::span<const float> y) const {
    return {0.0, std::vector<float>(y.size() * (here(mb) && kind == fault::loss_size ? 2 : 1))};
  }
};

// Runs 1F1B on 3 ranks with `stage`; returns the message of what run() rethrows.
std::string failure_on_three_ranks(faulty stage) {
  return failure_of([&] {
    weft::local::run(3, [&](communicator& c) {
      c.set_timeout(timeout);
      faulty mine = stage;
      mine.rank = c.rank();
      pl::executor<pl::one_f_one_b, communicator> ex(c, 4, mine.width);
      ex.run(mine);
    });
  });
}

TEST(executor_errors, a_throwing_stage_function_names_rank_action_and_microbatch) {
  const std::string what = failure_on_three_ranks(
      {.fail_rank = 1, .fail_microbatch = 2, .kind = faulty::fault::forward_throws});
  EXPECT_TRUE(contains(what, "pipeline::executor 1f1b on rank 1: action "));
  EXPECT_TRUE(contains(what, " (F2.0), microbatch 2: forward threw: boom"));
}

TEST(executor_errors, wrong_sizes_name_what_was_expected) {
  EXPECT_TRUE(
      contains(failure_on_three_ranks(
                   {.fail_rank = 0, .fail_microbatch = 1, .kind = faulty::fault::forward_size}),
               "on rank 0: action 2 (F1.0), microbatch 1: forward returned 5 elements, "
               "but the boundary to virtual stage 1 carries 4"));
  EXPECT_TRUE(
      contains(failure_on_three_ranks(
                   {.fail_rank = 2, .fail_microbatch = 3, .kind = faulty::fault::backward_size}),
               "(B3.0), microbatch 3: backward returned 3 elements, but the boundary "
               "back to virtual stage 1 carries 4"));
  EXPECT_TRUE(
      contains(failure_on_three_ranks(
                   {.fail_rank = 2, .fail_microbatch = 0, .kind = faulty::fault::loss_size}),
               "on rank 2: action 1 (F0.0), microbatch 0: loss returned 8 elements, but "
               "the gradient of the output has the output's 4"));
}

// A rank that fails before it sends: its consumer's receive fails, naming the peer.
TEST(executor_errors, a_failed_receive_names_the_peer) {
  std::string at_rank_1;
  const std::string first = failure_of([&] {
    weft::local::run(2, [&](communicator& c) {
      c.set_timeout(timeout);
      faulty st{.rank = c.rank()};
      pl::executor<pl::gpipe, communicator> ex(c, 2, st.width);
      if (c.rank() == 0) throw weft::error("rank 0 gives up");
      try {
        ex.run(st);
      } catch (const weft::error& e) {
        at_rank_1 = e.what();
        EXPECT_EQ(e.rank(), 1);
        EXPECT_EQ(e.peer(), 0);
        throw;
      }
    });
  });
  EXPECT_TRUE(contains(first, "rank 0 gives up"));
  EXPECT_TRUE(contains(at_rank_1,
                       "pipeline::executor gpipe on rank 1 (peer 0): action 0 "
                       "(recv:F0.0<-0), microbatch 0: "));
}

TEST(executor_errors, construction_checks_boundaries_and_the_schedule) {
  weft::local::run(2, [](communicator& c) {
    c.set_timeout(timeout);
    using ex2 = pl::executor<pl::interleaved<2>, communicator>;
    EXPECT_TRUE(contains(failure_of([&] {
                           ex2(c, 4, std::vector<std::size_t>{8, 8});
                         }),
                         "pipeline::executor interleaved<2> on rank " + std::to_string(c.rank()) +
                             ": needs the size of each of the 3 boundaries between its 4 virtual "
                             "stages (2 stages x 2 chunks), not 2"));
    // The generator's own refusal.
    EXPECT_TRUE(contains(failure_of([&] { ex2(c, 3, 8); }), "not a multiple of the group size"));
    EXPECT_TRUE(
        contains(failure_of([&] { pl::executor<pl::zero_bubble_h1, communicator>(c, 1, 8); }),
                 "needs at least as many microbatches as stages"));
  });
}

// weft::local's sends wait once 64 messages to a peer are unreceived. Interleaved with a group
// of 130 microbatches on 2 ranks (Megatron-core's microbatch group size, breadth-first) has
// rank 1 send 65 before rank 0 receives one: refused at construction, rather than hang until
// the watchdog blames the ranks. A group of 129 fits.
TEST(executor_errors, a_schedule_that_overfills_a_channel_is_refused_at_construction) {
  weft::local::run(2, [](communicator& c) {
    c.set_timeout(timeout);
    using ex2 = pl::executor<pl::interleaved<2>, communicator>;
    const std::string what = failure_of([&] { ex2(c, 130, 1, {.group_size = 130}); });
    EXPECT_TRUE(contains(what, "the schedule queues more than 64 messages to a peer")) << what;
    EXPECT_TRUE(contains(what, "rank 1 at send:F64.0->0 with 64 messages to rank 0 unreceived"))
        << what;
    EXPECT_EQ(failure_of([&] { ex2(c, 129, 1, {.group_size = 129}); }), "");
    // A traced communicator has the channels of the one it wraps, and is refused the same.
    weft::traced<communicator> t(c.split(0, c.rank()));
    using traced2 = pl::executor<pl::interleaved<2>, weft::traced<communicator>>;
    EXPECT_TRUE(contains(failure_of([&] { traced2(t, 130, 1, {.group_size = 130}); }),
                         "the schedule queues more than 64 messages to a peer"));
  });
  EXPECT_EQ(pl::detail::stalls_with_bounded_channels(
                pl::interleaved<2>::make(2, 130, {.group_size = 130}), 1000),
            "");
}

// A schedule that forgets rank 1's last backward is refused before anything runs.
struct forgetful {
  static constexpr bool split_backward = false;
  static pl::schedule make(int stages, int microbatches, const pl::options& o = {}) {
    pl::schedule s = pl::gpipe::make(stages, microbatches, o);
    auto& list = s.ranks[1];
    list.erase(list.end() - 2); // B1.0, before its send
    s.name = "forgetful";
    return s;
  }
};

// A generator whose split_backward does not describe what it makes: the stage checks made at
// compile time would not hold.
struct mislabelled {
  static constexpr bool split_backward = false;
  static pl::schedule make(int stages, int microbatches, const pl::options& o = {}) {
    return pl::zero_bubble_h1::make(stages, microbatches, o);
  }
};

TEST(executor_errors, a_generator_must_say_whether_it_splits_the_backward) {
  weft::local::run(2, [](communicator& c) {
    EXPECT_TRUE(contains(failure_of([&] { pl::executor<mislabelled, communicator>(c, 2, 4); }),
                         "the generator's split_backward says false, but the schedule it made "
                         "says otherwise"));
  });
}

// A generator that makes fewer microbatches than asked: the step would drop the others.
struct capped {
  static constexpr bool split_backward = false;
  static pl::schedule make(int stages, int microbatches, const pl::options& o = {}) {
    return pl::one_f_one_b::make(stages, std::min(microbatches, stages), o);
  }
};

TEST(executor_errors, a_generator_must_make_the_microbatches_asked_for) {
  weft::local::run(2, [](communicator& c) {
    EXPECT_TRUE(contains(failure_of([&] { pl::executor<capped, communicator>(c, 8, 4); }),
                         "the generator made a schedule of 2 microbatches where 8 were asked for"));
  });
}

TEST(executor_errors, an_invalid_schedule_is_refused_at_construction) {
  weft::local::run(2, [](communicator& c) {
    c.set_timeout(timeout);
    const std::string what = failure_of([&] { pl::executor<forgetful, communicator>(c, 2, 4); });
    EXPECT_TRUE(contains(what, "validating schedule forgetful on rank 1"));
    EXPECT_TRUE(contains(what, "action 3 (F1.0): forwarded but never backwarded: no B1.0"));
  });
}

// --- microbatch() -----------------------------------------------------------------------------

TEST(executor, microbatch_slices_whole_samples) {
  const std::vector<int> batch = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::span<const int> all(batch);
  const auto second = pl::microbatch(all, 3, 2, 1); // 4 samples of 3, 2 microbatches
  EXPECT_EQ(std::vector<int>(second.begin(), second.end()), (std::vector<int>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(pl::microbatch(all, 2, 6, 5).front(), 10);
  EXPECT_TRUE(contains(failure_of([&] { pl::microbatch(all, 5, 2, 0); }),
                       "a batch of 12 elements is no whole number of samples of 5"));
  EXPECT_TRUE(contains(failure_of([&] { pl::microbatch(all, 3, 3, 0); }),
                       "4 samples do not split into 3 equal microbatches"));
  EXPECT_TRUE(contains(failure_of([&] { pl::microbatch(all, 3, 2, 2); }),
                       "microbatch 2 is outside [0, 2)"));
}

} // namespace
