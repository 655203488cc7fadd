// automatic by measured prices on the host: the interpolation of measured times, the pick
// among eligible candidates, and the local transport measuring at the first automatic call,
// the same on every rank.
#include <weft/comm/checked_calls.hpp>
#include <weft/comm/traced.hpp>
#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
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
  // A candidate measured at two sizes interpolates there; past them, where others were
  // measured (it passed the call limit and they did not), it is not taken.
  const auto rd = index_of("recursive_doubling");
  EXPECT_NEAR(m.estimate(rd, 32768), 10e-6 + 50e-6 * (32768.0 - 4096) / (65536 - 4096), 1e-12);
  EXPECT_DOUBLE_EQ(m.estimate(rd, 65536), 60e-6);
  EXPECT_EQ(m.estimate(rd, 65540), std::numeric_limits<double>::infinity());
  EXPECT_EQ(m.estimate(index_of("tree"), 4096), std::numeric_limits<double>::infinity());
  // Where no candidate reaches further, the last segment extends: rd alone, 50 us per 60 KiB.
  measured_prices alone = m;
  alone.seconds[d].clear();
  alone.seconds[index_of("ring")].clear();
  EXPECT_NEAR(alone.estimate(rd, 1048576), 60e-6 + 50e-6 * (1048576.0 - 65536) / (65536 - 4096),
              1e-12);
  // The vendor likewise: past its last size where a candidate reaches further, none.
  measured_prices v = m;
  v.vendor = {1e-6, 2e-6};
  EXPECT_DOUBLE_EQ(*v.vendor_estimate(65536), 2e-6);
  EXPECT_EQ(*v.vendor_estimate(1048576), std::numeric_limits<double>::infinity());
  v.vendor.push_back(3e-6);
  EXPECT_DOUBLE_EQ(*v.vendor_estimate(1048576), 3e-6);
  // pick counts the vendor's reach where it competes: with ring alone to 64 KiB and the
  // vendor to 1 MiB, past 64 KiB ring is out beside the vendor, and extends without it.
  measured_prices w;
  w.bytes = {4096, 65536, 1048576};
  w.seconds.assign(algo::candidates().size(), {});
  w.seconds[index_of("ring")] = {30e-6, 40e-6};
  w.vendor = {1e-6, 2e-6, 3e-6};
  const plan_request q{collective::all_reduce, 4, 0, 32768, 0, {0, 0, 0, 0}, 4}; // 128 KiB
  EXPECT_EQ(w.pick(q, true, true, nullptr, true), nullptr);
  ASSERT_NE(w.pick(q, true, true, nullptr, false), nullptr);
  EXPECT_EQ(w.pick(q, true, true, nullptr, false)->name, "ring");
}

