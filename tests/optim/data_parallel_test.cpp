// Sharded data-parallel training equals single-rank training on the full batch: every ZeRO
// stage and hybrid sharding, DP = 1..4, SGD / Adam / AdamW, with and without clipping.
#include <weft/optim.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "optim/support.hpp"
#include "support/scale.hpp"

namespace {

using namespace weft;
using namespace weft::test::optim;
namespace wo = weft::optim;

constexpr int batch = 12; // divides by 1..4
constexpr int steps = 10;

template <class Policy>
class sharded_training : public ::testing::Test {};
using policies =
    ::testing::Types<wo::zero<0>, wo::zero<1>, wo::zero<2>, wo::zero<3>,
                     wo::hybrid<wo::zero<1>, wo::zero<0>>, wo::hybrid<wo::zero<3>, wo::zero<0>>>;
TYPED_TEST_SUITE(sharded_training, policies);

wo::data_parallel_options small_buckets(int dp, float max_norm) {
  // 20 elements: fc1.w alone (35), fc1.b + fc2.w (28), fc2.b (3); 35 and 28 do not divide by 3, 35
  // and 3 not by 4 (35 not by 2 either), so at every DP size above 1 some bucket is padded.
  return {.bucket_elements = 20, .max_grad_norm = max_norm, .inner_size = dp % 2 == 0 ? 2 : 1};
}

template <class Policy, class Rule>
double check_float(const mlp& m, rule_kind k, Rule rule, int dp, float max_norm) {
  const auto expected = train_serial(m, batch, k, steps, 1.0f, max_norm);
  const auto got =
      train_parallel<Policy>(m, batch, dp, rule, steps, 1.0f, small_buckets(dp, max_norm));
  const double err = relative_error(got, expected);
  EXPECT_LT(err, 1e-5) << name_of(k) << " dp " << dp << " clip " << max_norm;
  // The run must have moved the weights (a test that cannot fail is no test).
  EXPECT_GT(relative_error(m.initial(), expected), 1e-2);
  return err;
}

TYPED_TEST(sharded_training, float_mlp_matches_full_batch_training) {
  const mlp m(batch);
  double worst = 0;
  for (int dp = 1; dp <= 4; ++dp) {
    for (float clip : {0.0f, 0.05f}) { // 0.05: below the gradients' norm, so every step clips
      worst = std::max(worst, check_float<TypeParam>(m, rule_kind::sgd, sgd_rule(), dp, clip));
      worst = std::max(worst, check_float<TypeParam>(m, rule_kind::adam, adam_rule(), dp, clip));
      worst = std::max(worst, check_float<TypeParam>(m, rule_kind::adamw, adamw_rule(), dp, clip));
    }
  }
  std::printf("worst relative error against full-batch training: %.3g\n", worst);
}

TYPED_TEST(sharded_training, integer_data_sgd_is_bitwise) {
  const l1_linear m(batch);
  for (int dp = 1; dp <= 4; ++dp) {
    for (float clip : {0.0f, 0.5f}) {
      const auto expected = train_serial(m, batch, rule_kind::sgd, steps, 1.0f / batch, clip);
      const auto got = train_parallel<TypeParam>(m, batch, dp, sgd_rule(), steps, 1.0f / batch,
                                                 small_buckets(dp, clip));
      EXPECT_EQ(got, expected) << "dp " << dp << " clip " << clip;
    }
  }
}

// Half and bfloat16 parameters with fp32 master weights; half with loss scaling (256: the
// scaled integer gradients stay exact). The reference rounds its fp32 weights at the end.
template <class P>
void check_mixed(bool scaling) {
  const l1_linear m(batch);
  const auto expected =
      rounded_to<P>(train_serial(m, batch, rule_kind::sgd, steps, 1.0f / batch, 0.0f));
  for (int dp : {1, 3, 4}) {
    auto o = small_buckets(dp, 0.0f);
    o.loss_scaling = scaling;
    o.scaling.initial = 256.0f;
    EXPECT_EQ((train_parallel<wo::zero<0>, P>(m, batch, dp, sgd_rule(), steps, 1.0f / batch, o)),
              expected)
        << dp;
    EXPECT_EQ((train_parallel<wo::zero<1>, P>(m, batch, dp, sgd_rule(), steps, 1.0f / batch, o)),
              expected)
        << dp;
    EXPECT_EQ((train_parallel<wo::zero<2>, P>(m, batch, dp, sgd_rule(), steps, 1.0f / batch, o)),
              expected)
        << dp;
    EXPECT_EQ((train_parallel<wo::zero<3>, P>(m, batch, dp, sgd_rule(), steps, 1.0f / batch, o)),
              expected)
        << dp;
    EXPECT_EQ((train_parallel<wo::hybrid<wo::zero<2>, wo::zero<0>>, P>(m, batch, dp, sgd_rule(),
                                                                       steps, 1.0f / batch, o)),
              expected)
        << dp;
  }
}

// Growth every `interval` good steps up to max_scale, backoff on overflow down to min_scale.
TEST(loss_scaler, grows_and_backs_off_within_its_bounds) {
  wo::loss_scaler s({.initial = 4.0f,
                     .growth = 2.0f,
                     .backoff = 0.5f,
                     .interval = 2,
                     .min_scale = 1.0f,
                     .max_scale = 16.0f});
  s.update(false);
  EXPECT_EQ(s.scale(), 4.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 8.0f);
  for (int i = 0; i < 10; ++i)
    s.update(false);
  EXPECT_EQ(s.scale(), 16.0f);
  s.update(true);
  EXPECT_EQ(s.scale(), 8.0f);
  EXPECT_EQ(s.good_steps(), 0);
  for (int i = 0; i < 10; ++i)
    s.update(true);
  EXPECT_EQ(s.scale(), 1.0f);
  // The defaults stop at 2^24 (a scale grown to infinity would stay there, skipping every step).
  wo::loss_scaler d(wo::loss_scale_options{});
  for (int i = 0; i < 2000 * 200; ++i)
    d.update(false);
  EXPECT_EQ(d.scale(), 16777216.0f);
  EXPECT_THROW(wo::loss_scaler({.initial = 32.0f, .max_scale = 16.0f}), error);
  EXPECT_THROW(wo::loss_scaler({.max_scale = std::numeric_limits<float>::infinity()}), error);
}

TEST(mixed_precision, half_with_loss_scaling_keeps_fp32_master_weights) { check_mixed<half>(true); }
TEST(mixed_precision, bfloat16_keeps_fp32_master_weights) { check_mixed<bfloat16>(false); }

TEST(mixed_precision, overflow_skips_the_step_on_every_rank_and_backs_off) {
  const l1_linear m(batch);
  local::run(3, [&](local::communicator& c) {
    wo::data_parallel_options o{.bucket_elements = 8};
    o.scaling.initial = 65536.0f;
    auto opt = wo::make_data_parallel<wo::zero<2>, half>(c, m.params, sgd_rule(), o);
    opt->set_parameters(m.initial());
    const auto before = opt->gather_parameters();
    // Only rank 1 overflows (in one element): every rank must skip.
    for (const auto& t : m.params.tensors()) {
      auto g = opt->grad(t.name);
      for (auto& v : g)
        v = half(1.0f);
      if (c.rank() == 1 && t.name == "b") g[0] = half(60000.0f * 2.0f); // rounds to infinity
      opt->grad_ready(t.name);
    }
    const auto r = opt->step(1.0f);
    EXPECT_TRUE(r.skipped);
    EXPECT_EQ(opt->loss_scale(), 32768.0f);
    EXPECT_EQ(opt->steps(), 0);
    EXPECT_EQ(opt->gather_parameters(), before);
    // The next, finite step goes through.
    for (const auto& t : m.params.tensors()) {
      for (auto& v : opt->grad(t.name))
        v = half(1.0f);
      opt->grad_ready(t.name);
    }
    EXPECT_FALSE(opt->step(1.0f).skipped);
    EXPECT_EQ(opt->steps(), 1);
    EXPECT_NE(opt->gather_parameters(), before);
  });
}

TEST(data_parallel, bad_input_is_reported) {
  const l1_linear m(batch);
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<1>>(c, m.params, sgd_rule(), {.bucket_elements = 8});
    EXPECT_THROW(opt->set_parameters(std::vector<float>(3)), error);
    EXPECT_THROW((void)opt->param("nope"), error);
    (void)opt->grad("w");
    opt->grad_ready("w");
    EXPECT_THROW(opt->grad_ready("w"), error); // twice
    (void)opt->step();
  });
  // w and b share one bucket: w marked twice is refused, and does not count for b, whose mark
  // then starts the reduction; a mark after the reduction started is refused as such.
  const auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const error& e) {
      return e.what();
    }
    return "";
  };
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<1>>(c, m.params, sgd_rule());
    opt->grad_ready("w");
    EXPECT_NE(
        message_of([&] { opt->grad_ready("w"); }).find("tensor 'w' marked ready twice in one step"),
        std::string::npos);
    opt->grad_ready("b");
    (void)opt->step();
    opt->reduce_gradients();
    EXPECT_NE(message_of([&] {
                opt->grad_ready("b");
              }).find("'b' marked ready after its bucket's reduction started"),
              std::string::npos);
    (void)opt->step();
  });
  EXPECT_THROW(local::run(3,
                          [&](local::communicator& c) {
                            auto opt = wo::make_data_parallel<wo::hybrid<wo::zero<2>, wo::zero<0>>>(
                                c, m.params, sgd_rule(), {.inner_size = 2});
                          }),
               error);
  wo::param_set ps;
  ps.add("a", {2});
  EXPECT_THROW(ps.add("a", {3}), error);
  EXPECT_THROW(ps.mark_tied_copy(ps.tensors().size()), error);
}

