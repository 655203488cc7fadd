// The device kernels (include/weft/cuda/kernels.cuh) against the host: every type and
// operator, aligned and misaligned pointers, sizes around the pack width, in place. The
// host side is a plain loop that states the rule (left to right in the accumulation type,
// rounded once); results must match it to the bit.
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/cuda.cuh"
#include "support/reference.hpp"

namespace {

template <class T>
std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  if (n != 0) WEFT_CUDA_TRY(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <class T, class Op>
void check_reduce(int k, std::size_t n, std::size_t misalign, bool in_place,
                  std::size_t dst_apart = 0) {
  using A = weft::accumulate_t<T>;
  const Op op{};
  const std::size_t padded = n + 8;
  std::vector<std::vector<T>> host(static_cast<std::size_t>(k), std::vector<T>(padded));
  std::vector<weft::cuda::device_buffer<T>> dev;
  std::vector<const T*> src;
  for (int j = 0; j < k; ++j) {
    auto& h = host[static_cast<std::size_t>(j)];
    for (std::size_t i = 0; i < padded; ++i)
      h[i] = weft::test::input_value<T, Op>(j, i, weft::test::pattern::random, 3);
    dev.emplace_back(padded);
    WEFT_CUDA_TRY(
        cudaMemcpy(dev.back().data(), h.data(), padded * sizeof(T), cudaMemcpyHostToDevice));
    src.push_back(dev.back().data() + misalign);
  }
  // A pageable cudaMemcpy may return before its DMA lands, and the kernels below run on a
  // non-blocking stream that does not wait for the legacy one.
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  weft::cuda::device_buffer<T> out(padded);
  T* dst = in_place ? const_cast<T*>(src[0]) : out.data() + misalign + dst_apart;
  weft::cuda::stream s;
  weft::cuda::reduce(dst, src.data(), k, n, op, s.get());
  s.synchronize();
  const auto got = to_host(dst, n);
  for (std::size_t i = 0; i < n; ++i) {
    A acc = static_cast<A>(host[0][i + misalign]);
    for (int j = 1; j < k; ++j)
      acc = op(acc, static_cast<A>(host[static_cast<std::size_t>(j)][i + misalign]));
    ASSERT_TRUE(weft::test::same_bits(got[i], static_cast<T>(acc)))
        << "k " << k << " n " << n << " misalign " << misalign << " in_place " << in_place
        << " dst_apart " << dst_apart << " i " << i;
  }
}

template <class T>
class kernels : public ::testing::Test {};
using types =
    ::testing::Types<float, double, weft::half, weft::bfloat16, std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(kernels, types);

TYPED_TEST(kernels, reduce_matches_the_host_rule_bit_for_bit) {
  WEFT_REQUIRE_DEVICE();
  using T = TypeParam;
  for (int k : {1, 2, 3, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8},
                          std::size_t{9}, std::size_t{1000}, std::size_t{1} << 20}) {
      // Misalignments that all operands share (a head before the first common 16-byte
      // boundary, then packs), and a destination apart from its sources (element by element).
      for (std::size_t misalign : {0, 1, 3}) {
        check_reduce<T, weft::op::sum>(k, n, misalign, false);
        check_reduce<T, weft::op::prod>(k, n, misalign, false);
        check_reduce<T, weft::op::min>(k, n, misalign, false);
        check_reduce<T, weft::op::max>(k, n, misalign, true);
        check_reduce<T, weft::op::sum>(k, n, misalign, false, 1);
      }
    }
  }
}

TYPED_TEST(kernels, copy_and_divide) {
  WEFT_REQUIRE_DEVICE();
  using T = TypeParam;
  for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{4099}}) {
    for (std::size_t misalign : {0, 1, 3}) {
      std::vector<T> h(n + 8);
      for (std::size_t i = 0; i < h.size(); ++i)
        h[i] = static_cast<T>(static_cast<int>(i % 200) - 100);
      weft::cuda::device_buffer<T> a(h.size()), b(h.size());
      WEFT_CUDA_TRY(cudaMemcpy(a.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
      WEFT_CUDA_TRY(cudaDeviceSynchronize()); // as in check_reduce
      weft::cuda::stream s;
      weft::cuda::copy(b.data() + misalign, a.data() + misalign, n, s.get());
      weft::cuda::divide(b.data() + misalign, n, 3, s.get());
      s.synchronize();
      const auto got = to_host(b.data() + misalign, n);
      using A = weft::accumulate_t<T>;
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(
            weft::test::same_bits(got[i], static_cast<T>(static_cast<A>(h[i + misalign]) / A{3})))
            << i;
      }
    }
  }
}

TEST(kernels_errors, too_many_sources_is_an_error_before_any_launch) {
  // No device needed: the check comes first.
  const float* src[weft::detail::max_sources + 1] = {};
  EXPECT_THROW(weft::cuda::reduce<float>(nullptr, src, weft::detail::max_sources + 1, 1,
                                         weft::op::sum{}, nullptr),
               weft::error);
  EXPECT_THROW(weft::cuda::reduce<float>(nullptr, src, 0, 1, weft::op::sum{}, nullptr),
               weft::error);
}

} // namespace