// A table goes between ranks as floats (pack) and comes back bit for bit (unpack).
TEST(measured_prices, a_table_packs_and_unpacks_exactly) {
  measured_prices m = three_sizes();
  m.vendor = {1.0 / 3.0, 2e-300, 7.25e12};
  m.large = true;
  m.seconds[0] = {}; // an empty one among them
  const std::vector<float> packed = detail::pack(m);
  for (const float f : packed)
    EXPECT_EQ(f, static_cast<float>(static_cast<std::uint32_t>(f))) << "not a small integer";
  const measured_prices back = detail::unpack(packed.data());
  EXPECT_EQ(back.bytes, m.bytes);
  EXPECT_EQ(back.seconds, m.seconds);
  EXPECT_EQ(back.vendor, m.vendor);
  EXPECT_EQ(back.large, m.large);
  EXPECT_EQ(detail::digest(back), detail::digest(m));
  m.large = false;
  EXPECT_NE(detail::digest(detail::unpack(detail::pack(m).data())), detail::digest(back));
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
  q.count = 262144; // 1 MiB: ring 200 us, direct 400, recursive doubling not measured
  EXPECT_EQ(m.pick(q, true, true)->name, "ring");
  // Past 64 KiB recursive doubling is out, though its last segment extended would be least.
  measured_prices late = m;
  late.seconds[index_of("recursive_doubling")] = {10e-6, 11e-6};
  late.seconds[index_of("ring")].clear();
  q.count = 16385;
  EXPECT_EQ(late.pick(q, true, true)->name, "direct");
  // Where the candidates that reach further are not eligible (direct, without peer access),
  // the rest extend their last segment.
  EXPECT_EQ(late.pick(q, false, true, &price)->name, "recursive_doubling");
  EXPECT_NEAR(price, 11e-6 + 1e-6 * 4.0 / (65536 - 4096), 1e-15);
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
// 16 and 64 MiB too (4 ranks' buffers and scratch within the 1 GiB a node), keeping the first
// figures,
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
  // The first sizes up to where a caller's calls stayed short: 4 MiB here, unless a sanitizer
  // slows the 1 MiB calls past measured_call_limit; the large table then measures 4 MiB first.
  const std::vector<double> first{4096, 16384, 65536, 262144, mib, 4 * mib};
  ASSERT_FALSE(small[0].bytes.empty());
  ASSERT_LE(small[0].bytes.size(), first.size());
  EXPECT_TRUE(std::equal(small[0].bytes.begin(), small[0].bytes.end(), first.begin()));
#ifndef WEFT_TEST_SANITIZED
  EXPECT_EQ(small[0].bytes.back(), 4 * mib);
#endif
  EXPECT_TRUE(large[0].large);
  EXPECT_EQ(large[0].bytes,
            (std::vector<double>{4096, 16384, 65536, 262144, mib, 4 * mib, 16 * mib, 64 * mib}));
  std::size_t continued = 0;
  for (std::size_t i = 0; i < large[0].seconds.size(); ++i) {
    const auto& was = small[0].seconds[i];
    const auto& now = large[0].seconds[i];
    ASSERT_GE(now.size(), was.size());
    EXPECT_TRUE(std::equal(was.begin(), was.end(), now.begin())) << "candidate " << i;
    // only a candidate measured at every first size goes on
    if (now.size() > was.size()) {
      EXPECT_EQ(was.size(), small[0].bytes.size()) << "candidate " << i;
      EXPECT_GT(now.back(), 0.0);
      ++continued;
    }
  }
  // the fastest at the base's last size goes on whatever its time (a sanitizer's build too)
  EXPECT_GE(continued, 1u) << "no candidate measured past the first table";
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

// Each thread keeps its last pick with the table and count it was made for: a call of another
// count, or a table put in place of the communicator's, picks again.
TEST(measured_prices, the_kept_pick_is_the_tables_and_the_counts) {
  const auto table_where = [](std::string_view fast, std::string_view slow) {
    measured_prices m;
    m.bytes = {4096, 65536};
    m.seconds.assign(algo::candidates().size(), {});
    m.seconds[index_of(fast)] = {1e-6, 2e-6};
    m.seconds[index_of(slow)] = {1e-3, 2e-3};
    return m;
  };
  std::mutex mutex;
  std::vector<std::string> picks;
  local::run(
      4,
      [&](local::communicator& c) {
        std::vector<std::string> mine;
        const auto pick = [&](std::size_t count) {
          mine.emplace_back(automatic_choice<collective::all_reduce, float>(c, count).name());
        };
        auto& prices = c.measured_prices_of(collective::all_reduce);
        prices = std::make_shared<const measured_prices>(table_where("direct", "ring"));
        pick(1024);
        pick(1024);
        prices = std::make_shared<const measured_prices>(table_where("ring", "direct"));
        pick(1024); // the same count, another table
        pick(4096);
        // A table like the first, at a new address while the kept one still holds the second.
        prices = std::make_shared<const measured_prices>(table_where("direct", "ring"));
        pick(4096);
        // Two communicators of one thread, each with its table, alternating at one count.
        local::communicator other = c.split(0, c.rank());
        other.measured_prices_of(collective::all_reduce) =
            std::make_shared<const measured_prices>(table_where("ring", "direct"));
        for (int i = 0; i < 2; ++i) {
          pick(4096);
          mine.emplace_back(automatic_choice<collective::all_reduce, float>(other, 4096).name());
        }
        const std::lock_guard lock(mutex);
        if (c.rank() == 0) picks = mine;
      },
      measured);
  EXPECT_EQ(picks, (std::vector<std::string>{"direct", "direct", "ring", "ring", "direct", "direct",
                                             "ring", "direct", "ring"}));
}

// The large sizes continue the communicator's own table (the one its ranks agreed on), not
// whatever this process's cache holds: a table given by hand keeps its figures at 4 KiB ..
// 4 MiB and gains the large sizes for the candidates it priced at every first size.
TEST(measured_prices, the_large_sizes_continue_the_communicators_own_table) {
  constexpr double mib = 1048576.0;
  const auto table = algo::candidates();
  const plan_request shape{collective::all_reduce, 4, 0, 1, 0, {0, 0, 0, 0}, 4};
  measured_prices given;
  given.bytes = {4096, 16384, 65536, 262144, mib, 4 * mib};
  given.seconds.assign(table.size(), {});
  std::size_t priced = 0;
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (!detail::eligible(table[i], shape, true, true)) continue;
    // 1 ms at every size for the first two, 1 ms to 1 MiB only for the rest
    given.seconds[i].assign(priced < 2 ? 6 : 5, 1e-3);
    ++priced;
  }
  ASSERT_GE(priced, 3u);
  std::mutex mutex;
  std::vector<measured_prices> got;
  local::run(
      4,
      [&](local::communicator& c) {
        c.measured_prices_of(collective::all_reduce) =
            std::make_shared<const measured_prices>(given);
        std::vector<float> w(1048577, 1.0f); // 4 MiB and 4 bytes
        all_reduce(c, std::span(w));
        EXPECT_EQ(w.front(), 4.0f);
        EXPECT_EQ(w.back(), 4.0f);
        const std::lock_guard lock(mutex);
        got.push_back(*c.measured_prices_of(collective::all_reduce));
      },
      measured);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got[0].large);
  for (std::size_t i = 0; i < table.size(); ++i) {
    const auto& was = given.seconds[i];
    const auto& now = got[0].seconds[i];
    ASSERT_GE(now.size(), was.size()) << table[i].name;
    EXPECT_TRUE(std::equal(was.begin(), was.end(), now.begin())) << table[i].name;
    if (was.size() < 6) {
      EXPECT_EQ(now.size(), was.size()) << table[i].name << " went on";
    }
  }
  EXPECT_EQ(got[0].bytes.back(), 64 * mib);
  for (std::size_t r = 1; r < 4; ++r)
    EXPECT_EQ(detail::digest(got[r]), detail::digest(got[0])) << "rank " << r;
}

