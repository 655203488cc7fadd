// The link rules (comm/detail/link_rules.hpp) on round figures, each expectation worked out by
// hand from the rule as its header states it, on the cost model's clock (seconds in double)
// and on a clock of whole microseconds, as the pacer's counts whole nanoseconds.
#include <weft/comm/detail/link_rules.hpp>

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

namespace {

namespace rules = weft::detail::link_rules;
namespace topo = weft::topology;
using seconds = rules::seconds_clock;

// Whole microseconds, each duration rounded down as it is added.
struct micros {
  using time = std::int64_t;
  static time after(time t, double s) { return t + static_cast<std::int64_t>(s * 1e6); }
  static time through(time t, double s, double latency) { return after(after(t, s), latency); }
};

// Intra: 1 GB/s, 1 us. Inter: 0.1 GB/s per NIC, 10 us. Two nodes of two devices.
topo::cluster make(int nics) {
  return topo::cluster({2, 2}, topo::link{topo::link_kind::shm, 1e9, 1e-6},
                       topo::link{topo::link_kind::ethernet, 1e8, 1e-5}, nics);
}

// A pipe carries one transfer after another, from when it is offered or free, whichever is later.
static_assert([] {
  double free = 0;
  const auto a = rules::take<seconds>(free, 1.0, 2.0); // free from the start: 1 .. 3
  const auto b = rules::take<seconds>(free, 2.0, 0.5); // waits for a: 3 .. 3.5
  const auto c = rules::take<seconds>(free, 5.0, 1.0); // the pipe is idle: 5 .. 6
  return a.start == 1 && a.end == 3 && b.start == 3 && b.end == 3.5 && c.start == 5 && c.end == 6 &&
         free == 6;
}());

TEST(link_rules, sends_take_the_link_in_turn) {
  const topo::link l{topo::link_kind::shm, 1e9, 1e-6};
  double free = 0;
  EXPECT_EQ(rules::sent<seconds>(free, 0.0, l, 1000), 0.0);
  EXPECT_DOUBLE_EQ(rules::sent<seconds>(free, 0.0, l, 1000), 1e-6); // after the first's 1 us
  EXPECT_DOUBLE_EQ(free, 2e-6);
  const topo::link slow{topo::link_kind::shm, 1e6, 0.0}; // 3e6 bytes: 3 s, 3e6 us exactly
  micros::time busy = 0;
  EXPECT_EQ(rules::sent<micros>(busy, 0, slow, 3e6), 0);
  EXPECT_EQ(rules::sent<micros>(busy, 1, slow, 3e6), 3'000'000);
  EXPECT_EQ(busy, 6'000'000);
}

TEST(link_rules, a_receive_starts_when_both_sides_are_there) {
  const topo::cluster c = make(1);
  const auto no_nic = [](double, double) -> double {
    ADD_FAILURE() << "a message within a node took the NICs";
    return 0;
  };
  // 1000 bytes on the intra link: 1 us latency + 1 us of bandwidth, from the later side.
  EXPECT_DOUBLE_EQ(rules::received<seconds>(c, c.intra(), false, 5e-6, 1e-6, 1000, no_nic), 7e-6);
  EXPECT_DOUBLE_EQ(rules::received<seconds>(c, c.intra(), false, 1e-6, 5e-6, 1000, no_nic), 7e-6);
}

TEST(link_rules, a_message_that_leaves_its_node_takes_the_nics) {
  for (int nics : {1, 2}) {
    const topo::cluster c = make(nics);
    double pipe = 0;
    const auto nic = [&](double t, double s) { return rules::take<seconds>(pipe, t, s).end; };
    // 1e6 bytes: 10 ms on one NIC's link; the pipe of `nics` NICs carries them in 10 / nics ms.
    const double one = rules::received<seconds>(c, c.inter(), true, 0.0, 0.0, 1e6, nic);
    EXPECT_DOUBLE_EQ(one, 1e-2 + 1e-5) << nics;
    EXPECT_DOUBLE_EQ(pipe, 1e-2 / nics) << nics;
    // A second rank of the node sends at once: one NIC, it waits for the first; two, it has its
    // own.
    const double two = rules::received<seconds>(c, c.inter(), true, 0.0, 0.0, 1e6, nic);
    EXPECT_DOUBLE_EQ(two, (nics == 1 ? 2e-2 : 1e-2) + 1e-5) << nics;
  }
}

TEST(link_rules, loads_pull_in_turn_and_pay_the_largest_latency_once) {
  const topo::cluster c = make(1);
  double pipe = 0;
  const auto nic = [&](double t, double s) { return rules::take<seconds>(pipe, t, s).end; };
  // Device 0 reads 1000 bytes from 1 (its node: 1 us) and then from 2 (the other: 10 us).
  const auto pull = [&](int source, double t) {
    return rules::pulled<seconds>(c, c.link_between(0, source), c.node_of(source) != 0, t, 1000,
                                  nic);
  };
  const auto link_to = [&](int source) -> const topo::link& { return c.link_between(0, source); };
  const std::array sources{1, 2};
  EXPECT_DOUBLE_EQ(rules::loaded<seconds>(0.0, sources, pull, link_to), 1e-6 + 1e-5 + 1e-5);
  EXPECT_DOUBLE_EQ(pipe, 1e-6 + 1e-5); // the other node's NICs carried the second pull
  EXPECT_EQ(rules::loaded<seconds>(3.0, std::vector<int>{}, pull, link_to), 3.0);
}

TEST(link_rules, a_sync_adds_one_latency) {
  const topo::cluster c = make(1);
  EXPECT_EQ(rules::sync_latency(c, true), 1e-6);
  EXPECT_EQ(rules::sync_latency(c, false), 1e-5);
  EXPECT_DOUBLE_EQ(rules::nic_seconds(make(4), 4e8), 1.0);
}

} // namespace
