// fixed_order_sum (include/weft/cuda/detail/fixed_order_sum.cuh): sums of n terms on one block,
// n around the block's thread count and far above it. Integer terms against a plain host sum
// (exact in any order); terms that round, summed twice: the same bits, and within 1e-12 of a sum
// in long double. Skipped, with the reason, without a GPU.
#include <weft/cuda/detail/fixed_order_sum.cuh>
#include <weft/cuda/memory.cuh>

#include <gtest/gtest.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "support/cuda.cuh"

namespace {

namespace wcd = weft::cuda::detail;

double device_sum(const weft::cuda::device_buffer<double>& terms, std::size_t n) {
  weft::cuda::device_buffer<double> out(1);
  wcd::fixed_order_sum(wcd::load_term{terms.data()}, n, out.data(), nullptr);
  double got = -1.0;
  WEFT_CUDA_TRY(cudaMemcpy(&got, out.data(), sizeof(double), cudaMemcpyDeviceToHost));
  return got;
}

TEST(fixed_order_sum, exact_for_integers_and_repeatable_for_the_rest) {
  WEFT_REQUIRE_DEVICE();
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{1024},
                              std::size_t{1025}, std::size_t{100'003}}) {
    std::vector<double> h(n);
    double exact = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      h[i] = static_cast<double>(static_cast<int>(i % 29) - 14);
      exact += h[i];
    }
    weft::cuda::device_buffer<double> d(n == 0 ? 1 : n);
    if (n != 0)
      WEFT_CUDA_TRY(cudaMemcpy(d.data(), h.data(), n * sizeof(double), cudaMemcpyHostToDevice));
    EXPECT_EQ(device_sum(d, n), exact) << n << " terms";

    long double reference = 0.0L;
    for (std::size_t i = 0; i < n; ++i) {
      h[i] = 1.0 / static_cast<double>(i % 101 + 3);
      reference += static_cast<long double>(h[i]);
    }
    if (n != 0)
      WEFT_CUDA_TRY(cudaMemcpy(d.data(), h.data(), n * sizeof(double), cudaMemcpyHostToDevice));
    const double first = device_sum(d, n);
    const double second = device_sum(d, n);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(first), std::bit_cast<std::uint64_t>(second));
    EXPECT_NEAR(first, static_cast<double>(reference), 1e-12 * static_cast<double>(reference))
        << n << " terms";
  }
}

} // namespace
