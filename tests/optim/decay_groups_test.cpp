// Weight decay per tensor (param_set::add's decay): tensors added with decay = false are
// updated with weight_decay 0 under every ZeRO stage and hybrid sharding, on 1..4 ranks, with
// buckets and shards cutting through them, for sgd and adam (L2) and adamw (decoupled). The
// reference is a plain per-tensor update in double, written here; layout::decay_runs (the
// runs every update loop walks, host and device) is checked element by element against the
// padded layout; checkpoints record the flags and refuse a model whose flags differ.
#include <weft/optim/checkpoint.hpp>

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "optim/support.hpp"

namespace {

using namespace weft;
using namespace weft::test::optim;
namespace wo = weft::optim;
namespace ck = weft::optim::checkpoint;
namespace fs = std::filesystem;

constexpr int batch = 12; // divides by 1..4
constexpr int steps = 3;

// A quadratic per element, sample n pulling weight i towards t(n, i) with strength a(n):
// loss_n = sum_i a(n) / 2 (w_i - t(n, i))^2, so the gradient is sum_n a(n) (w_i - t(n, i)).
// Written once for float (the ranks) and double (the reference).
template <class T>
std::vector<T> quadratic_gradient(const std::vector<T>& w, int begin, int end) {
  std::vector<T> g(w.size(), T(0));
  for (int n = begin; n < end; ++n) {
    const T a = static_cast<T>(1 + n % 3);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const T t =
          static_cast<T>(static_cast<int>((static_cast<std::size_t>(n) * 7 + i * 3) % 11) - 5) *
          T(0.125);
      g[i] += a * (w[i] - t);
    }
  }
  return g;
}

// Tensors of mixed decay whose sizes make the buckets (16 elements) and shards (2, 3, 4 ranks)
// cut through the exempt ones: with 16-element buckets, [emb.w ln1.w ln1.b] (17), [fc.w fc.b
// head.w] (20), [norm.w tiny.b] (8); ln1.w straddles a shard seam at 2 and 4 ranks, fc.b at 3.
// 21 of the 45 elements are exempt.
struct mixed_decay final : model {
  mixed_decay() {
    params.add("emb.w", {7});
    params.add("ln1.w", {5}, false, false);
    params.add("ln1.b", {5}, false, false);
    params.add("fc.w", {11});
    params.add("fc.b", {3}, false, false);
    params.add("head.w", {2, 3});
    params.add("norm.w", {7}, /*replicated=*/true, /*decay=*/false);
    params.add("tiny.b", {1}, false, false);
  }
  std::vector<float> initial() const override {
    std::vector<float> w(params.elements());
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>(static_cast<int>(i * 5 % 9) - 4) * 0.125f + 0.03f;
    return w;
  }
  std::vector<float> gradient(const std::vector<float>& w, int begin, int end) const override {
    return quadratic_gradient(w, begin, end);
  }
};

constexpr std::size_t bucket_elements = 16;

const wo::sgd sgd_l2{.lr = 0.05f, .momentum = 0.5f, .weight_decay = 0.05f, .nesterov = true};
const wo::adam adam_l2{.lr = 0.01f,
                       .weight_decay = 0.5f}; // L2 under Adam's normalization: large, to be seen
const wo::adamw adamw_decoupled{.lr = 0.01f, .weight_decay = 0.1f};

