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

  // Head, packs and tail in one index space, as the device launcher runs them.
  weft::detail::reduce_sources<T, Op> g{packs.data(), {}, k, op};
  std::copy(ptrs, ptrs + k, g.src);
  const auto cut = weft::detail::split_for_packs(g.dst, g.src, k, n);
  EXPECT_EQ(cut.head, 0u); // every operand 16-byte aligned
  const weft::detail::split_by_packs<weft::detail::reduce_sources<T, Op>> split{g, cut};
  for (std::size_t i = 0; i < cut.indices(); ++i)
    split(i);

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
  const T* const from[1] = {a.data()};
  const auto cut = weft::detail::split_for_packs(b.data(), from, 1, n);
  const weft::detail::split_by_packs<weft::detail::copy_elements<T>> copy{{b.data(), a.data()},
                                                                          cut};
  for (std::size_t i = 0; i < cut.indices(); ++i)
    copy(i);
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

// --- ranges cut for 16-byte packs ----------------------------------------------------------

// The reference: walk the range element by element, taking a whole pack wherever every operand
// is on a 16-byte boundary and a pack fits, else one element. Elements before the first pack
// are the head, after the last the tail; none may fall between packs.
weft::detail::pack_split greedy_split(const std::vector<std::uintptr_t>& at, std::size_t size,
                                      std::size_t n) {
  const std::size_t w = 16 / size;
  weft::detail::pack_split r;
  bool seen_pack = false;
  for (std::size_t e = 0; e < n;) {
    bool on_boundary = true;
    for (auto a : at)
      on_boundary = on_boundary && (a + e * size) % 16 == 0;
    if (on_boundary && e + w <= n) {
      EXPECT_EQ(r.tail, 0u) << "an element between packs";
      seen_pack = true;
      ++r.packs;
      e += w;
    } else {
      ++(seen_pack ? r.tail : r.head);
      ++e;
    }
  }
  // A range with no pack: all one by one (the split counts them as tail).
  if (!seen_pack) r = {0, 0, n};
  return r;
}

TEST(elementwise, ranges_split_into_head_packs_and_tail_as_the_element_walk_does) {
  const std::uintptr_t base = 0x7f0000001000; // 16-byte aligned, as an allocation is
  for (std::size_t size : {2, 4, 8}) {
    for (int operands : {1, 2, 3}) {
      // Every element-aligned offset of each operand within a 16-byte line, shifted alike for
      // all (misalignments that agree) or apart (that differ).
      for (std::size_t off = 0; off < 16; off += size) {
        for (std::size_t apart = 0; apart < 16; apart += size) {
          std::vector<std::uintptr_t> at;
          for (int j = 0; j < operands; ++j)
            at.push_back(base + 4096 * static_cast<std::uintptr_t>(j) + off + (j == 1 ? apart : 0));
          for (std::size_t n = 0; n <= 40; ++n) {
            const auto got = weft::detail::split_for_packs(at.data(), operands, size, n);
            const auto want = greedy_split(at, size, n);
            ASSERT_EQ(got, want) << "size " << size << " operands " << operands << " off " << off
                                 << " apart " << apart << " n " << n << ": got " << got.head << "/"
                                 << got.packs << "/" << got.tail << ", want " << want.head << "/"
                                 << want.packs << "/" << want.tail;
          }
        }
      }
    }
  }
  // A pointer that is not even element-aligned shares no boundary with anything.
  const std::uintptr_t odd[2] = {base + 1, base + 1};
  EXPECT_EQ(weft::detail::split_for_packs(odd, 2, 4, 100), (weft::detail::pack_split{0, 0, 100}));
}

// split_by_packs visits every element exactly once, each pack at an address where every
// operand is 16-byte aligned.
struct visit_log {
  static constexpr int width = 4; // as float
  std::vector<int>* hits;
  std::vector<std::uintptr_t> at; // the operands' addresses at element 0
  void operator()(std::size_t i) const { ++(*hits)[i]; }
  void pack(std::size_t e) const {
    for (auto a : at)
      EXPECT_EQ((a + e * 4) % 16, 0u) << "pack at element " << e;
    for (std::size_t l = 0; l < width; ++l)
      ++(*hits)[e + l];
  }
};

TEST(elementwise, split_by_packs_visits_every_element_once) {
  for (std::uintptr_t off : {0, 4, 8, 12}) {
    for (std::size_t n = 0; n <= 33; ++n) {
      std::vector<int> hits(n, 0);
      const std::vector<std::uintptr_t> at = {0x1000 + off, 0x2000 + off};
      const auto cut = weft::detail::split_for_packs(at.data(), 2, 4, n);
      const weft::detail::split_by_packs<visit_log> f{{&hits, at}, cut};
      for (std::size_t i = 0; i < cut.indices(); ++i)
        f(i);
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i], 1) << "off " << off << " n " << n << " element " << i;
      }
      if (n >= 8) {
        EXPECT_GT(cut.packs, 0u) << "off " << off << " n " << n;
      }
    }
  }
}

// A misalignment the operands share still reduces in packs, to the rule's bits.
TEST(elementwise, misaligned_ranges_reduce_in_packs_to_the_rule) {
  using T = weft::half;
  constexpr std::size_t n = 101;
  for (std::size_t shift = 0; shift < 8; ++shift) {
    aligned_array<T> a(n + 8), b(n + 8), out(n + 8);
    for (std::size_t i = 0; i < n + 8; ++i) {
      a.data()[i] = weft::test::input_value<T, weft::op::sum>(0, i, weft::test::pattern::random, 3);
      b.data()[i] = weft::test::input_value<T, weft::op::sum>(1, i, weft::test::pattern::random, 3);
    }
    weft::detail::reduce_sources<T, weft::op::sum> f{out.data() + shift, {}, 2, {}};
    f.src[0] = a.data() + shift;
    f.src[1] = b.data() + shift;
    const auto cut = weft::detail::split_for_packs(f.dst, f.src, 2, n);
    EXPECT_EQ(cut.head, (8 - shift) % 8);
    EXPECT_EQ(cut.packs, (n - cut.head) / 8);
    const weft::detail::split_by_packs<weft::detail::reduce_sources<T, weft::op::sum>> g{f, cut};
    for (std::size_t i = 0; i < cut.indices(); ++i)
      g(i);
    for (std::size_t i = 0; i < n; ++i) {
      const float want =
          static_cast<float>(a.data()[i + shift]) + static_cast<float>(b.data()[i + shift]);
      ASSERT_TRUE(weft::test::same_bits(out.data()[i + shift], T(want))) << shift << " " << i;
    }
  }
}

} // namespace
