// The element-wise functors that device kernels run (comm/detail/elementwise.hpp), checked on
// the host: the packed (16-byte) and per-element forms must agree with each other, with a
// plain loop that states the rule (left to right in the accumulation type, rounded once), with
// the host transports' own kernel (reduce_many), and, on exact inputs, with arithmetic in double.
#include <weft/comm/detail/elementwise.hpp>
#include <weft/comm/detail/kernels.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "support/reference.hpp"

namespace {

using weft::detail::packed;

// n elements of T at a 16-byte aligned address, from a pattern.
template <class T>
struct aligned_array {
  explicit aligned_array(std::size_t n) : storage(n / packed<T>::width + 1), size(n) {}
  T* data() { return reinterpret_cast<T*>(storage.data()); }
  std::vector<packed<T>> storage;
  std::size_t size;
};

template <class T, class Op>
void check_reduce(int k, std::size_t n, weft::test::pattern pat) {
  using A = weft::accumulate_t<T>;
  const Op op{};
  std::vector<aligned_array<T>> src;
  for (int j = 0; j < k; ++j) {
    src.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i)
      src.back().data()[i] = weft::test::input_value<T, Op>(j, i, pat, 7);
  }
  const T* ptrs[weft::detail::max_sources] = {};
  for (int j = 0; j < k; ++j)
    ptrs[j] = src[static_cast<std::size_t>(j)].data();

  // The rule, as a plain loop.
  std::vector<T> rule(n);
  for (std::size_t i = 0; i < n; ++i) {
    A acc = static_cast<A>(ptrs[0][i]);
    for (int j = 1; j < k; ++j)
      acc = op(acc, static_cast<A>(ptrs[j][i]));
    rule[i] = static_cast<T>(acc);
  }

  aligned_array<T> scalar(n), packs(n);
  std::vector<T> host(n);
  weft::detail::reduce_sources<T, Op> f{scalar.data(), {}, k, op};
  std::copy(ptrs, ptrs + k, f.src);
  for (std::size_t i = 0; i < n; ++i)
    f(i);

  // Packs, then the tail per element, as the device launcher does.
  constexpr int w = packed<T>::width;
  weft::detail::reduce_sources_packed<T, Op> g{packs.data(), {}, k, op};
  std::copy(ptrs, ptrs + k, g.src);
  ASSERT_TRUE(weft::detail::is_pack_aligned(g.dst));
  for (std::size_t i = 0; i < n / w; ++i)
    g(i);
  weft::detail::reduce_sources<T, Op> tail{packs.data() + n / w * w, {}, k, op};
  for (int j = 0; j < k; ++j)
    tail.src[j] = ptrs[j] + n / w * w;
  for (std::size_t i = 0; i < n % w; ++i)
    tail(i);

  weft::detail::reduce_many(host.data(), ptrs, static_cast<std::size_t>(k), n, op);

  for (std::size_t i = 0; i < n; ++i) {
    SCOPED_TRACE("k " + std::to_string(k) + " n " + std::to_string(n) + " i " + std::to_string(i));
    ASSERT_TRUE(weft::test::same_bits(scalar.data()[i], rule[i]));
    ASSERT_TRUE(weft::test::same_bits(packs.data()[i], rule[i]));
    ASSERT_TRUE(weft::test::same_bits(host[i], rule[i]));
    if (pat == weft::test::pattern::exact) {
      double want = static_cast<double>(weft::test::input_value<T, Op>(0, i, pat, 7));
      for (int j = 1; j < k; ++j) {
        want = weft::test::ref_combine<Op>(
            want, static_cast<double>(weft::test::input_value<T, Op>(j, i, pat, 7)));
      }
      ASSERT_EQ(static_cast<double>(rule[i]), want);
    }
  }
}

template <class T>
class elementwise : public ::testing::Test {};
using types =
    ::testing::Types<float, double, weft::half, weft::bfloat16, std::int32_t, std::int64_t>;
TYPED_TEST_SUITE(elementwise, types);

TYPED_TEST(elementwise, reduce_agrees_with_the_rule_for_every_op) {
  using T = TypeParam;
  for (auto pat : {weft::test::pattern::exact, weft::test::pattern::random}) {
    for (int k : {1, 2, 3, 5, 8}) {
      for (std::size_t n : {0, 1, 7, 8, 9, 33, 1000}) {
        check_reduce<T, weft::op::sum>(k, n, pat);
        check_reduce<T, weft::op::prod>(k, n, pat);
        check_reduce<T, weft::op::min>(k, n, pat);
        check_reduce<T, weft::op::max>(k, n, pat);
      }
    }
  }
}

TYPED_TEST(elementwise, copy_and_divide) {
  using T = TypeParam;
  constexpr std::size_t n = 37;
  aligned_array<T> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i)
    a.data()[i] = static_cast<T>(static_cast<int>(i) * 3 - 40);
  const weft::detail::copy_packed<T> packs{b.data(), a.data()};
  constexpr int w = packed<T>::width;
  for (std::size_t i = 0; i < n / w; ++i)
    packs(i);
  const weft::detail::copy_elements<T> rest{b.data() + n / w * w, a.data() + n / w * w};
  for (std::size_t i = 0; i < n % w; ++i)
    rest(i);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_TRUE(weft::test::same_bits(b.data()[i], a.data()[i])) << i;

  const weft::detail::divide_elements<T> div{b.data(), 4};
  for (std::size_t i = 0; i < n; ++i)
    div(i);
  std::vector<T> host(a.data(), a.data() + n);
  weft::detail::divide(host.data(), n, 4);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(weft::test::same_bits(b.data()[i], host[i])) << i;
    // (3i - 40) / 4 in the accumulation type: integer division for integers.
    using A = weft::accumulate_t<T>;
    ASSERT_EQ(
        static_cast<double>(b.data()[i]),
        static_cast<double>(static_cast<T>(static_cast<A>(static_cast<int>(i) * 3 - 40) / A{4})));
  }
}

TEST(elementwise, a_pack_is_sixteen_bytes) {
  static_assert(sizeof(packed<float>) == 16 && packed<float>::width == 4);
  static_assert(sizeof(packed<weft::half>) == 16 && packed<weft::half>::width == 8);
  static_assert(sizeof(packed<double>) == 16 && packed<std::int64_t>::width == 2);
  alignas(16) float x[8] = {};
  EXPECT_TRUE(weft::detail::is_pack_aligned(x));
  EXPECT_FALSE(weft::detail::is_pack_aligned(x + 1));
}

} // namespace
