// The optimizer functors (include/weft/optim/optimizers.hpp) on the device: the same
// update_ref the host loop runs, launched over flat device buffers (thrust::device_vector),
// against the host loop (bitwise: the functors round every product and sum on their own,
// core/rounding.hpp, where nvcc would fuse them into FMAs; division and sqrtf are IEEE-rounded on
// both); and the AdamW step's bandwidth over 64M parameters against a device-to-device copy's
// (the GPU path's target: at least 70% of HBM bandwidth; printed, and checked
// at 50% so that a shared device does not fail the suite).
#include <weft/cuda/kernels.cuh>
#include <weft/optim/optimizers.hpp>

#include <gtest/gtest.h>
#include <thrust/copy.h>
#include <thrust/device_vector.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "support/cuda.cuh"

namespace {

namespace wo = weft::optim;

template <class T>
std::vector<T> to_host(const thrust::device_vector<T>& d) {
  std::vector<T> h(d.size());
  thrust::copy(d.begin(), d.end(), h.begin());
  return h;
}
template <class T>
T* raw(thrust::device_vector<T>& d) {
  return thrust::raw_pointer_cast(d.data());
}

template <class P, class Rule>
void check(Rule rule) {
  const std::size_t n = 100003;
  std::vector<float> master(n), state(2 * n);
  std::vector<P> grad(n), param(n, P(0.0f));
  std::uint32_t s = 7;
  const auto rnd = [&](float lo, float hi) {
    s = s * 1664525u + 1013904223u;
    return lo + (hi - lo) * static_cast<float>(s >> 8) / 16777216.0f;
  };
  for (auto& x : master)
    x = rnd(-1, 1);
  for (auto& x : grad)
    x = P(rnd(-1, 1));
  for (auto& x : state)
    x = rnd(0, 0.01f);
  thrust::device_vector<float> dm(master.begin(), master.end());
  thrust::device_vector<float> ds(state.begin(), state.end());
  thrust::device_vector<P> dg(grad.begin(), grad.end());
  thrust::device_vector<P> dp(param.begin(), param.end());
  for (long t = 1; t <= 3; ++t) {
    const auto k = rule.at(t, 0.5f);
    wo::apply(wo::update_ref<decltype(k), P, P>{k, master.data(), grad.data(), state.data(),
                                                param.data(), n},
              0, n);
    weft::cuda::detail::launch(
        wo::update_ref<decltype(k), P, P>{k, raw(dm), raw(dg), raw(ds), raw(dp), n}, n, nullptr);
  }
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  const auto m2 = to_host(dm);
  const auto s2 = to_host(ds);
  double worst = 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(
        worst, std::fabs(static_cast<double>(m2[i]) - master[i]) / (std::fabs(master[i]) + 1e-3));
    differ += m2[i] != master[i];
  }
  for (std::size_t i = 0; i < 2 * n; ++i) {
    worst = std::max(
        worst, std::fabs(static_cast<double>(s2[i]) - state[i]) / (std::fabs(state[i]) + 1e-6));
    differ += s2[i] != state[i];
  }
  EXPECT_EQ(differ, 0u) << Rule::name << ": largest relative difference " << worst;
  if constexpr (!std::is_same_v<P, float>) {
    const auto p2 = to_host(dp);
    std::size_t off = 0;
    for (std::size_t i = 0; i < n; ++i)
      off += !(p2[i] == P(m2[i]));
    EXPECT_EQ(off, 0u); // the low-precision copy is the device's own master, rounded
  }
}

TEST(cuda_optim, functors_match_the_host_loop) {
  WEFT_REQUIRE_DEVICE();
  check<float>(wo::sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true});
  check<float>(wo::adam{.weight_decay = 0.01f});
  check<float>(wo::adamw{});
  check<weft::half>(wo::adamw{});
  check<weft::bfloat16>(wo::adamw{});
}

TEST(cuda_optim, adamw_step_bandwidth_64m) {
  WEFT_REQUIRE_DEVICE();
  const std::size_t n = std::size_t{64} << 20;
  thrust::device_vector<float> w(n), g(n), st(2 * n), a(4 * n), b(4 * n); // zeros
  cudaEvent_t e0, e1;
  WEFT_CUDA_TRY(cudaEventCreate(&e0));
  WEFT_CUDA_TRY(cudaEventCreate(&e1));
  const auto time = [&](auto&& f) {
    float best = 1e30f;
    for (int r = 0; r < 10; ++r) {
      WEFT_CUDA_TRY(cudaEventRecord(e0));
      f();
      WEFT_CUDA_TRY(cudaEventRecord(e1));
      WEFT_CUDA_TRY(cudaEventSynchronize(e1));
      float ms = 0;
      WEFT_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms);
    }
    return best / 1e3f;
  };
  long t = 0;
  const wo::adamw rule{};
  const double step_s = time([&] {
    const auto k = rule.at(++t, 1.0f);
    weft::cuda::detail::launch(
        wo::update_ref<decltype(k), float, float>{k, raw(w), raw(g), raw(st), nullptr, n}, n,
        nullptr);
  });
  const double copy_s =
      time([&] { WEFT_CUDA_TRY(cudaMemcpy(raw(b), raw(a), 4 * n * 4, cudaMemcpyDeviceToDevice)); });
  const double step_gbps = 28.0 * static_cast<double>(n) / step_s / 1e9;
  const double copy_gbps = 2.0 * 16.0 * static_cast<double>(n) / copy_s / 1e9; // read + write
  std::printf(
      "AdamW step, 64M float params: %.3f ms, %.0f GB/s; device-to-device copy %.0f GB/s; ratio "
      "%.2f\n",
      step_s * 1e3, step_gbps, copy_gbps, step_gbps / copy_gbps);
  EXPECT_GT(step_gbps / copy_gbps, 0.5);
  WEFT_CUDA_TRY(cudaEventDestroy(e0));
  WEFT_CUDA_TRY(cudaEventDestroy(e1));
}

} // namespace