// The reference: `steps` full-batch steps, tensor by tensor, in double. everywhere: decay every
// tensor (what the optimizer must not do), to show the comparison can tell the difference.
template <class Rule>
std::vector<double> reference(const mixed_decay& m, const Rule& r, bool everywhere = false) {
  const auto& init = m.initial();
  std::vector<double> w(init.begin(), init.end()), s0(w.size(), 0.0), s1(w.size(), 0.0);
  const double lr = r.lr, wd = r.weight_decay, mul = 1.0 / batch;
  for (int t = 1; t <= steps; ++t) {
    const std::vector<double> g = quadratic_gradient(w, 0, batch);
    for (const auto& ti : m.params.tensors()) {
      const double lambda = ti.decay || everywhere ? wd : 0.0;
      for (std::size_t i = ti.offset; i < ti.offset + ti.count; ++i) {
        double gi = g[i] * mul;
        if constexpr (std::is_same_v<Rule, wo::sgd>) {
          gi += lambda * w[i];
          s0[i] = r.momentum * s0[i] + gi;
          gi = r.nesterov ? gi + r.momentum * s0[i] : s0[i];
          w[i] -= lr * gi;
        } else {
          constexpr bool decoupled = std::is_same_v<Rule, wo::adamw>;
          if (!decoupled) gi += lambda * w[i];
          const double b1 = r.beta1, b2 = r.beta2;
          s0[i] = b1 * s0[i] + (1 - b1) * gi;
          s1[i] = b2 * s1[i] + (1 - b2) * gi * gi;
          if (decoupled) w[i] -= lr * lambda * w[i];
          const double mhat = s0[i] / (1 - std::pow(b1, t)), vhat = s1[i] / (1 - std::pow(b2, t));
          w[i] -= lr * mhat / (std::sqrt(vhat) + r.eps);
        }
      }
    }
  }
  return w;
}

// Elements of got farther from want than float rounding allows (1e-6 relative, 1e-7 absolute
// for weights near 0); the worst relative error goes to *worst.
std::size_t mismatches(const std::vector<float>& got, const std::vector<double>& want,
                       double* worst) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    *worst = std::max(*worst, err / std::max(std::fabs(want[i]), 1e-3));
    if (err > 1e-6 * std::fabs(want[i]) + 1e-7) ++bad;
  }
  return bad;
}

wo::data_parallel_options options_for(int dp) {
  return {.bucket_elements = bucket_elements, .inner_size = dp % 2 == 0 ? 2 : 1};
}

template <class Policy>
class decay_groups_training : public ::testing::Test {};
using policies =
    ::testing::Types<wo::zero<0>, wo::zero<1>, wo::zero<2>, wo::zero<3>,
                     wo::hybrid<wo::zero<1>, wo::zero<0>>, wo::hybrid<wo::zero<2>, wo::zero<0>>,
                     wo::hybrid<wo::zero<3>, wo::zero<0>>>;
TYPED_TEST_SUITE(decay_groups_training, policies);

template <class Policy, class Rule>
void check_rule(const mixed_decay& m, const Rule& r, double* worst) {
  const auto want = reference(m, r);
  const auto everywhere = reference(m, r, true);
  // The test can fail: decaying any one exempt tensor too moves some of its elements by more
  // than the tolerance (sgd and adamw: every element; adam's first step is sign(g) whatever
  // the L2 term, so fewer there).
  for (const auto& ti : m.params.tensors()) {
    if (ti.decay) continue;
    const auto part = [&](const auto& v) {
      return std::vector<double>(v.begin() + ti.offset, v.begin() + ti.offset + ti.count);
    };
    const auto e = part(everywhere);
    double ignored = 0;
    EXPECT_GT(mismatches(std::vector<float>(e.begin(), e.end()), part(want), &ignored), 0u)
        << Rule::name << " " << ti.name;
  }
  for (int dp = 1; dp <= 4; ++dp) {
    const auto got = train_parallel<Policy>(m, batch, dp, r, steps, 1.0f / batch, options_for(dp));
    ASSERT_EQ(got.size(), want.size());
    const std::size_t bad = mismatches(got, want, worst);
    EXPECT_EQ(bad, 0u) << Rule::name << " dp " << dp;
    if (bad == 0) continue;
    int shown = 0; // which elements, to say what went wrong
    for (const auto& ti : m.params.tensors()) {
      for (std::size_t i = ti.offset; i < ti.offset + ti.count && shown < 8; ++i) {
        if (std::fabs(static_cast<double>(got[i]) - want[i]) <= 1e-6 * std::fabs(want[i]) + 1e-7)
          continue;
        ++shown;
        ADD_FAILURE() << Rule::name << " dp " << dp << " " << ti.name << "[" << i - ti.offset
                      << "] (decay " << ti.decay << "): got " << got[i] << ", want " << want[i]
                      << ", decayed everywhere " << everywhere[i];
      }
    }
  }
}

