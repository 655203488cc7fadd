#include "support/collective_suite.hpp"

namespace {

using namespace weft;

template <class Algo>
class all_reduce_algorithms : public ::testing::Test {};
using algorithms = ::testing::Types<algo::ring, algo::tree, algo::halving_doubling,
                                    algo::recursive_doubling, algo::direct, algo::hierarchical<>,
                                    algo::hierarchical<algo::direct, algo::tree>, algo::automatic>;
TYPED_TEST_SUITE(all_reduce_algorithms, algorithms);

TYPED_TEST(all_reduce_algorithms, matches_the_serial_reference) {
  test::sweep<TypeParam, collective::all_reduce>();
}

TYPED_TEST(all_reduce_algorithms, several_mib) {
  test::large<TypeParam, collective::all_reduce>(3u << 20);
}

// Ranks grouped into emulated nodes, uneven ones included: the topology-aware algorithms
// take a different path for every shape.
TYPED_TEST(all_reduce_algorithms, on_emulated_nodes) {
  for (const char* spec : {"2x4", "3+5", "1+2+3", "4x1", "2+2+2+3"}) {
    const auto cluster = topology::parse(spec);
    test::shared_outputs<float> shared(cluster.size());
    local::run(
        cluster,
        [&](local::communicator& c) {
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5},
                                    std::size_t{1001}, test::scaled(70000)}) {
            test::call_and_check<TypeParam, collective::all_reduce, std::int64_t, op::sum>(
                c, count, 0, test::pattern::exact, true);
            test::call_and_check<TypeParam, collective::all_reduce, float, op::max>(
                c, count, 0, test::pattern::random, false);
          }
          auto mine = test::call_and_check<TypeParam, collective::all_reduce, float, op::sum>(
              c, 4097, 0, test::pattern::random, false);
          test::expect_identical(c, shared, std::move(mine), spec);
        },
        test::test_options);
  }
}

// The mean of half values half holds, though their sum does not: 8 ranks of 10000 (sum 80000 >
// 65504), and 3 ranks of 30000, by every algorithm, in place and not, and reduce_scatter and
// reduce too. Summing first, then dividing, gave inf.
TYPED_TEST(all_reduce_algorithms, half_averages_do_not_overflow) {
  for (const int p : {8, 3}) {
    const float each = p == 8 ? 10000.0f : 30000.0f;
    local::run(
        p,
        [&](local::communicator& c) {
          const std::size_t n = 2 * static_cast<std::size_t>(p);
          std::vector<half> in(n, half(each)), out(n);
          all_reduce<TypeParam>(c, std::span<const half>(in), std::span(out), op::avg{});
          for (const half v : out)
            EXPECT_NEAR(static_cast<float>(v), each, each / 1024) << "p " << p;
          all_reduce<TypeParam>(c, std::span(in), op::avg{});
          for (const half v : in)
            EXPECT_NEAR(static_cast<float>(v), each, each / 1024) << "p " << p << " in place";
        },
        test::test_options);
  }
  // The default algorithm is measured at its first call, so which one runs varies: partial sums
  // of 1250 rounded to half may land one step of half (8 at 10000) away, never at inf.
  local::run(
      8,
      [&](local::communicator& c) {
        std::vector<half> in(16, half(10000.0f)), part(2), root(16);
        reduce_scatter(c, std::span<const half>(in), std::span(part), op::avg{});
        for (const half v : part)
          EXPECT_NEAR(static_cast<float>(v), 10000.0f, 10000.0f / 1024);
        reduce(c, std::span<const half>(in), std::span(root), 3, op::avg{});
        if (c.rank() == 3) {
          for (const half v : root)
            EXPECT_NEAR(static_cast<float>(v), 10000.0f, 10000.0f / 1024);
        }
      },
      test::test_options);
}

TEST(all_reduce, rejects_mismatched_spans_and_partial_overlap) {
  local::run(2, [](local::communicator& c) {
    std::vector<float> a(8), b(7);
    EXPECT_THROW(all_reduce(c, std::span<const float>(a), std::span(b)), error);
    EXPECT_THROW(all_reduce(c, std::span<const float>(a.data(), 4), std::span(a.data() + 2, 4)),
                 error);
    try {
      all_reduce(c, std::span<const float>(a), std::span(b));
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("8 elements but output has 7"), std::string::npos)
          << e.what();
    }
  });
}

TEST(all_reduce, a_count_that_differs_between_ranks_is_an_error_not_a_hang) {
  std::vector<std::string> seen(3);
  EXPECT_THROW(local::run(3,
                          [&](local::communicator& c) {
                            c.set_timeout(std::chrono::milliseconds(2000));
                            std::vector<int> v(c.rank() == 1 ? 50 : 100, 1);
                            try {
                              all_reduce<algo::ring>(c, std::span(v));
                            } catch (const error& e) {
                              seen[static_cast<std::size_t>(c.rank())] = e.what();
                              throw;
                            }
                          }),
               error);
  int errors = 0;
  for (const auto& s : seen)
    errors += s.empty() ? 0 : 1;
  EXPECT_GE(errors, 2);
}

TEST(all_reduce, rank_that_throws_inside_a_collective_is_named) {
  const auto start = std::chrono::steady_clock::now();
  try {
    local::run(4, [](local::communicator& c) {
      std::vector<float> v(1 << 16, 1.f);
      all_reduce<algo::ring>(c, std::span(v));
      if (c.rank() == 3) throw error("rank 3 gives up");
      all_reduce<algo::ring>(c, std::span(v));
    });
    ADD_FAILURE() << "run must rethrow";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 gives up"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

} // namespace