// Ranks that complete their gradients in different orders (a backward's order is not fixed:
// MoE experts, conditional branches), or leave a tensor for step() to count as zero, still
// reduce bucket with bucket: SGD with lr 1 from 0 gives minus the summed gradients. Reference:
// the sums by hand (a: 1 + 2, b: 100 + 200; a unmarked on rank 0 counts 0 there).
template <class Policy>
void check_marking_order(bool overlap) {
  wo::param_set ps;
  ps.add("a", {4});
  ps.add("b", {4});
  for (const bool unused : {false, true}) {
    local::run(2, [&](local::communicator& c) {
      auto opt = wo::make_data_parallel<Policy>(c, ps, wo::sgd{.lr = 1.0f},
                                                {.bucket_elements = 4, .overlap = overlap});
      opt->set_parameters(std::vector<float>(8, 0.0f));
      const auto r = static_cast<float>(c.rank() + 1);
      std::vector<std::string> order =
          c.rank() == 0 ? std::vector<std::string>{"a", "b"} : std::vector<std::string>{"b", "a"};
      if (unused && c.rank() == 0) order = {"b"};
      for (const auto& n : order) {
        for (auto& x : opt->grad(n))
          x = (n == "a" ? 1.0f : 100.0f) * r;
        opt->grad_ready(n);
      }
      (void)opt->step();
      const auto p = opt->gather_parameters();
      const float a = unused ? -2.0f : -3.0f;
      for (std::size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(p[i], a) << "a[" << i << "] on rank " << c.rank()
                           << (unused ? ", a unmarked on rank 0" : "");
        EXPECT_EQ(p[4 + i], -300.0f) << "b[" << i << "] on rank " << c.rank();
      }
    });
  }
}