TYPED_TEST(decay_groups_training, exempt_tensors_do_not_decay_in_any_shard) {
  const mixed_decay m;
  double worst = 0;
  check_rule<TypeParam>(m, sgd_l2, &worst);
  check_rule<TypeParam>(m, adam_l2, &worst);
  check_rule<TypeParam>(m, adamw_decoupled, &worst);
  std::printf("worst relative error against the per-tensor reference: %.3g\n", worst);
}

// The layout this test relies on: an exempt tensor split across shards, and shards of several runs.
TEST(decay_runs, the_test_model_splits_exempt_tensors_across_shards) {
  const mixed_decay m;
  for (int n = 2; n <= 4; ++n) {
    const wo::layout l(m.params, bucket_elements, n);
    bool split = false, several = false;
    for (std::size_t b = 0; b < l.buckets().size(); ++b) {
      const auto& bi = l.buckets()[b];
      for (std::size_t t = bi.first_tensor; t < bi.end_tensor; ++t) {
        const auto& ti = l.tensors()[t];
        split =
            split || (!ti.decay && ti.count > 0 &&
                      ti.bucket_offset / bi.shard != (ti.bucket_offset + ti.count - 1) / bi.shard);
      }
      for (int s = 0; s < n; ++s)
        several = several || l.decay_runs(b, s).size() > 1;
    }
    EXPECT_TRUE(split) << n << " shards";
    EXPECT_TRUE(several) << n << " shards";
  }
}

// Each shard element's decay, found by looking up the tensor that holds it in the padded
// layout (padding: the run it joins, not checked), against the runs expanded.
void check_runs_elementwise(const wo::param_set& ps, std::size_t bucket_elements, int shards) {
  const wo::layout l(ps, bucket_elements, shards);
  const auto& ts = l.tensors();
  for (std::size_t b = 0; b < l.buckets().size(); ++b) {
    const auto& bi = l.buckets()[b];
    for (int s = 0; s < shards; ++s) {
      const auto runs = l.decay_runs(b, s);
      std::vector<int> expanded;
      for (std::size_t r = 0; r < runs.size(); ++r) {
        EXPECT_GT(runs[r].count, 0u);
        if (r > 0) {
          EXPECT_EQ(runs[r].begin, runs[r - 1].begin + runs[r - 1].count); // contiguous, in order
          EXPECT_NE(runs[r].decay, runs[r - 1].decay);                     // neighbours differ
        }
        expanded.insert(expanded.end(), runs[r].count, runs[r].decay ? 1 : 0);
      }
      ASSERT_EQ(expanded.size(), bi.shard) << "bucket " << b << " shard " << s;
      for (std::size_t i = 0; i < bi.shard; ++i) {
        const std::size_t at = static_cast<std::size_t>(s) * bi.shard + i; // in the bucket
        for (std::size_t t = bi.first_tensor; t < bi.end_tensor; ++t) {
          if (at >= ts[t].bucket_offset && at < ts[t].bucket_offset + ts[t].count) {
            EXPECT_EQ(expanded[i], ts[t].decay ? 1 : 0)
                << ts[t].name << " bucket " << b << " shard " << s << " at " << i;
          }
        }
      }
    }
  }
}

