// weft::cuda::two_level on one GPU: the two levels on their own streams, ordered by
// stream_runtime (reduce's scratch stream-ordered device memory), against the serial reference:
// every collective two_level offers, on even, uneven and interleaved nodes. The one-GPU harness
// (emulated) gives both levels; p2p gives both with peer loads (ranks sharing the device). The
// p2p + NCCL pairing of cuda/two_level_mpi.cuh needs one GPU per NCCL rank: samples/11_two_level
// runs it.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/cuda/emulated.cuh>
#include <weft/cuda/p2p.cuh>
#include <weft/cuda/two_level.cuh>
#include <weft/topology/topology.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "support/cuda.cuh"
#include "support/device_collectives.cuh"
#include "support/reference.hpp"

namespace {

using namespace weft;
namespace emu = weft::cuda::emulated;
namespace p2p = weft::cuda::p2p;
using namespace std::chrono_literals;

// An ASSERT that ends one rank's checks early leaves its peers waiting: a minute, not five.
const emu::options run_options{.timeout = 60s};

// p2p ranks share the device: each stream needs a hardware queue (see tests/cuda/p2p_test.cu).
const bool shared_device_configured = [] {
  p2p::configure_shared_device();
  return true;
}();

// Runs one all-reduce on device buffers of every rank and checks it on the host: against the
// serial reference, and every rank's bits against rank 0's.
template <class Algo, class T, class Op, class TwoLevel>
void check(TwoLevel& tl, std::size_t count, test::pattern pat, std::vector<std::vector<T>>& results,
           std::mutex& m) {
  const int p = tl.size();
  const auto r = static_cast<std::size_t>(tl.rank());
  std::vector<T> mine(count);
  for (std::size_t i = 0; i < count; ++i)
    mine[i] = test::input_value<T, Op>(tl.rank(), i, pat);
  weft::cuda::stream_buffer<T> d(count, tl.stream());
  test::device::upload(d.data(), mine, tl.stream());
  all_reduce<Algo>(tl, std::span(d.data(), count), Op{});
  const auto got = test::device::download(d.data(), count, tl.stream());
  std::vector<std::vector<T>> in(static_cast<std::size_t>(p), std::vector<T>(count));
  for (int q = 0; q < p; ++q) {
    for (std::size_t i = 0; i < count; ++i)
      in[static_cast<std::size_t>(q)][i] = test::input_value<T, Op>(q, i, pat);
  }
  const auto want = test::reference<T, Op>(collective::all_reduce, p, count, 0, in)[r];
  for (std::size_t i = 0; i < count; ++i) {
    if (pat == test::pattern::exact) {
      ASSERT_EQ(got[i], want[i]) << "rank " << r << ", element " << i << " of " << count;
    } else {
      ASSERT_NEAR(static_cast<double>(got[i]), static_cast<double>(want[i]), 1e-5 * p)
          << "element " << i;
    }
  }
  const std::lock_guard lock(m);
  results[r] = got;
}

// One broadcast (in place) or reduce (out of place) from `root` on device buffers, checked on the
// host against the serial reference.
template <class Algo, class T, class Op = op::sum, class TwoLevel>
void check_rooted(TwoLevel& tl, collective c, std::size_t count, int root, test::pattern pat) {
  const int p = tl.size();
  const auto r = static_cast<std::size_t>(tl.rank());
  std::vector<std::vector<T>> in(static_cast<std::size_t>(p), std::vector<T>(count));
  for (int q = 0; q < p; ++q) {
    for (std::size_t i = 0; i < count; ++i)
      in[static_cast<std::size_t>(q)][i] = test::input_value<T, Op>(q, i, pat);
  }
  const auto want = test::reference<T, Op>(c, p, count, root, in)[r];
  weft::cuda::stream_buffer<T> d(count, tl.stream());
  test::device::upload(
      d.data(),
      c == collective::broadcast && tl.rank() != root ? std::vector<T>(count, T(-7)) : in[r],
      tl.stream());
  std::vector<T> got;
  if (c == collective::broadcast) {
    broadcast<Algo>(tl, std::span(d.data(), count), root);
    got = test::device::download(d.data(), count, tl.stream());
  } else {
    const std::size_t n = tl.rank() == root ? count : 0;
    weft::cuda::stream_buffer<T> out(n, tl.stream());
    reduce<Algo>(tl, std::span<const T>(d.data(), count), std::span(out.data(), n), root, Op{});
    got = test::device::download(out.data(), n, tl.stream());
  }
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (pat == test::pattern::exact) {
      ASSERT_EQ(got[i], want[i]) << name_of(c) << " from " << root << ", rank " << r << ", element "
                                 << i;
    } else {
      ASSERT_NEAR(static_cast<double>(got[i]), static_cast<double>(want[i]), 1e-5 * p)
          << "element " << i;
    }
  }
}

