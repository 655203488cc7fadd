// automatic by measured prices on the host: the interpolation of measured times, the pick
// among eligible candidates, and the local transport measuring at the first automatic call,
// the same on every rank.
#include <weft/comm/checked_calls.hpp>
#include <weft/comm/traced.hpp>
#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace weft;

const local::options measured{.automatic = local::automatic_prices::measured};
const local::options model{.automatic = local::automatic_prices::model};

std::size_t index_of(std::string_view name) {
  const auto table = algo::candidates();
  for (std::size_t i = 0; i < table.size(); ++i)
    if (table[i].name == name) return i;
  ADD_FAILURE() << name;
  return 0;
}

measured_prices three_sizes() {
  measured_prices m;
  m.bytes = {4096, 65536, 1048576};
  m.seconds.assign(algo::candidates().size(), {});
  m.seconds[index_of("direct")] = {5e-6, 20e-6, 400e-6};
  m.seconds[index_of("ring")] = {30e-6, 40e-6, 200e-6};
  m.seconds[index_of("recursive_doubling")] = {10e-6, 60e-6}; // measured to 64 KiB only
  return m;
}

TEST(measured_prices, estimates_interpolate_hold_below_and_extend_above) {
  const auto m = three_sizes();
  const auto d = index_of("direct");
  EXPECT_DOUBLE_EQ(m.estimate(d, 1), 5e-6);
  EXPECT_DOUBLE_EQ(m.estimate(d, 4096), 5e-6);
  EXPECT_DOUBLE_EQ(m.estimate(d, (4096 + 65536) / 2.0), 12.5e-6);
  EXPECT_DOUBLE_EQ(m.estimate(d, 1048576), 400e-6);
  // Above: the last segment's slope, (400 - 20) us per (1 MiB - 64 KiB).
  EXPECT_NEAR(m.estimate(d, 2097152), 400e-6 + 380e-6 * (1048576.0 / (1048576 - 65536)), 1e-12);
  // A candidate measured at two sizes extends its own last segment: 50 us per 60 KiB.
  const auto rd = index_of("recursive_doubling");
  EXPECT_NEAR(m.estimate(rd, 1048576), 60e-6 + 50e-6 * (1048576.0 - 65536) / (65536 - 4096), 1e-12);
  EXPECT_EQ(m.estimate(index_of("tree"), 4096), std::numeric_limits<double>::infinity());
}

TEST(measured_prices, pick_takes_the_least_estimate_among_eligible_candidates) {
  const auto m = three_sizes();
  plan_request q{collective::all_reduce, 4, 0, 1024, 0, {0, 0, 0, 0}, 4}; // 4 KiB
  double price = 0;
  EXPECT_EQ(m.pick(q, true, true, &price)->name, "direct");
  EXPECT_DOUBLE_EQ(price, 5e-6);
  // Without peer access direct is out: recursive doubling, 10 us.
  EXPECT_EQ(m.pick(q, false, true, &price)->name, "recursive_doubling");
  EXPECT_DOUBLE_EQ(price, 10e-6);
  q.count = 16384; // 64 KiB: direct 20 us, ring 40, recursive doubling 60
  EXPECT_EQ(m.pick(q, true, true)->name, "direct");
  q.count = 262144; // 1 MiB: ring 200 us, direct 400, recursive doubling extended: 860
  EXPECT_EQ(m.pick(q, true, true)->name, "ring");
  // Nothing measured is eligible (all_to_all without peer access: pairwise): none.
  q.coll = collective::all_to_all;
  EXPECT_EQ(m.pick(q, false, true), nullptr);
}

TEST(measured_prices, the_local_transport_measures_once_and_every_rank_agrees) {
  std::mutex mutex;
  std::vector<std::string> chosen;
  std::vector<measured_prices> tables;
  local::run(
      3,
      [&](local::communicator& c) {
        ASSERT_TRUE(c.measures_automatic());
        EXPECT_EQ(c.measured_prices_of(collective::all_reduce), nullptr);
        std::vector<int> v(1000, c.rank());
        all_reduce(c, std::span(v));
        for (int x : v)
          EXPECT_EQ(x, 3);
        const auto prices = c.measured_prices_of(collective::all_reduce);
        ASSERT_NE(prices, nullptr);
        const algo::choice got = automatic_choice<collective::all_reduce, int>(c, v.size());
        plan_request q{collective::all_reduce, 3, c.rank(), v.size(), 0, c.node_of(), sizeof(int)};
        EXPECT_EQ(got.plan, prices->pick(q, true, true));
        const std::lock_guard lock(mutex);
        chosen.emplace_back(got.name());
        tables.push_back(*prices);
      },
      measured);
  ASSERT_EQ(chosen.size(), 3u);
  for (std::size_t r = 1; r < 3; ++r) {
    EXPECT_EQ(chosen[r], chosen[0]);
    EXPECT_EQ(tables[r].seconds, tables[0].seconds);
  }
  // Every candidate automatic may pick on one host with peer access is measured, at two
  // sizes at least, each a positive time.
  const auto table = algo::candidates();
  const plan_request q{collective::all_reduce, 3, 0, 1, 0, {0, 0, 0}, 4};
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (!detail::eligible(table[i], q, true, true)) {
      EXPECT_TRUE(tables[0].seconds[i].empty()) << table[i].name;
      continue;
    }
    ASSERT_GE(tables[0].seconds[i].size(), 2u) << table[i].name;
    for (double t : tables[0].seconds[i])
      EXPECT_GT(t, 0) << table[i].name;
  }
}

