#pragma once
// Emulated links for the local transport (local::options::emulate_links): every transfer
// between two ranks is held back until it would have finished on the cluster's links, by the
// link rules (comm/detail/link_rules.hpp) the cost model prices plans with, so a run on one
// machine shows what a fabric does and can be checked against the model's prediction. A send
// takes its sender's link from when it is posted, a receive starts when the receiver reaches
// it, a load or load_reduce from when the reader starts it, a sync's latency from when the
// last member arrives.
//
// Times are nanoseconds of steady_clock. The real copy of a plain receive or load overlaps the
// emulated transfer (the copy is the transfer); a reduction runs after its data has arrived,
// as the model adds it after. Waits sleep, so emulated ranks leave the cores to the others.
#include <weft/comm/detail/link_rules.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace weft::detail {

class link_pacer {
public:
  using clock = std::chrono::steady_clock;

  explicit link_pacer(const topology::cluster& c)
      : cluster_(c),
        link_free_(
            std::make_unique<std::atomic<std::int64_t>[]>(static_cast<std::size_t>(c.size()))),
        nic_free_(
            std::make_unique<std::atomic<std::int64_t>[]>(static_cast<std::size_t>(c.nodes()))) {
    for (int d = 0; d < c.size(); ++d)
      link_free_[static_cast<std::size_t>(d)].store(0);
    for (int n = 0; n < c.nodes(); ++n)
      nic_free_[static_cast<std::size_t>(n)].store(0);
  }

  static std::int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch())
        .count();
  }

  /// A message of `bytes` from device a to b is posted now: when it can start.
  /// Two threads of one device may post at once (a progress thread's collectives beside the
  /// main thread's sends): each message takes the link in turn.
  std::int64_t post(int a, int b, double bytes) {
    const double seconds = link_rules::hold_seconds(link(a, b), bytes);
    return take(link_free_[static_cast<std::size_t>(a)], now(), seconds).start;
  }

  /// The receiver has reached a message posted with `ready`: when it has arrived.
  std::int64_t arrival(int a, int b, double bytes, std::int64_t ready) {
    const std::int64_t reached = now();
    return link_rules::received<clock_rules>(cluster_, link(a, b), leaves(a, b), reached, ready,
                                             bytes, nic_of(a));
  }

  /// Device `reader` loads `bytes` from each of `sources`, in turn: when the last has arrived.
  template <class Sources>
  std::int64_t loads(int reader, const Sources& sources, double bytes) {
    const auto pull = [&](int s, std::int64_t t) {
      return link_rules::pulled<clock_rules>(cluster_, link(s, reader), leaves(s, reader), t, bytes,
                                             nic_of(s));
    };
    const auto link_to = [&](int s) -> const topology::link& { return link(s, reader); };
    return link_rules::loaded<clock_rules>(now(), sources, pull, link_to);
  }

  /// A sync over `devices` has completed now: when its latency has passed.
  template <class Devices>
  std::int64_t synced(const Devices& devices) const {
    bool one_node = true;
    int node = -1;
    for (int d : devices) {
      const int n = cluster_.node_of(d);
      one_node = one_node && (node < 0 || n == node);
      node = n;
    }
    return later(now(), link_rules::sync_latency(cluster_, one_node));
  }

  /// Sleeps until steady_clock reaches t (nanoseconds), to within a few microseconds. t == 0
  /// means "not paced" and returns at once, without reading the clock (the unemulated path).
  static void wait_until(std::int64_t t) {
    if (t == 0) return;
    for (;;) {
      const std::int64_t left = t - now();
      if (left <= 0) return;
      if (left > 30'000) {
        std::this_thread::sleep_for(std::chrono::nanoseconds(left - 20'000));
      } else {
        std::this_thread::yield();
      }
    }
  }

  /// Asks the kernel to wake this thread's sleeps on time (Linux rounds them up by 50 us).
  static void precise_sleeps() {
#if defined(__linux__)
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
  }

private:
  // Times saturate at `never` (about 73 years): a transfer of a terabyte at 1 B/s must not
  // overflow the clock into the past (undefined, and then an instant link). Every time kept
  // is at most `never`, so the sum of two cannot overflow either.
  static constexpr std::int64_t never = std::int64_t{1} << 61;
  static std::int64_t later(std::int64_t t, double seconds) {
    const double d = seconds * 1e9;
    const std::int64_t step = d < static_cast<double>(never) ? static_cast<std::int64_t>(d) : never;
    return std::min(t + step, never);
  }

  // The link rules' clock: nanoseconds, each duration rounded down to whole ones as it is added.
  struct clock_rules {
    using time = std::int64_t;
    static time after(time t, double seconds) { return later(t, seconds); }
    static time through(time t, double seconds, double latency) {
      return later(later(t, seconds), latency);
    }
  };

  // Takes a pipe that threads share (link_rules::take), retrying while another thread takes it.
  static link_rules::slot<clock_rules> take(std::atomic<std::int64_t>& free, std::int64_t t,
                                            double seconds) {
    std::int64_t seen = free.load(std::memory_order_relaxed);
    link_rules::slot<clock_rules> s{};
    do {
      std::int64_t mine = seen;
      s = link_rules::take<clock_rules>(mine, t, seconds);
    } while (!free.compare_exchange_weak(seen, s.end, std::memory_order_relaxed));
    return s;
  }

  // The NIC pipe of a device's node, as the link rules take it: when it has carried `seconds`
  // from t.
  struct nic_pipe {
    link_pacer* pacer;
    int device;
    std::int64_t operator()(std::int64_t t, double seconds) const {
      const auto node = static_cast<std::size_t>(pacer->cluster_.node_of(device));
      return take(pacer->nic_free_[node], t, seconds).end;
    }
  };
  nic_pipe nic_of(int device) { return {this, device}; }

  bool leaves(int a, int b) const { return cluster_.node_of(a) != cluster_.node_of(b); }
  const topology::link& link(int a, int b) const { return cluster_.link_between(a, b); }

  topology::cluster cluster_;
  std::unique_ptr<std::atomic<std::int64_t>[]> link_free_; // per device
  std::unique_ptr<std::atomic<std::int64_t>[]> nic_free_;  // per node
};

} // namespace weft::detail
