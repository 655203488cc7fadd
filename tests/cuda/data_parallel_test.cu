// weft::optim::data_parallel over device communicators (include/weft/cuda/data_parallel.cuh):
// the host tests' models (tests/optim/support.hpp) trained on N emulated ranks of one GPU,
// parameters and gradients in device memory, against the same serial full-batch reference the
// host tests use: bitwise for integer data with SGD (every ZeRO stage, hybrid, clipping, half
// with loss scaling, bfloat16), to 1e-5 for the float MLP with SGD, Adam and AdamW; and
// checkpoints saved on the device and resumed on it or on the host.
#include <weft/cuda/data_parallel.cuh>
#include <weft/cuda/emulated.cuh>
#include <weft/cuda/nccl.cuh>
#include <weft/cuda/p2p.cuh>
#include <weft/optim.hpp>

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "optim/support.hpp"
#include "support/cuda.cuh"

// Every member compiles over the transports users run it on (only emulated runs here).
template class weft::optim::data_parallel<weft::optim::zero<2>, weft::optim::adamw, float,
                                          weft::cuda::nccl::communicator>;
template class weft::optim::data_parallel<weft::optim::zero<3>, weft::optim::sgd, weft::half,
                                          weft::cuda::p2p::communicator>;
template class weft::optim::data_parallel<
    weft::optim::hybrid<weft::optim::zero<1>, weft::optim::zero<0>>, weft::optim::adam,
    weft::bfloat16, weft::cuda::nccl::communicator>;

namespace {

using namespace weft;
using namespace weft::test::optim;
namespace wo = weft::optim;
namespace emu = weft::cuda::emulated;

static_assert(wo::data_parallel<wo::zero<2>, wo::adamw, float, emu::communicator>::on_device);
static_assert(
    !wo::data_parallel<wo::zero<2>, wo::adamw, float, weft::local::communicator>::on_device);

constexpr int batch = 12; // divides by 1..4
constexpr int steps = 6;

wo::data_parallel_options small_buckets(int dp, float max_norm) {
  // 20 elements: buckets that do not divide by 3 or 4 (padding), as in the host tests.
  return {.bucket_elements = 20, .max_grad_norm = max_norm, .inner_size = dp % 2 == 0 ? 2 : 1};
}

/// Parameters read and gradients written through the communicator's stream (device memory).
struct device_access {
  cudaStream_t s;
  template <class T>
  void read(std::span<const T> p, float* out) const {
    std::vector<T> h(p.size());
    WEFT_CUDA_TRY(cudaMemcpyAsync(h.data(), p.data(), p.size_bytes(), cudaMemcpyDeviceToHost, s));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s));
    for (std::size_t i = 0; i < h.size(); ++i)
      out[i] = static_cast<float>(h[i]);
  }
  template <class T>
  void write(std::span<T> g, const float* in, float scale) const {
    std::vector<T> h(g.size());
    for (std::size_t i = 0; i < h.size(); ++i)
      h[i] = static_cast<T>(in[i] * scale);
    WEFT_CUDA_TRY(cudaMemcpyAsync(g.data(), h.data(), g.size_bytes(), cudaMemcpyHostToDevice, s));
    WEFT_CUDA_TRY(cudaStreamSynchronize(s)); // h is pageable and goes now
  }
};

/// train_parallel of tests/optim/support.hpp on `dp` emulated ranks of one GPU.
template <class Policy, class P = float, class Rule>
std::vector<float> train_on_device(const model& m, int dp, Rule rule, float multiplier,
                                   wo::data_parallel_options o) {
  std::vector<std::vector<float>> result(static_cast<std::size_t>(dp));
  emu::run(dp, [&](emu::communicator& c) {
    auto opt = wo::make_data_parallel<Policy, P>(c, m.params, rule, o);
    opt->set_parameters(m.initial());
    train_steps(*opt, m, batch * c.rank() / dp, batch * (c.rank() + 1) / dp, steps, multiplier,
                device_access{c.stream()});
    result[static_cast<std::size_t>(c.rank())] = opt->gather_parameters();
  });
  return agreed(result);
}

template <class Policy>
class device_sharded_training : public ::testing::Test {};
using policies =
    ::testing::Types<wo::zero<0>, wo::zero<1>, wo::zero<2>, wo::zero<3>,
                     wo::hybrid<wo::zero<1>, wo::zero<0>>, wo::hybrid<wo::zero<3>, wo::zero<0>>>;
TYPED_TEST_SUITE(device_sharded_training, policies);