// The sizes past 4 MiB are measured at the first call that needs them, not extrapolated from
// the 1-4 MiB slope: a 4 KiB call measures 4 KiB .. 4 MiB; a call of 4 MiB and 4 bytes measures
// 16 MiB too (64 MiB on 4 ranks would pass the 256 MiB of buffers), keeping the first figures,
// the same on every rank; a later group of the same shape takes both from this process's cache.
TEST(measured_prices, larger_sizes_are_measured_at_the_first_call_that_needs_them) {
  constexpr double mib = 1048576.0;
  std::mutex mutex;
  std::vector<measured_prices> small, large;
  local::run(
      4,
      [&](local::communicator& c) {
        std::vector<float> v(1024, 1.0f);
        all_reduce(c, std::span(v));
        const measured_prices first = *c.measured_prices_of(collective::all_reduce);
        std::vector<float> w(1048577, 1.0f); // 4 MiB and 4 bytes
        all_reduce(c, std::span(w));
        EXPECT_EQ(w.front(), 4.0f);
        EXPECT_EQ(w.back(), 4.0f);
        const measured_prices then = *c.measured_prices_of(collective::all_reduce);
        const std::lock_guard lock(mutex);
        small.push_back(first);
        large.push_back(then);
      },
      measured);
  ASSERT_EQ(small.size(), 4u);
  EXPECT_FALSE(small[0].large);
  EXPECT_EQ(small[0].bytes.back(), 4 * mib);
  EXPECT_TRUE(large[0].large);
  EXPECT_EQ(large[0].bytes,
            (std::vector<double>{4096, 16384, 65536, 262144, mib, 4 * mib, 16 * mib}));
  std::size_t measured_at_16 = 0;
  for (std::size_t i = 0; i < large[0].seconds.size(); ++i) {
    const auto& was = small[0].seconds[i];
    const auto& now = large[0].seconds[i];
    ASSERT_GE(now.size(), was.size());
    EXPECT_TRUE(std::equal(was.begin(), was.end(), now.begin())) << "candidate " << i;
    // only a candidate measured at every first size goes on
    if (now.size() > was.size()) {
      EXPECT_EQ(was.size(), small[0].bytes.size()) << "candidate " << i;
      EXPECT_GT(now.back(), 0.0);
      ++measured_at_16;
    }
  }
#ifndef WEFT_TEST_SANITIZED // there 4 MiB calls may pass measured_call_limit: none goes on
  EXPECT_GE(measured_at_16, 1u) << "no candidate measured at 16 MiB";
#endif
  for (std::size_t r = 1; r < 4; ++r) {
    EXPECT_EQ(large[r].seconds, large[0].seconds) << "rank " << r;
    EXPECT_EQ(large[r].bytes, large[0].bytes) << "rank " << r;
  }
  // The cache: a new group of 4 takes the large table at its first call past 4 MiB, unchanged.
  local::run(
      4,
      [&](local::communicator& c) {
        std::vector<float> w(1048577, 1.0f);
        all_reduce(c, std::span(w));
        EXPECT_EQ(c.measured_prices_of(collective::all_reduce)->seconds, large[0].seconds);
      },
      measured);
}

TEST(measured_prices, by_default_the_local_transport_measures) {
  // The environment may choose (WEFT_AUTOMATIC); this test asks for the default itself.
  const char* env = std::getenv("WEFT_AUTOMATIC");
  if (env != nullptr && *env != '\0') GTEST_SKIP() << "WEFT_AUTOMATIC=" << env << " is set";
  local::run(2, [](local::communicator& c) { EXPECT_TRUE(c.measures_automatic()); });
}

TEST(measured_prices, asked_for_or_on_emulated_links_the_cost_model_picks) {
  local::run(
      2,
      [](local::communicator& c) {
        EXPECT_FALSE(c.measures_automatic());
        const auto got = automatic_choice<collective::all_reduce, float>(c, 1024);
        EXPECT_EQ(got.plan, &algo::choose({collective::all_reduce, 2, c.rank(), 1024, 0,
                                           c.node_of(), sizeof(float)},
                                          c.cluster(), c.devices(), true));
        EXPECT_EQ(c.measured_prices_of(collective::all_reduce), nullptr);
      },
      model);
  local::run(2, [](local::communicator& c) { EXPECT_FALSE(c.measures_automatic()); },
             {.emulate_links = true, .automatic = local::automatic_prices::measured});
  // Ranks on two emulated nodes: the cost model (hierarchical choices follow the topology).
  local::run(
      topology::parse("2x2"), [](local::communicator& c) { EXPECT_FALSE(c.measures_automatic()); },
      measured);
}

