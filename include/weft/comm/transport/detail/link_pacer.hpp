#pragma once
// Emulated links for the local transport (local::options::emulate_links): every transfer
// between two ranks is held back until it would have finished on the cluster's links, by the
// rules sim::simulate prices plans with, so a run on one machine shows what a fabric does and
// can be checked against the model's prediction.
//
//   send          ready at max(now, when the sender's link is free); it then holds the
//                 sender's link for bytes / bandwidth (a rank's sends go out one after another)
//   receive       starts at max(now, ready) and ends latency + bytes / bandwidth later; a
//                 message that leaves its node also queues on that node's NICs, one pipe of
//                 nics_per_node x inter bandwidth shared by every rank of the node
//   load          latency + bytes / bandwidth from now, queueing on the source node's NICs
//                 when it reads across nodes; load_reduce pays every member's bytes in turn
//                 and the largest latency
//   sync          the group's latency once everyone has arrived
//
// Times are nanoseconds of steady_clock. The real copy of a plain receive or load overlaps the
// emulated transfer (the copy is the transfer); a reduction runs after its data has arrived,
// as the model adds it after. Waits sleep, so emulated ranks leave the cores to the others.
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
        link_free_(std::make_unique<std::atomic<std::int64_t>[]>(static_cast<std::size_t>(c.size()))),
        nic_free_(std::make_unique<std::atomic<std::int64_t>[]>(static_cast<std::size_t>(c.nodes()))) {
    for (int d = 0; d < c.size(); ++d) link_free_[static_cast<std::size_t>(d)].store(0);
    for (int n = 0; n < c.nodes(); ++n) nic_free_[static_cast<std::size_t>(n)].store(0);
  }

  static std::int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
  }

  /// A message of `bytes` from device a to b is posted now: when it can start.
  /// Two threads of one device may post at once (a progress thread's collectives beside the
  /// main thread's sends): each message takes the link in turn.
  std::int64_t post(int a, int b, double bytes) {
    auto& free = link_free_[static_cast<std::size_t>(a)];
    const double seconds = bytes / link(a, b).bandwidth;
    const std::int64_t t = now();
    std::int64_t seen = free.load(std::memory_order_relaxed);
    std::int64_t ready = 0;
    do {
      ready = std::max(t, seen);
    } while (!free.compare_exchange_weak(seen, later(ready, seconds), std::memory_order_relaxed));
    return ready;
  }

  /// The receiver has reached a message posted with `ready`: when it has arrived.
  std::int64_t arrival(int a, int b, double bytes, std::int64_t ready) {
    return later(pull(a, b, std::max(now(), ready), bytes), link(a, b).latency);
  }

  /// Device `reader` loads `bytes` from each of `sources`, in turn: when the last has arrived.
  template <class Sources>
  std::int64_t loads(int reader, const Sources& sources, double bytes) {
    std::int64_t t = now();
    double latency = 0;
    for (int s : sources) {
      t = pull(s, reader, t, bytes);
      latency = std::max(latency, link(s, reader).latency);
    }
    return later(t, latency);
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
    const double latency =
        one_node ? cluster_.intra().latency : std::max(cluster_.intra().latency, cluster_.inter().latency);
    return later(now(), latency);
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
  // `bytes` of device a's memory go to device b from time t: when they are through (without
  // the latency). Off a's node they also queue on its NICs, one pipe of nics x inter bandwidth.
  std::int64_t pull(int a, int b, std::int64_t t, double bytes) {
    std::int64_t end = later(t, bytes / link(a, b).bandwidth);
    if (cluster_.node_of(a) != cluster_.node_of(b)) {
      const double pipe = static_cast<double>(cluster_.nics_per_node()) * cluster_.inter().bandwidth;
      auto& nic = nic_free_[static_cast<std::size_t>(cluster_.node_of(a))];
      std::int64_t seen = nic.load(std::memory_order_relaxed);
      std::int64_t done = 0;
      do {
        done = later(std::max(t, seen), bytes / pipe);
      } while (!nic.compare_exchange_weak(seen, done, std::memory_order_relaxed));
      end = std::max(end, done);
    }
    return end;
  }

  // Times saturate at `never` (about 73 years): a transfer of a terabyte at 1 B/s must not
  // overflow the clock into the past (undefined, and then an instant link). Every time kept
  // is at most `never`, so the sum of two cannot overflow either.
  static constexpr std::int64_t never = std::int64_t{1} << 61;
  static std::int64_t later(std::int64_t t, double seconds) {
    const double d = seconds * 1e9;
    const std::int64_t step = d < static_cast<double>(never) ? static_cast<std::int64_t>(d) : never;
    return std::min(t + step, never);
  }
  const topology::link& link(int a, int b) const { return cluster_.link_between(a, b); }

  topology::cluster cluster_;
  std::unique_ptr<std::atomic<std::int64_t>[]> link_free_;  // per device
  std::unique_ptr<std::atomic<std::int64_t>[]> nic_free_;   // per node
};

} // namespace weft::detail