TYPED_TEST(device_sharded_training, integer_data_sgd_is_bitwise) {
  WEFT_REQUIRE_DEVICE();
  const l1_linear m(batch);
  for (int dp = 1; dp <= 4; ++dp) {
    for (float clip : {0.0f, 0.5f}) {
      const auto expected = train_serial(m, batch, rule_kind::sgd, steps, 1.0f / batch, clip);
      const auto got =
          train_on_device<TypeParam>(m, dp, sgd_rule(), 1.0f / batch, small_buckets(dp, clip));
      EXPECT_EQ(got, expected) << "dp " << dp << " clip " << clip;
    }
  }
}

TYPED_TEST(device_sharded_training, float_mlp_matches_full_batch_training) {
  WEFT_REQUIRE_DEVICE();
  const mlp m(batch);
  double worst = 0;
  for (int dp : {2, 3}) {
    const auto check = [&](rule_kind k, auto rule) {
      const auto expected = train_serial(m, batch, k, steps, 1.0f, 0.05f);
      const auto got = train_on_device<TypeParam>(m, dp, rule, 1.0f, small_buckets(dp, 0.05f));
      const double err = relative_error(got, expected);
      EXPECT_LT(err, 1e-5) << name_of(k) << " dp " << dp;
      EXPECT_GT(relative_error(m.initial(), expected), 1e-2); // the run moved the weights
      worst = std::max(worst, err);
    };
    check(rule_kind::sgd, sgd_rule());
    check(rule_kind::adam, adam_rule());
    check(rule_kind::adamw, adamw_rule());
  }
  std::printf("worst relative error against full-batch training: %.3g\n", worst);
}

// Half parameters with loss scaling (256: the scaled integer gradients stay exact) and
// bfloat16, fp32 master weights on the device; the reference rounds its weights at the end.
template <class P>
void check_mixed(bool scaling) {
  const l1_linear m(batch);
  const auto expected =
      rounded_to<P>(train_serial(m, batch, rule_kind::sgd, steps, 1.0f / batch, 0.0f));
  for (int dp : {1, 3, 4}) {
    auto o = small_buckets(dp, 0.0f);
    o.loss_scaling = scaling;
    o.scaling.initial = 256.0f;
    EXPECT_EQ((train_on_device<wo::zero<1>, P>(m, dp, sgd_rule(), 1.0f / batch, o)), expected)
        << dp;
    EXPECT_EQ((train_on_device<wo::zero<3>, P>(m, dp, sgd_rule(), 1.0f / batch, o)), expected)
        << dp;
  }
}

TEST(device_mixed_precision, half_with_loss_scaling_keeps_fp32_master_weights) {
  WEFT_REQUIRE_DEVICE();
  check_mixed<weft::half>(true);
}
TEST(device_mixed_precision, bfloat16_keeps_fp32_master_weights) {
  WEFT_REQUIRE_DEVICE();
  check_mixed<weft::bfloat16>(false);
}

TEST(device_data_parallel,
     without_overlap_the_collectives_run_on_the_main_stream_with_the_same_result) {
  WEFT_REQUIRE_DEVICE();
  const l1_linear m(batch);
  const auto expected = train_serial(m, batch, rule_kind::sgd, steps, 1.0f / batch, 0.5f);
  auto o = small_buckets(4, 0.5f);
  o.overlap = false;
  EXPECT_EQ((train_on_device<wo::zero<2>>(m, 4, sgd_rule(), 1.0f / batch, o)), expected);
}

// reduce_bucket on the device: each micro-batch's bucket reduce-scattered and added into the
// shard by a kernel in the collectives' stream. The sums by hand, as in the host test
// (tests/optim/data_parallel_test.cpp): a accumulates 1 + 2 + 3 times the rank's 1 or 2 over the
// step and is reduced once (18), b is written afresh and reduced every micro-batch (1,800).
TEST(device_data_parallel, reduce_bucket_adds_every_micro_batch_into_the_shard) {
  WEFT_REQUIRE_DEVICE();
  wo::param_set ps;
  ps.add("a", {6});
  ps.add("b", {6});
  for (const bool overlap : {false, true}) {
    emu::run(2, [&](emu::communicator& c) {
      auto opt = wo::make_data_parallel<wo::zero<2>>(c, ps, wo::sgd{.lr = 1.0f},
                                                     {.bucket_elements = 6, .overlap = overlap});
      opt->set_parameters(std::vector<float>(12, 0.0f));
      const device_access io{c.stream()};
      const auto r = static_cast<float>(c.rank() + 1);
      std::vector<float> a(6, 0.0f);
      for (int k = 0; k < 3; ++k) {
        for (auto& x : a)
          x += static_cast<float>(k + 1) * r;
        io.write(opt->grad("a"), a.data(), 1.0f);
        const std::vector<float> b(6, 100.0f * static_cast<float>(k + 1) * r);
        io.write(opt->grad("b"), b.data(), 1.0f);
        opt->reduce_bucket(1);
      }
      opt->grad_ready("a");
      (void)opt->step();
      const auto p = opt->gather_parameters();
      for (std::size_t i = 0; i < 6; ++i) {
        EXPECT_EQ(p[i], -18.0f) << "a[" << i << "] overlap " << overlap;
        EXPECT_EQ(p[6 + i], -1800.0f) << "b[" << i << "] overlap " << overlap;
      }
    });
  }
}

