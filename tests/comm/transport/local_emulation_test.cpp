// Emulated links (local::options::emulate_links): transfers take at least what the cluster's
// links say, results stay exact, and the pacing follows the cost model's rules (a rank's
// sends queue on its link; ranks leaving a node share its NICs). Only lower bounds are
// checked here, since a loaded machine can always be slower; the benchmark suite compares
// measured times with the model's predictions.
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/plan/cost_model.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

constexpr weft::local::options emulated{.emulate_links = true};

// 1 MiB over a 0.25 GB/s link with 1 ms latency: at least 4 ms + 1 ms.
TEST(local_emulation, one_message_takes_latency_plus_bytes_over_bandwidth) {
  const auto cluster = weft::topology::parse("2x1,inter=net:0.25GB/s:1ms");
  const std::size_t n = (std::size_t{1} << 20) / sizeof(float);
  double took = 0;
  weft::local::run(
      cluster,
      [&](weft::local::communicator& c) {
        std::vector<float> buf(n, static_cast<float>(c.rank() + 1));
        const auto t0 = clock_type::now(); // before the barrier: no transfer starts before it
        c.barrier();
        if (c.rank() == 0) {
          c.send(std::span<const float>(buf), 1);
        } else {
          c.recv(std::span(buf), 0);
          took = seconds_since(t0);
          EXPECT_EQ(buf.front(), 1.0f);
          EXPECT_EQ(buf.back(), 1.0f);
        }
      },
      emulated);
  EXPECT_GE(took, 1e-3 + double(1 << 20) / 0.25e9);
}