TEST(decay_runs, cover_each_shard_with_the_tensors_decay) {
  const mixed_decay m;
  for (int n = 1; n <= 8; ++n) {
    for (std::size_t be :
         {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{40}, std::size_t{1000}}) {
      check_runs_elementwise(m.params, be, n);
    }
  }
  // Pseudo-random sets, empty tensors among them.
  std::uint32_t seed = 99;
  const auto rnd = [&](std::uint32_t k) {
    seed = seed * 1664525u + 1013904223u;
    return (seed >> 8) % k;
  };
  for (int trial = 0; trial < 50; ++trial) {
    wo::param_set ps;
    const auto count = 1 + rnd(12);
    for (std::uint32_t t = 0; t < count; ++t)
      ps.add("t" + std::to_string(t), {rnd(9)}, false, rnd(2) == 0);
    check_runs_elementwise(ps, 1 + rnd(20), static_cast<int>(1 + rnd(6)));
  }
}

TEST(decay_runs, hand_worked_layouts) {
  wo::param_set ps;
  ps.add("w", {6});
  ps.add("b", {2}, false, false);
  ps.add("v", {3});
  // One bucket of 11 elements over 3 shards: padded to 12, shards of 4.
  const wo::layout l(ps, 100, 3);
  using run = wo::decay_run;
  EXPECT_EQ(l.decay_runs(0, 0), (std::vector<run>{{0, 4, true}}));
  EXPECT_EQ(l.decay_runs(0, 1), (std::vector<run>{{0, 2, true}, {2, 2, false}}));
  EXPECT_EQ(l.decay_runs(0, 2), (std::vector<run>{{0, 4, true}})); // v and the padding element
  // Every tensor decays: one run per shard, the plain loop.
  wo::param_set all;
  all.add("a", {5});
  all.add("c", {4});
  const wo::layout la(all, 100, 4);
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(la.decay_runs(0, s), (std::vector<run>{{0, 3, true}})) << s;
  // A shard of padding only: one decaying run (padding is zero either way).
  wo::param_set one;
  one.add("x", {1}, false, false);
  const wo::layout lo(one, 100, 3);
  EXPECT_EQ(lo.decay_runs(0, 0), (std::vector<run>{{0, 1, false}}));
  EXPECT_EQ(lo.decay_runs(0, 2), (std::vector<run>{{0, 1, true}}));
  EXPECT_THROW((void)lo.decay_runs(0, 3), error);
}

// The host loop over runs, with apply_parallel's thread seams inside runs: the same bits as the
// element loop choosing each element's functor.
TEST(decay_groups, parallel_loop_follows_the_runs_across_thread_seams) {
  const std::size_t n = 3 * 65536 + 1000;
  const std::vector<wo::decay_run> runs = {
      {0, 70000, true}, {70000, 5, false}, {70005, 60000, true}, {130005, n - 130005, false}};
  const wo::adamw r{.lr = 0.01f, .weight_decay = 0.1f};
  const auto k = r.at(2, 0.5f);
  const auto k0 = wo::without_weight_decay(k);
  EXPECT_EQ(k0.weight_decay, 0.0f);
  EXPECT_EQ(k.weight_decay, 0.1f);
  const std::size_t stride = wo::slot_stride(n);
  std::vector<float> w(n), g(n), s(2 * stride);
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = static_cast<float>(static_cast<int>(i % 17) - 8) * 0.0625f;
    g[i] = static_cast<float>(static_cast<int>(i % 13) - 6) * 0.25f;
    s[i] = 0.01f * static_cast<float>(i % 3);
    s[stride + i] = 0.02f * static_cast<float>(i % 5);
  }
  std::vector<float> w2 = w, s2 = s;
  const wo::update_ref<wo::decay_groups<wo::adamw::kernel>, float, float> u{
      {k, k0, runs.data(), runs.size()}, w.data(), g.data(), s.data(), w.data(), stride};
  wo::apply_parallel(u, n, 3);
  std::size_t r_at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    while (i >= runs[r_at].begin + runs[r_at].count)
      ++r_at;
    float wi = w2[i];
    (runs[r_at].decay ? k : k0)(wi, g[i], s2.data() + i, stride);
    w2[i] = wi;
  }
  EXPECT_EQ(w, w2);
  EXPECT_EQ(s, s2);
}

struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& tag)
      : path(fs::temp_directory_path() / ("weft_decay_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Saved after 2 steps on 2 ranks under zero<1>, resumed on 3 under zero<3> for the last step:
// the per-tensor reference still holds (the runs are the new layout's).
TEST(decay_groups_checkpoint, resharded_resume_keeps_the_exemptions) {
  const mixed_decay m;
  temp_dir d("reshard");
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<1>>(c, m.params, adamw_decoupled, options_for(2));
    opt->set_parameters(m.initial());
    train_steps(*opt, m, batch * c.rank() / 2, batch * (c.rank() + 1) / 2, steps - 1, 1.0f / batch);
    ck::save(*opt, c, d.path);
  });
  const auto idx = ck::detail::read_index(d.path);
  ASSERT_TRUE(idx.has_value());
  ASSERT_EQ(idx->tensors.size(), m.params.tensors().size());
  for (std::size_t t = 0; t < idx->tensors.size(); ++t) {
    EXPECT_EQ(idx->tensors[t].decay, std::optional<bool>(m.params.tensors()[t].decay))
        << idx->tensors[t].name;
  }
  std::vector<float> got;
  local::run(3, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<3>>(c, m.params, adamw_decoupled, options_for(3));
    opt->set_parameters(m.initial());
    ck::load(*opt, c, d.path);
    train_steps(*opt, m, batch * c.rank() / 3, batch * (c.rank() + 1) / 3, 1, 1.0f / batch);
    auto p = opt->gather_parameters();
    if (c.rank() == 0) got = p;
  });
  double worst = 0;
  EXPECT_EQ(mismatches(got, reference(m, adamw_decoupled), &worst), 0u);
}

// A model whose decay flags differ from the checkpoint's: refused, naming the tensor.
TEST(decay_groups_checkpoint, different_decay_flags_are_refused_by_name) {
  const mixed_decay m;
  temp_dir d("flags");
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<2>>(c, m.params, adamw_decoupled, options_for(2));
    opt->set_parameters(m.initial());
    ck::save(*opt, c, d.path);
  });
  wo::param_set flipped;
  for (const auto& ti : m.params.tensors())
    flipped.add(ti.name, ti.shape, ti.replicated, ti.name == "fc.b" ? true : ti.decay);
  local::run(2, [&](local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<2>>(c, flipped, adamw_decoupled, options_for(2));
    opt->set_parameters(m.initial());
    try {
      ck::load(*opt, c, d.path);
      ADD_FAILURE() << "a load into different decay flags succeeded";
    } catch (const error& e) {
      const std::string what = e.what();
      if (c.rank() == 0) std::printf("%s\n", what.c_str());
      EXPECT_NE(what.find("fc.b"), std::string::npos) << what;
    }
  });
}

TEST(decay_groups_checkpoint, index_decay_flags_parse) {
  const auto parse = [](const std::string& tensors) {
    const std::string text =
        R"({"format": "weft-checkpoint-index", "generation": 1, "world": 1, "step": 0, )"
        R"("rule": "sgd", )"
        R"("loss_scale": 1, "good_steps": 0, "slots": [], "files": ["a"], "tensors": [)" +
        tensors + "]}";
    return ck::parse_index(std::as_bytes(std::span(text.data(), text.size())));
  };
  const auto x = parse(R"({"name": "w", "elements": 4, "decay": true}, )"
                       R"({"name": "b", "elements": 2, "decay": false}, )"
                       R"({"name": "old", "elements": 1})");
  ASSERT_EQ(x.tensors.size(), 3u);
  EXPECT_EQ(x.tensors[0].decay, std::optional<bool>(true));
  EXPECT_EQ(x.tensors[1].decay, std::optional<bool>(false));
  EXPECT_EQ(x.tensors[2].decay,
            std::nullopt); // an index from before the flags: accepted, nothing to check
  EXPECT_THROW((void)parse(R"({"name": "w", "elements": 4, "decay": 1})"), error);
}

} // namespace