TEST(device_data_parallel, memory_report_counts_what_the_host_path_allocates) {
  WEFT_REQUIRE_DEVICE();
  const mlp m(batch);
  const auto o = small_buckets(4, 0.0f);
  std::vector<wo::memory_report> host(4), device(4);
  weft::local::run(4, [&](weft::local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<2>, weft::half>(c, m.params, adamw_rule(), o);
    host[static_cast<std::size_t>(c.rank())] = opt->memory();
  });
  emu::run(4, [&](emu::communicator& c) {
    auto opt = wo::make_data_parallel<wo::zero<2>, weft::half>(c, m.params, adamw_rule(), o);
    device[static_cast<std::size_t>(c.rank())] = opt->memory();
  });
  for (std::size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(device[r].parameters, host[r].parameters) << r;
    EXPECT_EQ(device[r].gradients, host[r].gradients) << r;
    EXPECT_EQ(device[r].optimizer_state, host[r].optimizer_state) << r;
    EXPECT_EQ(device[r].master_weights, host[r].master_weights) << r;
    EXPECT_GT(device[r].total(), 0u);
  }
}

// Checkpoints of a device optimizer go through a host copy of its shard; the files are the
// host's, so a run saved on the device resumes on the device at another DP size and stage, or
// on the host, and continues bitwise (SGD on integer data: exact sums; the update rounds each
// product on its own on both, core/rounding.hpp).
TEST(device_data_parallel, checkpoints_reshard_and_resume_on_the_device_or_the_host_bitwise) {
  WEFT_REQUIRE_DEVICE();
  namespace ck = weft::optim::checkpoint;
  const l1_linear m(batch);
  const wo::data_parallel_options o{.bucket_elements = 5};
  const auto uninterrupted =
      train_parallel<wo::zero<2>>(m, batch, 4, sgd_rule(), 2 * steps, 1.0f / batch, o);
  const auto dir =
      std::filesystem::temp_directory_path() / ("weft_device_ckpt_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const auto on_device = [&]<class Policy>(Policy, int dp, bool load, bool save) {
    std::vector<std::vector<float>> result(static_cast<std::size_t>(dp));
    emu::run(dp, [&](emu::communicator& c) {
      auto opt = wo::make_data_parallel<Policy>(c, m.params, sgd_rule(), o);
      opt->set_parameters(m.initial());
      if (load) ck::load(*opt, c, dir);
      train_steps(*opt, m, batch * c.rank() / dp, batch * (c.rank() + 1) / dp, steps, 1.0f / batch,
                  device_access{c.stream()});
      if (save) ck::save(*opt, c, dir);
      result[static_cast<std::size_t>(c.rank())] = opt->gather_parameters();
    });
    return agreed(result);
  };
  (void)on_device(wo::zero<2>{}, 4, false, true);
  EXPECT_EQ(on_device(wo::zero<1>{}, 2, true, false), uninterrupted);
  EXPECT_EQ(on_device(wo::zero<3>{}, 3, true, false), uninterrupted);
  std::vector<float> on_host;
  weft::local::run(4, [&](weft::local::communicator& c) {
    auto opt = wo::make_data_parallel<wo::hybrid<wo::zero<2>, wo::zero<0>>>(
        c, m.params, sgd_rule(), {.bucket_elements = 5, .inner_size = 2});
    opt->set_parameters(m.initial());
    ck::load(*opt, c, dir);
    train_steps(*opt, m, batch * c.rank() / 4, batch * (c.rank() + 1) / 4, steps, 1.0f / batch);
    const auto p = opt->gather_parameters();
    if (c.rank() == 0) on_host = p;
  });
  EXPECT_EQ(on_host, uninterrupted);
  EXPECT_NE(on_device(wo::zero<1>{}, 2, false, false),
            uninterrupted); // without the checkpoint it differs
  std::filesystem::remove_all(dir);
}