TEST(measured_prices, the_environment_chooses_where_the_program_does_not) {
  const char* before = std::getenv("WEFT_AUTOMATIC");
  const std::string saved = before != nullptr ? before : "";
  const auto restore = [&] {
    if (before != nullptr) {
      ::setenv("WEFT_AUTOMATIC", saved.c_str(), 1);
    } else {
      ::unsetenv("WEFT_AUTOMATIC");
    }
  };
  ::setenv("WEFT_AUTOMATIC", "model", 1);
  local::run(2, [](local::communicator& c) { EXPECT_FALSE(c.measures_automatic()); });
  // What the program sets wins.
  local::run(
      2, [](local::communicator& c) { EXPECT_TRUE(c.measures_automatic()); }, measured);
  ::setenv("WEFT_AUTOMATIC", "measured", 1);
  local::run(2, [](local::communicator& c) { EXPECT_TRUE(c.measures_automatic()); });
  ::setenv("WEFT_AUTOMATIC", "fastest", 1);
  try {
    local::run(2, [](local::communicator&) { ADD_FAILURE() << "ran with a bad WEFT_AUTOMATIC"; });
    ADD_FAILURE() << "no error";
  } catch (const weft::error& e) {
    EXPECT_NE(std::string(e.what()).find("WEFT_AUTOMATIC=\"fastest\""), std::string::npos)
        << e.what();
  }
  restore();
}

} // namespace

namespace {

// A local communicator with a "vendor" collective of its own and no price for it, which
// automatic measures: one that returns at once, and one that sleeps 30 ms.
template <bool Slow>
class measured_vendor : public weft::local::communicator {
public:
  explicit measured_vendor(weft::local::communicator c, int* calls)
      : weft::local::communicator(std::move(c)), calls_(calls) {}
  measured_vendor split(int color, int key) {
    return measured_vendor(weft::local::communicator::split(color, key), calls_);
  }
  template <weft::collective C, class T, class Op>
  void vendor(const T*, std::size_t, T*, std::size_t, std::size_t, int,
              const Op&) requires std::same_as<Op, weft::op::sum> {
    ++calls_[rank()];
    if (Slow) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }

private:
  int* calls_;
};

template <bool Slow>
void expect_vendor_weighed_by_measurement() {
  using namespace weft;
  int calls[2] = {0, 0};
  local::run(
      2,
      [&](local::communicator& base) {
        measured_vendor<Slow> c(std::move(base), calls);
        std::vector<float> v(256, 1.0f);
        const algo::choice got = automatic_choice<collective::all_reduce, float>(c, v.size());
        const auto& prices = c.measured_prices_of(collective::all_reduce);
        ASSERT_NE(prices, nullptr);
        ASSERT_GE(prices->vendor.size(), 2u);
        ASSERT_TRUE(got.vendor_seconds.has_value());
        EXPECT_EQ(*got.vendor_seconds, prices->vendor.front()); // 1 KiB: below the first size
        EXPECT_EQ(got.vendor, !Slow);
        if (Slow) {
          EXPECT_GE(*got.vendor_seconds, 0.03);
        }
        // max has no vendor collective here: weft's plan, and no vendor price.
        EXPECT_FALSE((automatic_choice<collective::all_reduce, float, op::max>(c, v.size())
                          .vendor_seconds.has_value()));
      },
      measured);
}

TEST(measured_prices, a_vendor_without_a_price_is_weighed_by_its_measurement) {
  expect_vendor_weighed_by_measurement<false>();
  expect_vendor_weighed_by_measurement<true>();
}

} // namespace

namespace {

// The wrappers take the wrapped communicator's measured pick: traced and checked_calls forward
// the measurement, and their calls run what the wrapped communicator would.
TEST(measured_prices, wrapped_communicators_take_the_measured_pick) {
  using namespace weft;
  local::run(
      3,
      [](local::communicator& base) {
        traced<local::communicator> t(base.split(0, base.rank()));
        checked_calls<local::communicator> k(base.split(0, base.rank()));
        EXPECT_TRUE(t.measures_automatic());
        EXPECT_TRUE(k.measures_automatic());
        std::vector<int> v(300, 1);
        all_reduce(t, std::span(v));
        for (int x : v)
          EXPECT_EQ(x, 3);
        all_reduce(k, std::span(v));
        for (int x : v)
          EXPECT_EQ(x, 9);
        ASSERT_NE(t.measured_prices_of(collective::all_reduce), nullptr);
        ASSERT_NE(k.measured_prices_of(collective::all_reduce), nullptr);
        const plan_request q{collective::all_reduce, 3,          base.rank(), v.size(), 0,
                             base.node_of(),         sizeof(int)};
        const auto* pick = t.measured_prices_of(collective::all_reduce)->pick(q, true, true);
        EXPECT_EQ((automatic_choice<collective::all_reduce, int>(t, v.size()).plan), pick);
        EXPECT_EQ((automatic_choice<collective::all_reduce, int>(k, v.size()).plan), pick);
      },
      measured);
}

} // namespace
