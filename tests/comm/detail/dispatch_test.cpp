// The path every collective takes: plan cache, call check, average. (The operations
// themselves are tested in tests/comm/*_test.cpp.)
#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/rank_errors.hpp"

namespace {

using namespace weft;
using weft::test::rank_errors;

struct check_calls_on : ::testing::Test {
  void SetUp() override { check_calls(true); }
  void TearDown() override { check_calls(false); }
};

TEST_F(check_calls_on, different_counts_are_reported_on_every_rank_before_data_moves) {
  std::vector<std::vector<int>> data(3);
  const auto seen = rank_errors(3, [&](local::communicator& c) {
    auto& v = data[static_cast<std::size_t>(c.rank())];
    v.assign(c.rank() == 2 ? 5 : 6, c.rank() + 1);
    all_reduce<algo::ring>(c, std::span(v));
  });
  for (const auto& m : seen) {
    EXPECT_NE(m.find("rank 2 differs from rank 0 in count"), std::string::npos) << m;
  }
  for (int r = 0; r < 3; ++r) {
    for (int x : data[static_cast<std::size_t>(r)])
      EXPECT_EQ(x, r + 1) << "data moved on rank " << r;
  }
}

TEST_F(check_calls_on, different_collectives_ops_types_and_roots_are_named) {
  auto seen = rank_errors(2, [](local::communicator& c) {
    std::vector<float> v(4);
    if (c.rank() == 0)
      all_reduce<algo::ring>(c, std::span(v));
    else
      broadcast<algo::ring>(c, std::span(v), 0);
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("differs from rank 0 in collective"), std::string::npos) << m;

  seen = rank_errors(2, [](local::communicator& c) {
    std::vector<float> v(4);
    if (c.rank() == 0)
      all_reduce<algo::ring>(c, std::span(v), op::sum{});
    else
      all_reduce<algo::ring>(c, std::span(v), op::max{});
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("in op"), std::string::npos) << m;

  // Two user functors of one signature: the check tells them apart (a shared name would pass it).
  const auto user_sum = [](float a, float b) { return a + b; };
  const auto user_max = [](float a, float b) { return a < b ? b : a; };
  seen = rank_errors(2, [&](local::communicator& c) {
    std::vector<float> v(4, static_cast<float>(c.rank()));
    if (c.rank() == 0)
      all_reduce<algo::ring>(c, std::span(v), user_sum);
    else
      all_reduce<algo::ring>(c, std::span(v), user_max);
  });
  for (const auto& m : seen) {
    EXPECT_NE(m.find("in op"), std::string::npos) << m;
    EXPECT_NE(m.find("op user:"), std::string::npos) << m;
  }
  // The same functor on every rank passes.
  local::run(2,
             [&](local::communicator& c) {
               std::vector<float> v(4, static_cast<float>(c.rank()));
               all_reduce<algo::ring>(c, std::span(v), user_max);
               EXPECT_EQ(v[0], 1.0f);
             },
             {.check_calls = true});

  seen = rank_errors(2, [](local::communicator& c) {
    if (c.rank() == 0) {
      std::vector<float> v(4);
      all_reduce<algo::ring>(c, std::span(v));
    } else {
      std::vector<double> v(4);
      all_reduce<algo::ring>(c, std::span(v));
    }
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("in type"), std::string::npos) << m;

  seen = rank_errors(3, [](local::communicator& c) {
    std::vector<int> v(4);
    broadcast<algo::tree>(c, std::span(v), c.rank() == 1 ? 1 : 0);
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("rank 1 differs from rank 0 in root"), std::string::npos) << m;

  seen = rank_errors(2, [](local::communicator& c) {
    std::vector<int> v(4);
    if (c.rank() == 0)
      all_reduce<algo::ring>(c, std::span(v));
    else
      all_reduce<algo::tree>(c, std::span(v));
  });
  for (const auto& m : seen)
    EXPECT_NE(m.find("in algorithm"), std::string::npos) << m;
}

TEST_F(check_calls_on, matching_calls_still_work) {
  local::run(4, [](local::communicator& c) {
    std::vector<int> v(10, c.rank());
    all_reduce(c, std::span(v));
    for (int x : v)
      EXPECT_EQ(x, 6);
  });
}

TEST(dispatch, plans_are_cached_per_rank_and_key) {
  local::run(2, [](local::communicator& c) {
    auto& cache = detail::plan_cache::mine();
    plan_request q{collective::all_reduce, 2, c.rank(), 100, 0, {0, 0}, 4};
    int built = 0;
    const auto make = [&](const plan_request& r) {
      ++built;
      return algo::ring::make_plan(r);
    };
    const plan& a = cache.get("ring", q, make);
    const plan& b = cache.get("ring", q, make);
    EXPECT_EQ(&a, &b);
    EXPECT_EQ(built, 1);
    q.count = 101;
    cache.get("ring", q, make);
    EXPECT_EQ(built, 2);
  });
}

TEST(dispatch, average_divides_once_after_the_sum) {
  local::run(4, [](local::communicator& c) {
    std::vector<int> v(3, 10 * (c.rank() + 1)); // 10, 20, 30, 40 -> 100 / 4 = 25
    all_reduce(c, std::span(v), op::avg{});
    for (int x : v)
      EXPECT_EQ(x, 25);
    std::vector<float> out(1);
    std::vector<float> in(4, static_cast<float>(c.rank())); // reduce_scatter: (0+1+2+3)/4
    reduce_scatter(c, std::span<const float>(in), std::span(out), op::avg{});
    EXPECT_EQ(out[0], 1.5f);
  });
}

// A communicator as the dispatch sees a device transport (weft::cuda's p2p, nccl, emulated):
// it has divide() and scaled_by_ranks(), here over host memory with the very functors the
// device kernels run (comm/detail/elementwise.hpp), index by index as a grid-stride loop calls
// them. Everything else is local's.
struct device_like : local::communicator {
  explicit device_like(local::communicator&& c) : local::communicator(std::move(c)) {}
  device_like split(int color, int key) {
    return device_like(local::communicator::split(color, key));
  }
  template <class T>
  void divide(T* data, std::size_t n) {
    const detail::divide_elements<T> f{data, size()};
    for (std::size_t i = 0; i < n; ++i)
      f(i);
  }
  template <class T>
  std::vector<T> scaled_by_ranks(const T* in, std::size_t n, std::string_view) {
    ++scaled_calls;
    std::vector<T> scaled(n);
    const detail::scale_elements<T> f{scaled.data(), in, detail::average_scale<T>(size())};
    for (std::size_t i = 0; i < n; ++i)
      f(i);
    return scaled;
  }
  int scaled_calls = 0;
};

// op::avg on half over p ranks, by Algo: on local (the host path) and on device_like (the path
// of every device transport); returns rank 0's results.
template <class Algo>
std::pair<std::vector<half>, std::vector<half>> average_both_ways(
    const std::vector<std::vector<half>>& in) {
  const int p = static_cast<int>(in.size());
  std::vector<half> host, device;
  local::run(p, [&](local::communicator& c) {
    const auto& mine = in[static_cast<std::size_t>(c.rank())];
    std::vector<half> out(mine.size());
    all_reduce<Algo>(c, std::span<const half>(mine), std::span(out), op::avg{});
    device_like d(c.split(0, c.rank()));
    std::vector<half> dev(mine.size());
    all_reduce<Algo>(d, std::span<const half>(mine), std::span(dev), op::avg{});
    EXPECT_EQ(d.scaled_calls, 1);
    if (c.rank() == 0) {
      host = out;
      device = dev;
    }
  });
  return {host, device};
}

std::uint16_t bits(half h) { return h.bits(); }

TEST(dispatch, half_average_on_device_transports_scales_first_as_the_host_does) {
  // Eight ranks of 10000: their sum (80000) is past half's 65504, their mean is not. The
  // one-shot sums the eight 1250s exactly; the ring rounds its partial sums to half (6250 is a
  // tie, down to 6248), and lands a step below, 9992, on either path.
  const std::vector<std::vector<half>> big(8, std::vector<half>(40, half(10000.0f)));
  const auto [host, device] = average_both_ways<algo::direct>(big);
  const auto [ring_host, ring_device] = average_both_ways<algo::ring>(big);
  for (std::size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(bits(host[i]), bits(half(10000.0f))) << i;
    EXPECT_EQ(bits(device[i]), bits(half(10000.0f))) << i;
    EXPECT_EQ(bits(ring_host[i]), bits(half(9992.0f))) << i;
    EXPECT_EQ(bits(ring_device[i]), bits(half(9992.0f))) << i;
  }

  // Random values across half's range, on 3 and 8 ranks (1/3 is inexact in float).
  std::mt19937 gen(36);
  std::uniform_real_distribution<float> any(-65000.0f, 65000.0f);
  for (int p : {3, 8}) {
    std::vector<std::vector<half>> in(static_cast<std::size_t>(p), std::vector<half>(257));
    for (auto& v : in)
      for (auto& x : v)
        x = half(any(gen));
    const auto [one_host, one_device] = average_both_ways<algo::direct>(in);
    const auto [p_ring_host, p_ring_device] = average_both_ways<algo::ring>(in);
    for (std::size_t i = 0; i < one_host.size(); ++i) {
      // The one-shot's rule, stated here: each input times 1/p rounded to half, summed in
      // rank order in float, rounded once.
      const float by = 1.0f / static_cast<float>(p);
      float acc = 0.0f;
      for (int r = 0; r < p; ++r)
        acc +=
            static_cast<float>(half(static_cast<float>(in[static_cast<std::size_t>(r)][i]) * by));
      EXPECT_EQ(bits(one_host[i]), bits(half(acc))) << "p " << p << " i " << i;
      EXPECT_EQ(bits(one_device[i]), bits(one_host[i])) << "p " << p << " i " << i;
      EXPECT_EQ(bits(p_ring_device[i]), bits(p_ring_host[i])) << "p " << p << " i " << i;
    }
  }
}

} // namespace