TEST(data_parallel, ranks_marking_gradients_in_different_orders_reduce_the_same_buckets) {
  for (const bool overlap : {false, true}) {
    check_marking_order<wo::zero<0>>(overlap);
    check_marking_order<wo::zero<1>>(overlap);
    check_marking_order<wo::zero<2>>(overlap);
    check_marking_order<wo::zero<3>>(overlap);
  }
}

// reduce_bucket: each micro-batch's bucket reduce-scattered and added into the shard, the
// full-size bucket freed in between. SGD with lr 1 from 0 gives minus the sums over ranks and
// micro-batches, by hand: on rank r micro-batch k writes a[i] = (k + 1) * (r + 1) and
// b[i] = 100 * (k + 1) * (r + 1), so over 3 micro-batches and 2 ranks a sums to 6 * 3 = 18 and
// b to 1,800. Bucket b (the last) is reduced every micro-batch, a once, at step().
template <class Policy>
void check_reduce_every_microbatch(bool overlap, bool hybrid_pairs) {
  wo::param_set ps;
  ps.add("a", {6});
  ps.add("b", {6});
  const int ranks = hybrid_pairs ? 4 : 2;
  local::run(ranks, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<Policy>(
        c, ps, wo::sgd{.lr = 1.0f},
        {.bucket_elements = 6, .overlap = overlap, .inner_size = hybrid_pairs ? 2 : 0});
    ASSERT_EQ(opt->buckets().buckets().size(), 2u);
    opt->set_parameters(std::vector<float>(12, 0.0f));
    opt->reset_peaks();
    const auto r = static_cast<float>(c.rank() % 2 + 1);
    const float pairs = static_cast<float>(ranks / 2);
    for (int step = 1; step <= 2; ++step) { // the second starts from a shard the first summed
      for (int k = 0; k < 3; ++k) {
        for (auto& x : opt->grad("a"))
          x += static_cast<float>(k + 1) * r;
        for (auto& x : opt->grad("b"))
          x = 100.0f * static_cast<float>(k + 1) * r; // a fresh bucket each micro-batch
        opt->reduce_bucket(1);
      }
      opt->grad_ready("a");
      (void)opt->step();
      const auto p = opt->gather_parameters();
      const auto steps = static_cast<float>(step);
      for (std::size_t i = 0; i < 6; ++i) {
        EXPECT_EQ(p[i], -18.0f * pairs * steps) << "a[" << i << "] on rank " << c.rank();
        EXPECT_EQ(p[6 + i], -1800.0f * pairs * steps) << "b[" << i << "] on rank " << c.rank();
      }
    }
    // Full buckets at once, at most: a's (written all step) and b's of one micro-batch; with
    // overlap also b's of the micro-batch before, until the progress thread has reduced it
    // (reduce_bucket keeps one reduction in flight).
    EXPECT_LE(opt->memory().gradient_buckets.peak, (overlap ? 3 : 2) * 6 * sizeof(float));
    EXPECT_EQ(opt->memory().gradient_buckets.current, 0u);
  });
}