// A first table whose callers all stopped at 1 MiB (their calls past measured_call_limit, as a
// sanitizer's build can make them) continues at 4 MiB, the first size it did not reach, and then
// at 16 and 64 MiB, rather than pricing 4 MiB between its 1 and 16 MiB figures.
TEST(measured_prices, a_first_table_stopped_short_continues_where_it_stopped) {
  constexpr double mib = 1048576.0;
  const auto table = algo::candidates();
  const plan_request shape{collective::all_reduce, 4, 0, 1, 0, {0, 0, 0, 0}, 4};
  measured_prices given;
  given.bytes = {4096, 16384, 65536, 262144, mib};
  given.seconds.assign(table.size(), {});
  for (std::size_t i = 0; i < table.size(); ++i)
    if (detail::eligible(table[i], shape, true, true)) given.seconds[i].assign(5, 1e-3);
  std::mutex mutex;
  std::vector<measured_prices> got;
  local::run(
      4,
      [&](local::communicator& c) {
        c.measured_prices_of(collective::all_reduce) =
            std::make_shared<const measured_prices>(given);
        std::vector<float> w(1048577, 1.0f); // 4 MiB and 4 bytes
        all_reduce(c, std::span(w));
        EXPECT_EQ(w.back(), 4.0f);
        const std::lock_guard lock(mutex);
        got.push_back(*c.measured_prices_of(collective::all_reduce));
      },
      measured);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got[0].large);
  EXPECT_EQ(got[0].bytes,
            (std::vector<double>{4096, 16384, 65536, 262144, mib, 4 * mib, 16 * mib, 64 * mib}));
  std::size_t at_4_mib = 0;
  for (std::size_t i = 0; i < table.size(); ++i) {
    const auto& now = got[0].seconds[i];
    if (now.size() > 5) {
      EXPECT_GT(now[5], 0.0) << table[i].name;
      ++at_4_mib;
    }
  }
  EXPECT_GE(at_4_mib, 1u) << "no candidate measured at 4 MiB";
}