// One reduce_scatter or all_gather (n elements a rank block) on device buffers, checked on the
// host against the serial reference.
template <class Algo, class T, class Op = op::sum, class TwoLevel>
void check_scatter_gather(TwoLevel& tl, collective c, std::size_t n, test::pattern pat) {
  const int p = tl.size();
  const auto r = static_cast<std::size_t>(tl.rank());
  const std::size_t in_n = test::input_count(c, p, n),
                    out_n = test::output_count(c, p, n, tl.rank(), 0);
  std::vector<std::vector<T>> in(static_cast<std::size_t>(p), std::vector<T>(in_n));
  for (int q = 0; q < p; ++q) {
    for (std::size_t i = 0; i < in_n; ++i)
      in[static_cast<std::size_t>(q)][i] = test::input_value<T, Op>(q, i, pat);
  }
  const auto want = test::reference<T, Op>(c, p, n, 0, in)[r];
  weft::cuda::stream_buffer<T> d(in_n, tl.stream()), out(out_n, tl.stream());
  test::device::upload(d.data(), in[r], tl.stream());
  if (c == collective::reduce_scatter) {
    reduce_scatter<Algo>(tl, std::span<const T>(d.data(), in_n), std::span(out.data(), out_n),
                         Op{});
  } else {
    all_gather<Algo>(tl, std::span<const T>(d.data(), in_n), std::span(out.data(), out_n));
  }
  const auto got = test::device::download(out.data(), out_n, tl.stream());
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (pat == test::pattern::exact) {
      ASSERT_EQ(got[i], want[i]) << name_of(c) << ", rank " << r << ", element " << i;
    } else {
      ASSERT_NEAR(static_cast<double>(got[i]), static_cast<double>(want[i]), 1e-5 * p)
          << "element " << i;
    }
  }
}

template <class T>
void expect_identical(const std::vector<std::vector<T>>& results) {
  for (std::size_t r = 1; r < results.size(); ++r) {
    ASSERT_EQ(results[r].size(), results[0].size());
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), results[0].size() * sizeof(T)), 0)
        << "rank " << r << " differs from rank 0";
  }
}

TEST(cuda_two_level, emulated_levels_on_their_own_streams_match_the_reference) {
  WEFT_REQUIRE_DEVICE();
  for (const char* spec : {"2x2", "3+5", "1+3", "4+2+3", "3x1"}) {
    const auto cluster = topology::parse(spec);
    std::mutex m;
    std::vector<std::vector<float>> floats(static_cast<std::size_t>(cluster.size()));
    std::vector<std::vector<std::int32_t>> ints(static_cast<std::size_t>(cluster.size()));
    emu::run(
        cluster,
        [&](emu::communicator& world) {
          // 1 KiB chunks: the 70001-element calls take dozens, pipelined across the two streams.
          auto tl = make_two_level(world, {.chunk_bytes = 1024}, weft::cuda::stream_runtime{});
          EXPECT_NE(tl.intra().stream(), tl.inter().stream()) << "each level has its own stream";
          for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{70001}}) {
            check<algo::levels<>, std::int32_t, op::sum>(tl, count, test::pattern::exact, ints, m);
            check<algo::levels<algo::ring, algo::tree>, std::int32_t, op::avg>(
                tl, count, test::pattern::exact, ints, m);
            check<algo::levels<>, float, op::sum>(tl, count, test::pattern::random, floats, m);
          }
        },
        run_options);
    expect_identical(floats);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(cuda_two_level, emulated_broadcast_and_reduce_match_the_reference) {
  WEFT_REQUIRE_DEVICE();
  for (const char* spec : {"2x2", "3+5", "4+2+3", "3x1"}) {
    const auto cluster = topology::parse(spec);
    const int p = cluster.size();
    emu::run(
        cluster,
        [&](emu::communicator& world) {
          auto tl = make_two_level(world, {.chunk_bytes = 1024}, weft::cuda::stream_runtime{});
          for (int root : {0, p / 2, p - 1}) {
            for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{70001}}) {
              check_rooted<algo::levels<>, std::int32_t>(tl, collective::broadcast, count, root,
                                                         test::pattern::exact);
              check_rooted<algo::levels<>, std::int32_t>(tl, collective::reduce, count, root,
                                                         test::pattern::exact);
              check_rooted<algo::levels<algo::ring, algo::tree>, std::int32_t, op::avg>(
                  tl, collective::reduce, count, root, test::pattern::exact);
              check_rooted<algo::levels<>, float>(tl, collective::reduce, count, root,
                                                  test::pattern::random);
            }
          }
        },
        run_options);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(cuda_two_level, emulated_reduce_scatter_and_all_gather_match_the_reference) {
  WEFT_REQUIRE_DEVICE();
  const auto run_all = [](auto& tl) {
    for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{9001}}) {
      for (const collective c : {collective::reduce_scatter, collective::all_gather}) {
        check_scatter_gather<algo::levels<>, std::int32_t>(tl, c, n, test::pattern::exact);
        check_scatter_gather<algo::levels<algo::ring, algo::tree>, float>(tl, c, n,
                                                                          test::pattern::random);
      }
      check_scatter_gather<algo::levels<>, std::int32_t, op::avg>(tl, collective::reduce_scatter, n,
                                                                  test::pattern::exact);
    }
  };
  for (const char* spec : {"2x2", "3+5", "4+2+3", "3x1"}) {
    emu::run(
        topology::parse(spec),
        [&](emu::communicator& world) {
          auto tl = make_two_level(world, {.chunk_bytes = 1024}, weft::cuda::stream_runtime{});
          run_all(tl);
        },
        run_options);
    if (::testing::Test::HasFailure()) return;
  }
  // Interleaved nodes (reordered through stream-ordered scratch): split by hand from one node.
  const std::vector<int> node_of{1, 0, 1, 2, 0, 1, 2, 0};
  emu::run(
      topology::parse("8"),
      [&](emu::communicator& world) {
        const int r = world.rank();
        const int color = weft::detail::node_color(node_of, r);
        auto intra = world.split(color, r);
        auto inter = world.split(intra.rank(), color);
        weft::cuda::two_level<emu::communicator> tl(std::move(intra), std::move(inter), node_of, r,
                                                    {.chunk_bytes = 1024});
        run_all(tl);
      },
      run_options);
}

