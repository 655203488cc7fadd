// weft::local with many ranks: what a communicator costs in memory grows with the pairs of
// ranks that talk, not with every pair there could be. (A group of p ranks once allocated p^2
// message channels of 64 slots up front: 3.4 GB at 1,024 ranks, 16 GB at 2,240, MT-NLG's
// pipeline stages x data-parallel replicas.)
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <vector>

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif
#else
constexpr bool sanitized = false;
#endif

/// The process's peak resident memory so far, in bytes (getrusage).
std::int64_t peak_resident_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::int64_t>(u.ru_maxrss) * 1024;
}

TEST(local_scale, a_ring_on_1024_ranks_costs_memory_for_the_pairs_that_talk) {
  if (sanitized) GTEST_SKIP() << "a sanitizer's shadow memory would be counted as the transport's";
  constexpr int p = 1024;
  const std::int64_t before = peak_resident_bytes();
  std::vector<double> seen(p, 0.0);
  weft::local::run(p, [&](weft::local::communicator& c) {
    std::vector<double> x(4, static_cast<double>(c.rank()));
    weft::all_reduce<weft::algo::ring>(c, std::span<double>(x));
    seen[static_cast<std::size_t>(c.rank())] = x[0];
  });
  const double expected = static_cast<double>(p) * (p - 1) / 2; // 0 + 1 + ... + p-1
  for (int r = 0; r < p; ++r)
    ASSERT_EQ(seen[static_cast<std::size_t>(r)], expected) << "rank " << r;
  // A ring touches 2p channels. 1,024 threads' stacks are mapped, not resident; the bound
  // leaves room for them and the allocator, and is a tenth of what p^2 channels take.
  const std::int64_t grew = peak_resident_bytes() - before;
  EXPECT_LT(grew, std::int64_t{300} << 20)
      << "peak resident memory grew by " << (grew >> 20) << " MiB";
}

} // namespace