// The global norm's partial sum on the device: ranges cut once into pieces of 64K elements, one
// block each, the pieces' sums added by one block; against a plain sum over the same elements
// (integer values: exact in any order). The prepared pieces read the gradients anew at every sum,
// as steps do.
TEST(device_data_parallel, squared_norm_of_large_and_empty_ranges) {
  WEFT_REQUIRE_DEVICE();
  emu::run(1, [&](emu::communicator& c) {
    wo::detail::dp_memory<emu::communicator> mem(c);
    const std::size_t n = 300001;
    std::vector<weft::half> h(n);
    for (std::size_t i = 0; i < n; ++i)
      h[i] = weft::half(static_cast<float>(static_cast<int>(i % 13) - 6));
    weft::cuda::device_buffer<weft::half> d(n);
    const auto expected = [&] {
      double sq = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        if (i >= 7 && i < 100) continue;
        const double v = static_cast<double>(static_cast<float>(h[i]));
        sq += v * v;
      }
      return sq;
    };
    mem.upload(d.data(), h.data(),
               n); // on the communicator's stream (non-blocking: cudaMemcpy would not order it)
    const auto squares = mem.prepare_squares(std::vector<wo::detail::norm_range<weft::half>>{
        {d.data(), 7}, {d.data() + 7, 0}, {d.data() + 100, n - 100}});
    weft::cuda::device_buffer<double> out(1);
    double got = -1.0;
    mem.sum_squares(squares, out.data());
    mem.download(&got, out.data(), 1);
    EXPECT_EQ(got, expected());
    EXPECT_GT(got, 0.0);
    for (auto& x : h)
      x = weft::half(static_cast<float>(x) * 2.0f);
    mem.upload(d.data(), h.data(), n);
    mem.sum_squares(squares, out.data());
    mem.download(&got, out.data(), 1);
    EXPECT_EQ(got, expected()); // of the doubled values
    const auto none = mem.prepare_squares(std::vector<wo::detail::norm_range<weft::half>>{});
    mem.sum_squares(none, out.data());
    mem.download(&got, out.data(), 1);
    EXPECT_EQ(got, 0.0);
  });
}

// More pieces than the block that adds them has threads (3000 ranges of 5 elements: 3000
// partials), so every thread adds several: integer values against a plain sum (exact), then
// values that round, summed twice on the same prepared pieces: the same bits both times, and
// within 1e-12 of a sum in long double.
TEST(device_data_parallel, squared_norm_of_many_pieces_is_exact_and_repeatable) {
  WEFT_REQUIRE_DEVICE();
  emu::run(1, [&](emu::communicator& c) {
    wo::detail::dp_memory<emu::communicator> mem(c);
    constexpr std::size_t ranges = 3000;
    constexpr std::size_t each = 5;
    std::vector<float> h(ranges * each);
    for (std::size_t i = 0; i < h.size(); ++i)
      h[i] = static_cast<float>(static_cast<int>(i % 17) - 8);
    weft::cuda::device_buffer<float> d(h.size());
    mem.upload(d.data(), h.data(), h.size());
    std::vector<wo::detail::norm_range<float>> rs;
    for (std::size_t r = 0; r < ranges; ++r)
      rs.push_back({d.data() + r * each, each});
    const auto squares = mem.prepare_squares(rs);
    weft::cuda::device_buffer<double> out(1);
    const auto sum = [&] {
      double got = -1.0;
      mem.sum_squares(squares, out.data());
      mem.download(&got, out.data(), 1);
      return got;
    };
    double exact = 0.0;
    for (const float x : h)
      exact += static_cast<double>(x) * static_cast<double>(x);
    EXPECT_EQ(sum(), exact);

    for (std::size_t i = 0; i < h.size(); ++i)
      h[i] = 1.0f / static_cast<float>(i % 97 + 3);
    mem.upload(d.data(), h.data(), h.size());
    long double reference = 0.0L;
    for (const float x : h)
      reference += static_cast<long double>(x) * static_cast<long double>(x);
    const double first = sum();
    const double second = sum();
    EXPECT_EQ(std::bit_cast<std::uint64_t>(first), std::bit_cast<std::uint64_t>(second));
    EXPECT_NEAR(first, static_cast<double>(reference), 1e-12 * static_cast<double>(reference));
  });
}

} // namespace