// What a rank holds to measure counts the plans' scratch beside the buffers, and the sizes
// measured are those at which every node's ranks together stay within the cap.
TEST(measured_prices, the_sizes_measured_count_buffers_and_scratch_per_node) {
  constexpr double mib = 1048576.0;
  const auto table = algo::candidates();
  const plan_request shape{collective::all_reduce, 4, 1, 1, 0, {0, 0, 0, 0}, 4};
  const algo::candidate* ring = &table[index_of("ring")];
  // The candidate whose plan has the most scratch at 16 MiB, with ring (none at all_reduce).
  plan_request at16 = shape;
  at16.count = 4194304;
  const algo::candidate* most = ring;
  for (const auto& a : table)
    if (detail::eligible(a, shape, true, true) &&
        a.make_plan(at16).scratch_count() > most->make_plan(at16).scratch_count())
      most = &a;
  const double scratch = 4.0 * static_cast<double>(most->make_plan(at16).scratch_count());
  ASSERT_GT(scratch, 0.0) << "no scratch: the test shows nothing";
  const auto held = detail::held_bytes(shape, {ring, most}, {16 * mib});
  ASSERT_EQ(held.size(), 1u);
  // input and output of 16 MiB, and the larger scratch of the two plans
  EXPECT_EQ(held[0], static_cast<float>(32 * mib + scratch)) << most->name;
  // reduce_scatter's input is p blocks
  plan_request rs = shape;
  rs.coll = collective::reduce_scatter;
  const auto held_rs = detail::held_bytes(rs, {ring}, {mib});
  plan_request rs1 = rs;
  rs1.count = 262144;
  EXPECT_EQ(held_rs[0], static_cast<float>(5 * mib + 4.0 * ring->make_plan(rs1).scratch_count()));

  // What measured_prices.hpp says of 4 ranks on one node: 16 and 64 MiB for all_reduce,
  // broadcast and reduce; 16 MiB only for the blocked collectives.
  for (const collective c :
       {collective::all_reduce, collective::broadcast, collective::reduce,
        collective::reduce_scatter, collective::all_gather, collective::all_to_all}) {
    plan_request q = shape;
    q.coll = c;
    std::vector<const algo::candidate*> all;
    for (const auto& a : table)
      if (detail::eligible(a, q, true, true)) all.push_back(&a);
    std::vector<float> every_rank;
    for (int r = 0; r < 4; ++r) {
      q.rank = r;
      const auto mine = detail::held_bytes(q, all, detail::measured_sizes(true));
      every_rank.insert(every_rank.end(), mine.begin(), mine.end());
    }
    const bool blocked = c == collective::reduce_scatter || c == collective::all_gather ||
                         c == collective::all_to_all;
    EXPECT_EQ(detail::sizes_within(2, every_rank, {0, 0, 0, 0}, detail::measured_large_memory_bytes,
                                   false),
              blocked ? 1u : 2u)
        << name_of(c);
  }

  // Two sizes, two ranks a node: 100 and 200 bytes at the first size, 150 and 250 at the second.
  const std::vector<float> two{100, 150, 200, 250};
  EXPECT_EQ(detail::sizes_within(2, two, {0, 0}, 400, false), 2u);
  EXPECT_EQ(detail::sizes_within(2, two, {0, 0}, 399, false), 1u);
  EXPECT_EQ(detail::sizes_within(2, two, {0, 0}, 299, false), 0u);
  EXPECT_EQ(detail::sizes_within(2, two, {0, 0}, 299, true), 1u); // the first kept
  // Per node: one rank a node holds at most 250.
  EXPECT_EQ(detail::sizes_within(2, two, {0, 1}, 250, false), 2u);
  EXPECT_EQ(detail::sizes_within(2, two, {0, 1}, 249, false), 1u);
  // Any ids; none given: all on one node.
  EXPECT_EQ(detail::sizes_within(2, two, {-1, 7}, 250, false), 2u);
  EXPECT_EQ(detail::sizes_within(2, two, {}, 400, false), 2u);
  EXPECT_EQ(detail::sizes_within(2, two, {}, 399, false), 1u);
}

// Rank 1 calls 4 MiB and 4 bytes where the others call 1 KiB, after a first call alike, calls
// checked: every rank reports it before any measures, none hangs. make(base): the
// communicator the ranks call on.
template <class Make>
void expect_another_size_reported_before_measuring(const Make& make) {
  std::atomic<int> reported{0};
  local::options opt = measured;
  opt.check_calls = true;
  local::run(
      3,
      [&](local::communicator& base) {
        auto c = make(std::move(base));
        std::vector<float> v(1024, 1.0f);
        all_reduce(c, std::span(v)); // the first sizes, every rank alike
        std::vector<float> w(c.rank() == 1 ? 1048577 : 1024, 1.0f);
        try {
          all_reduce(c, std::span(w));
          ADD_FAILURE() << "rank " << c.rank() << ": no error";
        } catch (const weft::error& e) {
          EXPECT_NE(std::string(e.what()).find("all_reduce<automatic> of 1048577"),
                    std::string::npos)
              << e.what();
          ++reported;
        }
      },
      opt);
  EXPECT_EQ(reported.load(), 3);
}