TEST(cuda_two_level, p2p_levels_sharing_one_device_match_the_reference) {
  WEFT_REQUIRE_DEVICE();
  // Two nodes of two ranks, all on device 0: split by hand, as the node labels say.
  const std::vector<int> node_of{0, 0, 1, 1};
  std::mutex m;
  std::vector<std::vector<float>> floats(4);
  std::vector<std::vector<std::int32_t>> ints(4);
  p2p::run({0, 0, 0, 0},
           [&](p2p::communicator& c) {
             const int r = c.rank();
             auto intra = c.split(r / 2, r);
             auto inter = c.split(r % 2, r / 2);
             weft::cuda::two_level<p2p::communicator> tl(std::move(intra), std::move(inter),
                                                         node_of, r, {.chunk_bytes = 4096});
             for (std::size_t count : {std::size_t{1}, std::size_t{4097}, std::size_t{100003}}) {
               check<algo::levels<algo::direct, algo::direct>, std::int32_t, op::sum>(
                   tl, count, test::pattern::exact, ints, m);
               check<algo::levels<algo::direct, algo::direct>, float, op::avg>(
                   tl, count, test::pattern::random, floats, m);
               check_rooted<algo::levels<algo::direct, algo::direct>, std::int32_t>(
                   tl, collective::broadcast, count, 3, test::pattern::exact);
               check_rooted<algo::levels<algo::direct, algo::direct>, std::int32_t>(
                   tl, collective::reduce, count, 1, test::pattern::exact);
               check_scatter_gather<algo::levels<algo::direct, algo::direct>, std::int32_t>(
                   tl, collective::reduce_scatter, count, test::pattern::exact);
               check_scatter_gather<algo::levels<algo::direct, algo::direct>, std::int32_t>(
                   tl, collective::all_gather, count, test::pattern::exact);
             }
           },
           {.sync_timeout = 20s, .timeout = 60s});
  expect_identical(floats);
}

// One node (two ranks) and one rank per node (two nodes), on p2p levels whose workspace (64 KiB)
// holds a fraction of the call: the one-level paths go by the pieces a call on the level takes
// (p2p::communicator::max_count; of each rank block for reduce_scatter and all_gather), where
// one call of the whole would not fit and throw.
TEST(cuda_two_level, p2p_one_level_calls_larger_than_the_workspace_go_by_pieces) {
  WEFT_REQUIRE_DEVICE();
  for (const std::vector<int>& node_of : {std::vector<int>{0, 0}, std::vector<int>{0, 1}}) {
    const bool one_node = node_of[1] == 0;
    std::mutex m;
    std::vector<std::vector<std::int32_t>> ints(2);
    p2p::run({0, 0},
             [&](p2p::communicator& c) {
               const int r = c.rank();
               auto intra = one_node ? c.split(0, r) : c.split(r, 0);
               auto inter = one_node ? c.split(r, 0) : c.split(0, r);
               EXPECT_LT((one_node ? intra : inter).max_count(collective::all_reduce, 4), 30001u);
               weft::cuda::two_level<p2p::communicator> tl(std::move(intra), std::move(inter),
                                                           node_of, r);
               for (std::size_t count : {std::size_t{7}, std::size_t{30001}}) {
                 check<algo::levels<algo::direct, algo::direct>, std::int32_t, op::sum>(
                     tl, count, test::pattern::exact, ints, m);
                 check_rooted<algo::levels<algo::direct, algo::direct>, std::int32_t>(
                     tl, collective::broadcast, count, 1, test::pattern::exact);
                 check_rooted<algo::levels<algo::direct, algo::direct>, std::int32_t>(
                     tl, collective::reduce, count, 0, test::pattern::exact);
                 check_scatter_gather<algo::levels<algo::direct, algo::direct>, std::int32_t>(
                     tl, collective::reduce_scatter, count, test::pattern::exact);
                 check_scatter_gather<algo::levels<algo::direct, algo::direct>, std::int32_t>(
                     tl, collective::all_gather, count, test::pattern::exact);
               }
             },
             {.workspace_bytes = std::size_t{64} << 10, .sync_timeout = 20s, .timeout = 60s});
    expect_identical(ints);
  }
}

} // namespace
