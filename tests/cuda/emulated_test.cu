// weft::cuda::emulated: N ranks on one GPU. Every collective and algorithm runs its device
// path (device buffers, kernels, stream ordering between ranks) and is checked against the
// serial reference of tests/support/reference.hpp. The host-only tests at the top run
// everywhere; the others skip themselves where there is no device.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/halving_doubling.hpp>
#include <weft/comm/algorithm/hierarchical.hpp>
#include <weft/comm/algorithm/pairwise.hpp>
#include <weft/comm/algorithm/recursive_doubling.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/algorithm/tree.hpp>
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/all_to_all.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/cuda/emulated.cuh>
#include <weft/topology/topology.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/cuda.cuh"
#include "support/device_collectives.cuh"
#include "support/reference.hpp"

namespace {

using namespace weft;
namespace emu = weft::cuda::emulated;
using namespace weft::test::device;
using namespace std::chrono_literals;

static_assert(weft::communicator<emu::communicator>);
static_assert(weft::plan_executor<emu::communicator>);
static_assert(weft::peer_access<emu::communicator>,
              "algo::direct must compile with the emulated transport");

std::string failure_of(auto&& body) {
  try {
    body();
  } catch (const weft::error& e) {
    return e.what();
  }
  return "";
}

// --- host only ---------------------------------------------------------------------------

TEST(emulated_host, run_needs_a_rank_before_it_looks_for_a_device) {
  const auto msg = failure_of([] { emu::run(0, [](emu::communicator&) {}); });
  EXPECT_NE(msg.find("at least 1"), std::string::npos) << msg;
}

TEST(emulated_host, run_without_a_device_says_why_before_starting_ranks) {
  if (weft::cuda::device_count() > 0) GTEST_SKIP() << "a device is present";
  bool started = false;
  const auto msg = failure_of([&] { emu::run(2, [&](emu::communicator&) { started = true; }); });
  EXPECT_NE(msg.find("cuda::emulated::run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
  EXPECT_FALSE(started);
  const auto nodes =
      failure_of([] { emu::run(topology::parse("2x2"), [](emu::communicator&) {}); });
  EXPECT_NE(nodes.find("no CUDA device"), std::string::npos) << nodes;
}

// Fake addresses: place_receives looks only at whether input and output are one buffer.
constexpr std::uintptr_t in_at = 0x10000, out_at = 0x20000, scratch_at = 0x30000;

step make_step(step_kind kind, buffer src, std::size_t src_offset, buffer dst,
               std::size_t dst_offset, std::size_t count, int peer = 1) {
  return {kind, src, dst, peer, src_offset, dst_offset, count, 0};
}

TEST(emulated_host, a_receive_lands_in_place_unless_an_earlier_step_touches_its_range) {
  const std::uintptr_t base[3] = {in_at, out_at, scratch_at};
  std::vector<std::size_t> at;
  using k = step_kind;
  using b = buffer;
  // Nothing before it: in place.
  std::vector<step> round = {make_step(k::recv, b::output, 0, b::output, 0, 10)};
  EXPECT_EQ(weft::cuda::detail::place_receives(round, base, 4, at), 0u);
  EXPECT_EQ(at[0], weft::cuda::detail::lands_in_place);
  // A send of another range, a copy elsewhere: still in place.
  round = {make_step(k::send, b::output, 10, b::output, 10, 10),
           make_step(k::copy, b::input, 0, b::scratch, 0, 10),
           make_step(k::recv, b::output, 0, b::output, 0, 10)};
  EXPECT_EQ(weft::cuda::detail::place_receives(round, base, 4, at), 0u);
  EXPECT_EQ(at[2], weft::cuda::detail::lands_in_place);
  // An earlier copy reads the range (its last element), or writes it: a temporary.
  round = {make_step(k::copy, b::output, 9, b::scratch, 0, 5),
           make_step(k::recv, b::output, 0, b::output, 0, 10)};
  EXPECT_EQ(weft::cuda::detail::place_receives(round, base, 4, at), 256u);
  EXPECT_EQ(at[1], 0u);
  round = {make_step(k::reduce, b::input, 0, b::scratch, 4, 2),
           make_step(k::recv, b::scratch, 0, b::scratch, 0, 5)};
  weft::cuda::detail::place_receives(round, base, 4, at);
  EXPECT_EQ(at[1], 0u);
  // The same step after the receive does not matter: the receive comes first anyway.
  round = {make_step(k::recv, b::output, 0, b::output, 0, 10),
           make_step(k::copy, b::output, 9, b::scratch, 0, 5)};
  EXPECT_EQ(weft::cuda::detail::place_receives(round, base, 4, at), 0u);
  EXPECT_EQ(at[0], weft::cuda::detail::lands_in_place);
}

TEST(emulated_host, in_place_input_and_output_are_one_buffer_to_the_overlap_rule) {
  const std::uintptr_t apart[3] = {in_at, out_at, scratch_at};
  const std::uintptr_t in_place[3] = {out_at, out_at, scratch_at};
  const std::vector<step> round = {
      make_step(step_kind::copy, buffer::input, 0, buffer::scratch, 0, 8),
      make_step(step_kind::recv, buffer::output, 4, buffer::output, 4, 8)};
  std::vector<std::size_t> at;
  weft::cuda::detail::place_receives(round, apart, 8, at);
  EXPECT_EQ(at[1], weft::cuda::detail::lands_in_place);
  weft::cuda::detail::place_receives(round, in_place, 8, at);
  EXPECT_EQ(at[1], 0u);
}

TEST(emulated_host, every_recv_reduce_takes_an_aligned_temporary_of_its_own) {
  const std::uintptr_t base[3] = {in_at, out_at, scratch_at};
  const std::vector<step> round = {
      make_step(step_kind::recv_reduce, buffer::input, 0, buffer::output, 0, 3),
      make_step(step_kind::recv, buffer::output, 100, buffer::output, 100,
                1), // untouched range: in place
      make_step(step_kind::recv_reduce, buffer::input, 3, buffer::output, 3, 100, 2),
      make_step(step_kind::recv, buffer::output, 0, buffer::output, 0, 2,
                2)}; // the first one writes it
  std::vector<std::size_t> at;
  const std::size_t bytes = weft::cuda::detail::place_receives(round, base, 2, at);
  ASSERT_EQ(at.size(), 4u);
  EXPECT_EQ(at[0], 0u);
  EXPECT_EQ(at[1], weft::cuda::detail::lands_in_place);
  EXPECT_EQ(at[2], 256u + 6); // output[3] of 2-byte elements: 6 bytes past a 16-byte boundary
  EXPECT_EQ(at[3], 512u);
  EXPECT_EQ(bytes, 768u);
  // A destination whose buffer starts off a boundary: its temporary takes the same phase.
  const std::uintptr_t off[3] = {in_at, out_at + 2, scratch_at};
  weft::cuda::detail::place_receives(round, off, 2, at);
  EXPECT_EQ(at[0], 2u);
  EXPECT_EQ(at[2], 256u + 8);
  EXPECT_EQ(at[3], 512u + 2);
}

TEST(emulated_host, plan_checks_name_the_operation_rank_and_peer) {
  plan_request q{collective::all_reduce, 4, 1, 10, 0, {}, 4};
  const std::size_t sizes[3] = {10, 10, 0};
  {
    plan pl(q);
    pl.send(2, buffer::input, 5, 6); // [5, 11) of 10
    const auto msg =
        failure_of([&] { weft::cuda::detail::check_plan(pl, sizes, 1, 4, "all_reduce"); });
    EXPECT_NE(msg.find("all_reduce on rank 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[5, 11) of a buffer of 10"), std::string::npos) << msg;
  }
  {
    plan pl(q);
    pl.recv(4, buffer::output, 0, 1);
    const auto msg = failure_of([&] { weft::cuda::detail::check_plan(pl, sizes, 1, 4, "reduce"); });
    EXPECT_NE(msg.find("reduce on rank 1 (peer 4)"), std::string::npos) << msg;
  }
  {
    plan pl(q);
    pl.recv(1, buffer::output, 0, 1); // from itself
    EXPECT_THROW(weft::cuda::detail::check_plan(pl, sizes, 1, 4, "reduce"), error);
  }
  {
    plan pl(q);
    pl.need_scratch(4);
    pl.copy(buffer::input, 0, buffer::scratch, 0, 4); // scratch of 0 given
    EXPECT_THROW(weft::cuda::detail::check_plan(pl, sizes, 1, 4, "all_reduce"), error);
    const std::size_t with_scratch[3] = {10, 10, 4};
    EXPECT_NO_THROW(weft::cuda::detail::check_plan(pl, with_scratch, 1, 4, "all_reduce"));
  }
  {
    plan pl(q);
    const int g = pl.add_group({0, 1, 7});
    pl.sync(g);
    const auto msg =
        failure_of([&] { weft::cuda::detail::check_plan(pl, sizes, 1, 4, "broadcast"); });
    EXPECT_NE(msg.find("(peer 7)"), std::string::npos) << msg;
  }
  {
    plan pl(q);
    const int g = pl.add_group({0, 1});
    pl.load_reduce(g, buffer::input, 8, buffer::output, 0, 4); // its own input [8, 12)
    EXPECT_THROW(weft::cuda::detail::check_plan(pl, sizes, 1, 4, "all_reduce"), error);
    EXPECT_NO_THROW(weft::cuda::detail::check_plan(pl, sizes, 2, 4,
                                                   "all_reduce")); // not a member: peers' ranges
  }
}

// --- on the device -----------------------------------------------------------------------

const emu::options test_options{.timeout = std::chrono::seconds(60)};

/// Where a collective reduces, ring (flat and two-level) runs every operator and the other
/// algorithms sum and avg: an operator only picks the reduce kernel, which kernels_test checks
/// for every type and operator bit for bit, while avg adds the plan's division step, the part an
/// algorithm could get wrong on its own. (Every operator everywhere was ~700 instantiations and
/// four minutes of nvcc in CI.)
template <class Algo>
constexpr bool every_operator = std::is_same_v<Algo, algo::ring> ||
                                std::is_same_v<Algo, algo::hierarchical<algo::ring, algo::ring>>;

std::vector<topology::cluster> flat_worlds() {
  std::vector<topology::cluster> v;
  for (int p : {1, 2, 3, 4, 5, 8})
    v.push_back(topology::host(p));
  return v;
}

template <class Algo, collective C>
void sweep(const std::vector<topology::cluster>& worlds) {
  for (const auto& world : worlds) {
    const int p = world.size();
    shared_outputs shared(p);
    emu::run(
        world,
        [&](emu::communicator& c) {
          rank_memory mem(c.stream());
          for (std::size_t count : counts_for(p))
            check_all_types<Algo, C, every_operator<Algo>>(c, mem, shared, count, p - 1);
          if constexpr (C == collective::broadcast || C == collective::reduce) {
            for (int root = 0; root < p - 1; ++root) {
              call_and_check<Algo, C, std::int32_t, op::sum>(c, mem, 7, root, test::pattern::exact,
                                                             false);
            }
          }
        },
        test_options);
    if (::testing::Test::HasFailure()) return;
  }
}

template <class Algo>
class emulated_all_reduce : public ::testing::Test {};
using all_reduce_algorithms =
    ::testing::Types<algo::ring, algo::tree, algo::halving_doubling, algo::recursive_doubling,
                     algo::direct, algo::automatic>;
TYPED_TEST_SUITE(emulated_all_reduce, all_reduce_algorithms);
TYPED_TEST(emulated_all_reduce, matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<TypeParam, collective::all_reduce>(flat_worlds());
}

template <class Algo>
class emulated_reduce_scatter : public ::testing::Test {};
using scatter_gather_algorithms =
    ::testing::Types<algo::ring, algo::halving_doubling, algo::direct, algo::automatic>;
TYPED_TEST_SUITE(emulated_reduce_scatter, scatter_gather_algorithms);
TYPED_TEST(emulated_reduce_scatter, matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<TypeParam, collective::reduce_scatter>(flat_worlds());
}

template <class Algo>
class emulated_all_gather : public ::testing::Test {};
TYPED_TEST_SUITE(emulated_all_gather, scatter_gather_algorithms);
TYPED_TEST(emulated_all_gather, matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<TypeParam, collective::all_gather>(flat_worlds());
}

template <class Algo>
class emulated_rooted : public ::testing::Test {};
using rooted_algorithms = ::testing::Types<algo::ring, algo::tree, algo::direct, algo::automatic>;
TYPED_TEST_SUITE(emulated_rooted, rooted_algorithms);
TYPED_TEST(emulated_rooted, broadcast_matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<TypeParam, collective::broadcast>(flat_worlds());
}
TYPED_TEST(emulated_rooted, reduce_matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<TypeParam, collective::reduce>(flat_worlds());
}

template <class Algo>
class emulated_all_to_all : public ::testing::Test {};
using all_to_all_algorithms = ::testing::Types<algo::direct, algo::pairwise, algo::automatic>;
TYPED_TEST_SUITE(emulated_all_to_all, all_to_all_algorithms);
TYPED_TEST(emulated_all_to_all, matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<TypeParam, collective::all_to_all>(flat_worlds());
}

// Two emulated nodes of two ranks: the topology-aware algorithms take their two-level paths.
template <class Algo>
class emulated_on_nodes : public ::testing::Test {};
using node_algorithms =
    ::testing::Types<algo::hierarchical<algo::ring, algo::ring>,
                     algo::hierarchical<algo::ring, algo::tree>, algo::automatic>;
TYPED_TEST_SUITE(emulated_on_nodes, node_algorithms);
TYPED_TEST(emulated_on_nodes, all_reduce_broadcast_and_reduce_match_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  const std::vector<topology::cluster> two_by_two{topology::parse("2x2")};
  sweep<TypeParam, collective::all_reduce>(two_by_two);
  sweep<TypeParam, collective::broadcast>(two_by_two);
  sweep<TypeParam, collective::reduce>(two_by_two);
}

// --- stream ordering, failures, the communicator's own API ---------------------------------

// op::avg on half: eight ranks of 10000 sum past half's 65504, so each input is scaled by 1/8
// before the plan sums (the host path's rule), giving 10000 where summing first gives inf.
TEST(emulated, half_average_scales_before_it_sums) {
  WEFT_REQUIRE_DEVICE();
  constexpr std::size_t n = 1000;
  emu::run(
      8,
      [&](emu::communicator& c) {
        const cudaStream_t s = c.stream();
        weft::cuda::device_buffer<weft::half> a(n);
        upload(a.data(), std::vector<weft::half>(n, weft::half(10000.0f)), s);
        all_reduce<algo::direct>(c, std::span(a.data(), n), op::avg{});
        const auto got = download(a.data(), n, s);
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_EQ(got[i].bits(), weft::half(10000.0f).bits())
              << "rank " << c.rank() << " i " << i;
      },
      test_options);
}

// Calls queued back to back with no host synchronisation, a different rank's stream held
// back before each, local kernels between them: any missing dependency between the ranks'
// streams (a source overwritten early, a staging area reused while a peer reads it) shows
// as a wrong value. A host model of every rank's data gives the expected result.
TEST(emulated, back_to_back_calls_are_ordered_by_the_streams_alone) {
  WEFT_REQUIRE_DEVICE();
  constexpr int calls = 24;
  for (int p : {3, 4}) {
    for (std::size_t n :
         {std::size_t{1000}, std::size_t{5000}}) { // direct's one-shot, and its two-shot
      const auto model = back_to_back_model(p, n, calls, [](int k) { return k % 8 == 4; });
      emu::run(
          p,
          [&](emu::communicator& c) {
            const cudaStream_t s = c.stream();
            weft::cuda::device_buffer<std::int64_t> a(n), b(n);
            upload(a.data(), std::vector<std::int64_t>(n, 1), s);
            std::int64_t* x = a.data();
            std::int64_t* y = b.data();
            const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
            for (int k = 0; k < calls; ++k) {
              if (c.rank() == k % p) spin<<<1, 1, 0, s>>>(200000); // about 0.1 ms behind the others
              add_pattern<<<blocks, 256, 0, s>>>(x, n, c.rank() + k);
              const std::span<std::int64_t> data(x, n);
              switch (k % 8) {
                case 0: all_reduce<algo::ring>(c, data); break;
                case 1:
                case 2:
                case 3:
                case 6: all_reduce<algo::direct>(c, data); break;
                case 4: broadcast<algo::tree>(c, data, k % p); break;
                case 5:
                  all_reduce<algo::halving_doubling>(c, std::span<const std::int64_t>(x, n),
                                                     std::span(y, n));
                  std::swap(x, y);
                  break;
                default: all_reduce<algo::recursive_doubling>(c, data); break;
              }
            }
            WEFT_CUDA_TRY(cudaGetLastError());
            const auto got = download(x, n, s);
            const std::string diff =
                test::compare(got, model[static_cast<std::size_t>(c.rank())], true, 0);
            EXPECT_TRUE(diff.empty())
                << "p=" << p << " n=" << n << " rank " << c.rank() << ": " << diff;
          },
          test_options);
    }
  }
}

TEST(emulated, a_stalled_peer_is_an_error_naming_it_not_a_hang) {
  WEFT_REQUIRE_DEVICE();
  // Allocated outside the run: after a failure a peer may still have copies of them queued.
  std::vector<weft::cuda::device_buffer<float>> bufs;
  for (int r = 0; r < 4; ++r)
    bufs.emplace_back(64);
  std::vector<std::string> seen(4);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(
      emu::run(4,
               [&](emu::communicator& c) {
                 if (c.rank() == 3) {
                   std::this_thread::sleep_for(1500ms); // stalls, then leaves without joining
                   return;
                 }
                 try {
                   all_reduce<algo::ring>(
                       c, std::span(bufs[static_cast<std::size_t>(c.rank())].data(), 64));
                 } catch (const error& e) {
                   seen[static_cast<std::size_t>(c.rank())] = e.what();
                   throw;
                 }
               },
               {.timeout = 200ms}),
      error);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  int named = 0;
  for (int r = 0; r < 3; ++r) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("all_reduce on rank " + std::to_string(r)), std::string::npos) << m;
    named += m.find("peer 3") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(named, 1) << "the ranks that wait on rank 3 name it";
}

TEST(emulated, a_rank_that_throws_fails_the_others_and_run_rethrows_it) {
  WEFT_REQUIRE_DEVICE();
  std::vector<weft::cuda::device_buffer<float>> bufs;
  for (int r = 0; r < 4; ++r)
    bufs.emplace_back(8192);
  const auto start = std::chrono::steady_clock::now();
  const auto msg = failure_of([&] {
    emu::run(
        4,
        [&](emu::communicator& c) {
          if (c.rank() == 2) throw error("user code on rank 2 broke");
          all_reduce<algo::direct>(
              c, std::span(bufs[static_cast<std::size_t>(c.rank())].data(), 8192));
        },
        test_options);
  });
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  EXPECT_NE(msg.find("user code on rank 2 broke"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s)
      << "the others must not wait for the deadline";
}

TEST(emulated, ranks_that_disagree_on_the_count_get_an_error_not_a_hang) {
  WEFT_REQUIRE_DEVICE();
  std::vector<weft::cuda::device_buffer<int>> bufs;
  for (int r = 0; r < 3; ++r)
    bufs.emplace_back(100);
  std::vector<std::string> seen(3);
  EXPECT_THROW(emu::run(3,
                        [&](emu::communicator& c) {
                          const std::size_t n = c.rank() == 1 ? 50 : 100;
                          try {
                            all_reduce<algo::ring>(
                                c, std::span(bufs[static_cast<std::size_t>(c.rank())].data(), n));
                          } catch (const error& e) {
                            seen[static_cast<std::size_t>(c.rank())] = e.what();
                            throw;
                          }
                        },
                        {.timeout = 2s}),
               error);
  WEFT_CUDA_TRY(cudaDeviceSynchronize());
  int named = 0;
  for (const auto& m : seen)
    named += m.find("all_reduce on rank") != std::string::npos ? 1 : 0;
  EXPECT_GE(named, 1);
}

TEST(emulated, the_call_check_runs_over_the_host_messages) {
  WEFT_REQUIRE_DEVICE();
  struct restore {
    ~restore() { check_calls(false); }
  } guard;
  check_calls(true);
  std::vector<std::string> seen(3);
  EXPECT_THROW(emu::run(
                   3,
                   [&](emu::communicator& c) {
                     weft::cuda::device_buffer<float> d(16);
                     try {
                       broadcast<algo::ring>(c, std::span(d.data(), 16), c.rank() == 1 ? 1 : 0);
                     } catch (const error& e) {
                       seen[static_cast<std::size_t>(c.rank())] = e.what();
                       throw;
                     }
                   },
                   test_options),
               error);
  for (const auto& m : seen)
    EXPECT_NE(m.find("rank 1 differs from rank 0 in root"), std::string::npos) << m;
}

TEST(emulated, split_gives_communicators_on_the_same_device_with_their_own_streams) {
  WEFT_REQUIRE_DEVICE();
  emu::run(
      5,
      [](emu::communicator& c) {
        constexpr std::size_t n = 3000;
        weft::cuda::device_buffer<std::int32_t> d(n);
        // Queued on the parent's stream before the split: the part's stream starts after it.
        upload(d.data(), std::vector<std::int32_t>(n, c.rank() + 1), c.stream());
        emu::communicator part =
            c.split(c.rank() % 2, -c.rank()); // reversed order within each half
        EXPECT_NE(part.stream(), c.stream());
        EXPECT_EQ(part.device(), c.device());
        const std::vector<int> members =
            c.rank() % 2 == 0 ? std::vector<int>{4, 2, 0} : std::vector<int>{3, 1};
        EXPECT_EQ(
            part.size(),
            static_cast<int>(members.size())); // not ASSERT: a rank leaving would stall the others
        if (part.size() != static_cast<int>(members.size())) return;
        EXPECT_EQ(members[static_cast<std::size_t>(part.rank())], c.rank());
        std::int32_t want = 0;
        for (int m : members)
          want += m + 1;
        all_reduce<algo::ring>(part, std::span(d.data(), n));
        all_reduce<algo::direct>(part, std::span(d.data(), n), op::max{});
        const auto got = download(d.data(), n, part.stream());
        EXPECT_EQ(got, std::vector<std::int32_t>(n, want)) << "rank " << c.rank();
      },
      test_options);
}

TEST(emulated, a_rank_may_lend_its_own_stream) {
  WEFT_REQUIRE_DEVICE();
  std::vector<cudaStream_t> streams(3);
  for (auto& s : streams)
    WEFT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  emu::run(
      3,
      [&](emu::communicator& c) {
        weft::cuda::device_buffer<float> d(100);
        upload(d.data(), std::vector<float>(100, static_cast<float>(c.rank())),
               c.stream()); // on the old stream
        const cudaStream_t mine = streams[static_cast<std::size_t>(c.rank())];
        c.set_stream(mine);
        EXPECT_EQ(c.stream(), mine);
        all_reduce<algo::direct>(c, std::span(d.data(), 100));
        EXPECT_EQ(download(d.data(), 100, mine), std::vector<float>(100, 3.0f));
      },
      test_options);
  for (auto s : streams)
    WEFT_CUDA_TRY(cudaStreamDestroy(s)); // borrowed: still valid after the run
}

} // namespace