// Whether a rank continues the table hangs on its call's size: a call of another size on one
// rank is reported (weft's plans alone here; beside a vendor collective below).
TEST(measured_prices, a_call_of_another_size_is_reported_before_measuring) {
  expect_another_size_reported_before_measuring([](local::communicator c) { return c; });
}

// Who goes on to the next size (time_sizes): at the first sizes, past 64 KiB, a caller whose
// calls took over 20 ms stops; at the large sizes (a call needs them) a caller within 1.5x of
// the fastest goes on past the 20 ms, up to 1 s.
TEST(measured_prices, who_goes_on_to_the_next_size) {
  local::run(
      2,
      [](local::communicator& c) {
        std::vector<float> in, out;
        const auto none = [](std::size_t, std::size_t, std::size_t, std::size_t) {};
        // first sizes: caller 1 sleeps 25 ms a call at 128 KiB
        measured_prices m;
        m.bytes = {131072, 524288};
        std::vector<double> t0, t1;
        detail::time_sizes(c, collective::all_reduce, m, {&t0, &t1}, in, out,
                           [](std::size_t j, std::size_t, std::size_t, std::size_t) {
                             if (j == 1) std::this_thread::sleep_for(std::chrono::milliseconds(25));
                           });
        EXPECT_EQ(t0.size(), 2u);
        ASSERT_EQ(t1.size(), 1u);
        EXPECT_GE(t1[0], 0.025);
        // large sizes, from given times at 4 MiB
        measured_prices l;
        l.bytes = {4194304, 16777216};
        std::vector<double> fastest{0.025}, near{0.036}, far{0.040};
        detail::time_sizes(c, collective::all_reduce, l, {&fastest, &near, &far}, in, out, none, 1);
        EXPECT_EQ(fastest.size(), 2u);
        EXPECT_EQ(near.size(), 2u);
        EXPECT_EQ(far.size(), 1u);
        // and not past 1 s
        std::vector<double> slow{0.9}, slower{1.1};
        detail::time_sizes(c, collective::all_reduce, l, {&slow, &slower}, in, out, none, 1);
        EXPECT_EQ(slow.size(), 2u);
        EXPECT_EQ(slower.size(), 1u);
      },
      measured);
}

// A candidate's figure is its median batch, each batch timed after a barrier and one untimed
// call: a candidate fast in one batch of three and slow in the others is priced slow, and the
// call after the barrier is not timed.
TEST(measured_prices, a_candidate_is_priced_by_its_median_batch_after_an_untimed_call) {
  local::run(
      2,
      [](local::communicator& c) {
        std::vector<float> in, out;
        measured_prices m;
        m.bytes = {4096}; // batches of 8 calls
        std::vector<double> swinging, steady, first_slow;
        std::array<int, 3> calls{};
        // Call 0 is the size's untimed first; batch k is calls 1 + 9k (untimed) to 9 + 9k.
        const auto run = [&](std::size_t j, std::size_t, std::size_t, std::size_t) {
          const int call = calls[j]++;
          const bool later_batch = call > 9;
          const bool leads = call > 0 && (call - 1) % 9 == 0;
          std::chrono::microseconds sleep{0};
          if (j == 0 && later_batch) sleep = std::chrono::microseconds(4000);
          if (j == 1) sleep = std::chrono::microseconds(1000);
          if (j == 2 && leads) sleep = std::chrono::microseconds(50000);
          std::this_thread::sleep_for(sleep);
        };
        detail::time_sizes(c, collective::all_reduce, m, {&swinging, &steady, &first_slow}, in, out,
                           run);
        EXPECT_EQ(calls, (std::array<int, 3>{28, 28, 28}));
        ASSERT_EQ(swinging.size(), 1u);
        ASSERT_EQ(steady.size(), 1u);
        ASSERT_EQ(first_slow.size(), 1u);
        EXPECT_GE(swinging[0], 0.004); // not its fast first batch
        EXPECT_GE(steady[0], 0.001);
        EXPECT_LT(steady[0], swinging[0]);
        EXPECT_LT(first_slow[0], 0.005); // its 50 ms lead-in calls untimed
      },
      measured);
}