// Without emulation the same kind of message is a memory copy: far below what the link
// would take (0.5 s here, so that a loaded machine cannot reach it).
// Links slow enough to take longer than the nanosecond clock holds (a latency of 1e10 s, a
// terabyte at 1 B/s) saturate at "never", rather than overflow into the past (undefined
// behaviour), where the message would arrive at once.
TEST(local_emulation, times_past_the_clocks_range_are_never_not_the_past) {
  const auto slow = weft::topology::parse("2x1,inter=net:1B/s:1e10s,nics=1");
  weft::detail::link_pacer pacer(slow);
  const std::int64_t now = weft::detail::link_pacer::now();
  const std::int64_t ready = pacer.post(0, 1, 1e12);
  EXPECT_GE(ready, now);
  const std::int64_t second = pacer.post(0, 1, 1e12); // after the first, which never ends
  EXPECT_GT(second, now + std::int64_t{1'000'000'000} * 3600 * 24 * 365 * 50);
  EXPECT_GT(pacer.arrival(0, 1, 1e12, ready),
            now + std::int64_t{1'000'000'000} * 3600 * 24 * 365 * 50);
  const std::vector<int> sources{0};
  EXPECT_GT(pacer.loads(1, sources, 1e12),
            now + std::int64_t{1'000'000'000} * 3600 * 24 * 365 * 50);
  EXPECT_GT(pacer.synced(std::vector<int>{0, 1}),
            now + std::int64_t{1'000'000'000} * 3600 * 24 * 365 * 50);
}

// A rank's link can be posted to by two of its threads at once: the main thread's pipeline
// sends and a progress thread's collectives (data_parallel's, ZeRO's) run on communicators of
// the same device. Every message must hold the link in turn; two that read the same "link
// free at" and started together would make the emulated fabric faster than its links.
TEST(local_emulation, two_threads_posting_on_one_link_take_it_in_turn) {
  const auto cluster = weft::topology::parse("2x1,inter=net:1MB/s:1us");
  weft::detail::link_pacer pacer(cluster);
  constexpr int posts = 200'000; // 1,000 bytes each: 1 ms on the link
  std::vector<std::int64_t> ready[2];
  {
    std::atomic<int> started{0};
    std::vector<std::thread> threads;
    for (auto& mine : ready) {
      threads.emplace_back([&pacer, &mine, &started] {
        mine.reserve(posts);
        started.fetch_add(1);
        while (started.load() < 2) {
        }
        for (int i = 0; i < posts; ++i)
          mine.push_back(pacer.post(0, 1, 1e3));
      });
    }
    for (auto& t : threads)
      t.join();
  }
  std::vector<std::int64_t> all(ready[0]);
  all.insert(all.end(), ready[1].begin(), ready[1].end());
  std::sort(all.begin(), all.end());
  int overlapping = 0;
  for (std::size_t i = 1; i < all.size(); ++i)
    overlapping += all[i] - all[i - 1] < 1'000'000 ? 1 : 0;
  EXPECT_EQ(overlapping, 0) << "of " << all.size()
                            << " messages, some started before the one ahead had left";
}

TEST(local_emulation, off_by_default) {
  const auto cluster = weft::topology::parse("2x1,inter=net:10MB/s:400ms");
  double took = 1;
  weft::local::run(cluster, [&](weft::local::communicator& c) {
    std::vector<float> buf(1 << 18, 1.0f);
    c.barrier();
    const auto t0 = clock_type::now();
    if (c.rank() == 0)
      c.send(std::span<const float>(buf), 1);
    else
      c.recv(std::span(buf), 0), took = seconds_since(t0);
  });
  EXPECT_LT(took, 0.4 + double(1 << 20) / 10e6);
}

// Two ranks of node 0 each send 1 MiB off the node at once through one NIC: the second
// message waits for the first, so the pair takes at least two transfer times.
TEST(local_emulation, ranks_leaving_a_node_share_its_nics) {
  const auto cluster = weft::topology::parse("2x2,inter=net:0.5GB/s:10us,nics=1");
  const std::size_t n = (std::size_t{1} << 20) / sizeof(float);
  double took = 0;
  weft::local::run(
      cluster,
      [&](weft::local::communicator& c) {
        std::vector<float> buf(n, 1.0f);
        const auto t0 = clock_type::now(); // before the barrier: no transfer starts before it
        c.barrier();
        if (c.rank() < 2)
          c.send(std::span<const float>(buf), c.rank() + 2);
        else
          c.recv(std::span(buf), c.rank() - 2);
        c.barrier();
        if (c.rank() == 0) took = seconds_since(t0);
      },
      emulated);
  EXPECT_GE(took, 2.0 * double(1 << 20) / 0.5e9);
}

// A whole collective: exact results, and no faster than the cost model allows for the
// bandwidth terms of its plans (the model's price minus its latencies is a lower bound).
TEST(local_emulation, all_reduce_is_exact_and_no_faster_than_the_links) {
  const auto cluster = weft::topology::parse("2x2,intra=shm:2GB/s:5us,inter=net:0.2GB/s:20us");
  const std::size_t n = (std::size_t{1} << 20) / sizeof(float);
  double took = 0;
  weft::local::run(
      cluster,
      [&](weft::local::communicator& c) {
        std::vector<float> in(n), out(n);
        for (std::size_t i = 0; i < n; ++i)
          in[i] = static_cast<float>((c.rank() + i) % 7);
        const auto t0 = clock_type::now(); // before the barrier: no transfer starts before it
        c.barrier();
        weft::all_reduce<weft::algo::hierarchical<>>(c, std::span<const float>(in), std::span(out));
        c.barrier();
        if (c.rank() == 0) took = seconds_since(t0);
        for (std::size_t i = 0; i < n; i += 997) {
          float want = 0;
          for (int r = 0; r < c.size(); ++r)
            want += static_cast<float>((r + i) % 7);
          ASSERT_EQ(out[i], want) << i;
        }
      },
      emulated);
  // hierarchical: ring reduce-scatter in each node, then 2-rank all-reduces of a quarter
  // across nodes (two per node, sharing one NIC), then ring all-gather in each node.
  const double inter = 2.0 * double(1 << 20) / 2.0 / 0.2e9; // 2 x (N/2) per node over one NIC
  EXPECT_GE(took, inter);
}

} // namespace