TEST(data_parallel, zero_2_and_3_reduce_a_bucket_every_micro_batch_into_the_shard) {
  for (const bool overlap : {false, true}) {
    check_reduce_every_microbatch<wo::zero<2>>(overlap, false);
    check_reduce_every_microbatch<wo::zero<3>>(overlap, false);
    check_reduce_every_microbatch<wo::hybrid<wo::zero<2>, wo::zero<0>>>(overlap, true);
  }
}

// reduce_bucket is zero<2>/<3>'s; a bucket written after its last reduce_bucket is an error at
// step(), not a dropped gradient; a bucket already reduced as the step's last is not reopened.
TEST(data_parallel, reduce_bucket_misuse_is_reported) {
  wo::param_set ps;
  ps.add("a", {4});
  ps.add("b", {4});
  const auto says = [](auto&& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error, expected one saying " << what;
    } catch (const weft::error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  local::run(1, [&](local::communicator& c) {
    auto z1 =
        wo::make_data_parallel<wo::zero<1>>(c, ps, wo::sgd{.lr = 1.0f}, {.bucket_elements = 4});
    says([&] { z1->reduce_bucket(0); }, "keeps whole gradients");
    auto z2 =
        wo::make_data_parallel<wo::zero<2>>(c, ps, wo::sgd{.lr = 1.0f}, {.bucket_elements = 4});
    z2->set_parameters(std::vector<float>(8, 0.0f));
    says([&] { z2->reduce_bucket(2); }, "no bucket 2");
    z2->reduce_bucket(1);
    z2->grad("b")[0] = 1.0f;
    says([&] { (void)z2->step(); },
         "opened (grad, bucket_gradients) or marked ready after its last");
  });
  local::run(1, [&](local::communicator& c) {
    auto z2 =
        wo::make_data_parallel<wo::zero<2>>(c, ps, wo::sgd{.lr = 1.0f}, {.bucket_elements = 4});
    z2->set_parameters(std::vector<float>(8, 0.0f));
    z2->grad("b")[0] = 1.0f;
    z2->grad_ready("b");
    says([&] { z2->reduce_bucket(1); }, "already being reduced");
  });
  local::run(1, [&](local::communicator& c) {
    auto z3 =
        wo::make_data_parallel<wo::zero<3>>(c, ps, wo::sgd{.lr = 1.0f}, {.bucket_elements = 4});
    z3->set_parameters(std::vector<float>(8, 0.0f));
    z3->reduce_bucket(0);
    z3->reduce_gradients();
    says([&] { z3->reduce_bucket(0); }, "already started this step's last reductions");
  });
}

// An empty tensor after the last bucket closed joins it (it had a bucket index past the end).
TEST(data_parallel, an_empty_last_tensor_joins_the_last_bucket) {
  wo::param_set ps;
  ps.add("w", {8});
  ps.add("empty", {0});
  const wo::layout l(ps, 4, 2);
  ASSERT_EQ(l.buckets().size(), 1u);
  EXPECT_EQ(l.tensors()[1].bucket, 0u);
  EXPECT_EQ(l.buckets()[0].end_tensor, 2u);
  local::run(2, [&](local::communicator& c) {
    auto opt =
        wo::make_data_parallel<wo::zero<1>>(c, ps, wo::sgd{.lr = 1.0f}, {.bucket_elements = 4});
    opt->set_parameters(std::vector<float>(8, 0.0f));
    for (auto& x : opt->grad("w"))
      x = 1.0f;
    opt->grad_ready("w");
    opt->grad_ready("empty");
    (void)opt->step();
    EXPECT_EQ(opt->gather_parameters(), std::vector<float>(8, -2.0f));
  });
}

// Hyper-parameters PyTorch refuses (ValueError) are refused before anything collective runs.
TEST(data_parallel, out_of_range_hyper_parameters_are_refused) {
  wo::param_set ps;
  ps.add("w", {4});
  const auto message = [&](auto rule, wo::data_parallel_options o = {}) {
    std::string what;
    local::run(1, [&](local::communicator& c) {
      try {
        (void)wo::make_data_parallel<wo::zero<0>>(c, ps, rule, o);
      } catch (const error& e) {
        what = e.what();
      }
    });
    return what;
  };
  EXPECT_NE(message(wo::adamw{.beta1 = 1.0f}).find("adamw: beta1 must be in [0, 1), not 1"),
            std::string::npos);
  EXPECT_NE(message(wo::adam{.beta2 = 1.5f}).find("adam: beta2 must be in [0, 1), not 1.5"),
            std::string::npos);
  EXPECT_NE(
      message(wo::adamw{.lr = -1e-3f}).find("adamw: lr must be a finite number >= 0, not -0.001"),
      std::string::npos);
  EXPECT_NE(message(wo::adamw{.eps = -1e-8f}).find("eps"), std::string::npos);
  EXPECT_NE(message(wo::adamw{.weight_decay = -0.1f}).find("weight_decay"), std::string::npos);
  EXPECT_NE(message(wo::sgd{.lr = std::numeric_limits<float>::quiet_NaN()}).find("sgd: lr must be"),
            std::string::npos);
  EXPECT_NE(message(wo::sgd{.momentum = -0.9f}).find("momentum"), std::string::npos);
  EXPECT_NE(message(wo::sgd{.nesterov = true}).find("Nesterov momentum needs momentum > 0"),
            std::string::npos);
  EXPECT_NE(message(wo::sgd{}, {.scaling = {.min_scale = 0.0f}}).find("0 < min_scale <= initial"),
            std::string::npos);
  EXPECT_EQ(message(wo::adamw{
                .lr = 0.0f, .beta1 = 0.0f, .beta2 = 0.0f, .eps = 0.0f, .weight_decay = 0.0f}),
            "");
  EXPECT_EQ(message(wo::sgd{.momentum = 0.9f, .nesterov = true}), "");
}

// TP = 2 x DP = 2 on 4 ranks: "a" is split across the tensor-parallel pair (each holds a
// different half), "ln" is replicated on both, "a_tied" is a tied copy of "a" (a head tied to
// the embedding: the same gradient). The global norm the step reports must be the whole
// model's: a's halves both counted, ln once, a_tied not at all, the DP shards summed.
template <class Policy>
void check_model_parallel_norm() {
  wo::param_set ps;
  ps.add("a", {5});
  ps.add("ln", {3}, /*replicated=*/true);
  ps.mark_tied_copy(ps.add("a_tied", {5}));
  double expected_sq = 0;
  const auto grad = [](const std::string& name, int tp, int dp, std::size_t i) {
    return static_cast<float>(name != "ln" ? (tp * 7 + dp * 3 + static_cast<int>(i)) % 5 - 2
                                           : (dp * 2 + static_cast<int>(i)) % 3 +
                                                 1); // ln: the same on both tp ranks
  };
  for (int tp = 0; tp < 2; ++tp) {
    for (std::size_t i = 0; i < 5; ++i) {
      const double s = grad("a", tp, 0, i) + grad("a", tp, 1, i);
      expected_sq += s * s;
    }
  }
  for (std::size_t i = 0; i < 3; ++i) {
    const double s = grad("ln", 0, 0, i) + grad("ln", 0, 1, i);
    expected_sq += s * s;
  }
  local::run(4, [&](local::communicator& world) {
    const int tp = world.rank() % 2, dp = world.rank() / 2;
    auto dp_comm = world.split(tp, world.rank());
    auto opt = wo::make_data_parallel<Policy, float>(dp_comm, ps, wo::sgd{},
                                                     {.bucket_elements = 4, .max_grad_norm = 1e9f});
    auto norm_group =
        world.split(opt->replica_rank(), world.rank()); // shard group x TP, one replica
    opt->set_norm_group(norm_group, tp);
    for (const auto& t : ps.tensors()) {
      auto g = opt->grad(t.name);
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = grad(t.name, tp, dp, i);
      opt->grad_ready(t.name);
    }
    EXPECT_EQ(opt->step(1.0f).grad_norm, std::sqrt(expected_sq));
  });
}

TEST(data_parallel,
     clipping_norm_spans_tp_ranks_counting_replicated_tensors_once_and_tied_copies_never) {
  check_model_parallel_norm<wo::zero<0>>();
  check_model_parallel_norm<wo::zero<1>>();
  check_model_parallel_norm<wo::zero<3>>();
}

TEST(data_parallel, hybrid_shards_within_a_node_by_default) {
  const l1_linear m(batch);
  const auto expected = train_serial(m, batch, rule_kind::sgd, steps, 1.0f / batch, 0.0f);
  std::vector<float> got;
  local::run(topology::parse("2x2"), [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::hybrid<wo::zero<2>, wo::zero<0>>, float>(
        c, m.params, sgd_rule(), {.bucket_elements = 5});
    EXPECT_EQ(opt->shard_size(), 2);
    EXPECT_EQ(opt->replica_size(), 2);
    opt->set_parameters(m.initial());
    const int begin = batch * c.rank() / 4, end = batch * (c.rank() + 1) / 4;
    for (int s = 0; s < steps; ++s) {
      const auto w = opt->gather_parameters();
      const auto g = m.gradient(w, begin, end);
      for (const auto& t : m.params.tensors()) {
        auto gs = opt->grad(t.name);
        for (std::size_t i = 0; i < t.count; ++i)
          gs[i] = g[t.offset + i];
        opt->grad_ready(t.name);
      }
      (void)opt->step(1.0f / batch);
    }
    const auto p = opt->gather_parameters();
    if (c.rank() == 0) got = p;
  });
  EXPECT_EQ(got, expected);
}

TEST(layout, buckets_pad_to_equal_shards) {
  wo::param_set ps;
  ps.add("a", {5});
  ps.add("b", {2, 3});
  ps.add("c", {1});
  const wo::layout l(ps, 6, 4);
  ASSERT_EQ(l.buckets().size(), 2u); // {a, b} = 11, {c} = 1
  EXPECT_EQ(l.buckets()[0].padded, 12u);
  EXPECT_EQ(l.buckets()[1].padded, 4u);
  EXPECT_EQ(l.padding(), 4u);
  EXPECT_EQ(l.shard_elements(), 4u);
  EXPECT_EQ(l.padded_offset(2), 12u);
  EXPECT_EQ(wo::default_bucket_elements(8), 40'000'000u);
  EXPECT_EQ(wo::default_bucket_elements(64), 64'000'000u);
}

} // namespace