// A batch is 8 calls to 64 KiB, 2 to 1 MiB, 4 at 4 MiB (one call a batch priced direct near tree
// there, where tree ran 1.1-1.2x faster) and 1 past it: per size one untimed call, then 3
// batches, each after one untimed call.
TEST(measured_prices, calls_a_batch_by_size) {
  local::run(
      2,
      [](local::communicator& c) {
        std::vector<float> in, out;
        for (const auto& [bytes, calls_expected] :
             {std::pair{65536.0, 28}, {1048576.0, 10}, {4194304.0, 16}, {16777216.0, 7}}) {
          measured_prices m;
          m.bytes = {bytes};
          std::vector<double> t;
          int calls = 0;
          detail::time_sizes(c, collective::all_reduce, m, {&t}, in, out,
                             [&](std::size_t, std::size_t, std::size_t, std::size_t) { ++calls; });
          EXPECT_EQ(calls, calls_expected) << bytes << " B";
        }
      },
      measured);
}

// A local communicator that counts its barriers.
class counting_barriers : public local::communicator {
public:
  counting_barriers(local::communicator c, int* barriers)
      : local::communicator(std::move(c)), barriers_(barriers) {}
  void barrier() {
    ++*barriers_;
    local::communicator::barrier();
  }

private:
  int* barriers_;
};

// Each batch's barrier comes before its untimed call: the ranks' wake-up from the barrier
// falls on a call that is not timed.
TEST(measured_prices, each_batch_is_a_barrier_then_an_untimed_call_then_the_timed_ones) {
  local::run(
      2,
      [](local::communicator& base) {
        int barriers = 0;
        counting_barriers c(std::move(base), &barriers);
        std::vector<float> in, out;
        measured_prices m;
        m.bytes = {4096}; // batches of 8 calls
        std::vector<double> a, b;
        std::array<std::vector<int>, 2> seen; // the barrier count at each call, per candidate
        detail::time_sizes(c, collective::all_reduce, m, {&a, &b}, in, out,
                           [&](std::size_t j, std::size_t, std::size_t, std::size_t) {
                             seen[j].push_back(barriers);
                           });
        for (std::size_t j = 0; j < 2; ++j) {
          ASSERT_EQ(seen[j].size(), 28u);
          for (std::size_t k = 0; k < 3; ++k) {
            const std::size_t lead = 1 + 9 * k;
            EXPECT_GT(seen[j][lead], seen[j][lead - 1]) << "candidate " << j << ", batch " << k;
            for (std::size_t i = lead; i < lead + 9; ++i)
              EXPECT_EQ(seen[j][i], seen[j][lead]) << "candidate " << j << ", call " << i;
          }
        }
      },
      measured);
}

// A communicator whose measure_prices takes no table to continue (the three-argument form)
// keeps its first table past 4 MiB and extrapolates it.
class three_argument_measure : public local::communicator {
public:
  explicit three_argument_measure(local::communicator c) : local::communicator(std::move(c)) {}
  three_argument_measure split(int color, int key) {
    return three_argument_measure(local::communicator::split(color, key));
  }
  [[nodiscard]] std::shared_ptr<const measured_prices> measure_prices(collective c, bool peer,
                                                                      bool messages) {
    return local::communicator::measure_prices(c, peer, messages);
  }
};
static_assert(detail::continues_prices<local::communicator>);
static_assert(!detail::continues_prices<three_argument_measure>);
static_assert(detail::continues_prices<traced<local::communicator>>);
static_assert(!detail::continues_prices<traced<three_argument_measure>>);

TEST(measured_prices, a_communicator_that_cannot_continue_extrapolates) {
  local::run(
      2,
      [&](local::communicator& base) {
        three_argument_measure c(std::move(base));
        std::vector<float> w(1048577, 1.0f);
        all_reduce(c, std::span(w));
        EXPECT_EQ(w.back(), 2.0f);
        const auto m = c.measured_prices_of(collective::all_reduce);
        ASSERT_NE(m, nullptr);
        EXPECT_FALSE(m->large);
        EXPECT_LE(m->bytes.back(), 4 * 1048576.0);
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

// Beside a vendor collective (the dispatch path), a call of another size on one rank is
// reported before any rank measures, as on weft's plans alone.
TEST(measured_prices, beside_a_vendor_a_call_of_another_size_is_reported_before_measuring) {
  int calls[3] = {0, 0, 0};
  expect_another_size_reported_before_measuring(
      [&](weft::local::communicator c) { return measured_vendor<false>(std::move(c), calls); });
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
