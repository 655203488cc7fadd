// weft::cuda::p2p: ranks that load from each other's workspaces. On one GPU every rank shares
// device 0; every collective of algo::direct is checked against the serial reference of
// tests/support/reference.hpp, bitwise identical across ranks where all hold the result. The
// host-only tests at the top (arguments, workspace and call layouts, plan checks) run
// everywhere; the others skip themselves where there is no device.
#include <weft/comm/algorithm/direct.hpp>
#include <weft/comm/algorithm/ring.hpp>
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/all_to_all.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/checked_calls.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/comm/traced.hpp>
#include <weft/cuda/p2p.cuh>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
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
namespace p2p = weft::cuda::p2p;
using namespace weft::test::device;
namespace wd = weft::cuda::detail;
using namespace std::chrono_literals;

// Up to 8 ranks' streams, a split's and the tests' own on one device: each must have a
// hardware queue of its own, or a rank's work can wait behind another's spinning sync
// (detail/p2p_sync.cuh), and no kernel may load late. Set before the first CUDA call, which
// comes after static init.
const bool shared_device_configured = [] {
  p2p::configure_shared_device();
  return true;
}();

static_assert(weft::communicator<p2p::communicator>);
static_assert(weft::plan_executor<p2p::communicator>);
static_assert(weft::peer_access<p2p::communicator>,
              "algo::direct must compile with the p2p transport");
// A traced or checked p2p communicator offers execute_whole as the bare one does, so
// weft::all_reduce through it reaches the fused kernels (detail/planned_path.hpp).
template <class C>
constexpr bool runs_whole = requires(C& c, const plan& pl, const float* in, float* out) {
  {
    c.execute_whole(pl, in, std::size_t{}, out, std::size_t{}, op::avg{}, "")
    } -> std::same_as<bool>;
};
static_assert(runs_whole<p2p::communicator> && runs_whole<weft::traced<p2p::communicator>> &&
              runs_whole<weft::checked_calls<p2p::communicator>>);

std::string failure_of(auto&& body) {
  try {
    body();
  } catch (const weft::error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

// --- host only ---------------------------------------------------------------------------

TEST(p2p_host, run_checks_its_arguments_before_looking_for_a_device) {
  ASSERT_TRUE(shared_device_configured);
  EXPECT_STREQ(std::getenv("CUDA_MODULE_LOADING"), "EAGER");
  bool started = false;
  const auto body = [&](p2p::communicator&) { started = true; };
  EXPECT_HAS(failure_of([&] { p2p::run({}, body); }), "device list is empty");
  EXPECT_HAS(failure_of([&] { p2p::run(std::vector<int>(65, 0), body); }), "at most 64");
  EXPECT_HAS(failure_of([&] { p2p::run({0, -1}, body); }), "rank 1 is given device -1");
  EXPECT_HAS(failure_of([&] { p2p::run({0}, body, {.workspace_bytes = 0}); }),
             "workspace_bytes is 0");
  EXPECT_HAS(failure_of([&] { p2p::run({0}, body, {.sync_timeout = 0ms}); }),
             "sync_timeout must be positive");
  EXPECT_HAS(failure_of([&] { p2p::run({0}, body, {.timeout = -1ms}); }),
             "timeout must be positive");
  EXPECT_FALSE(started);
}

// Without configure_shared_device()'s settings (lazy kernel loading, fewer hardware queues than
// ranks), ranks on one device can wait on each other's spinning syncs until the timeout; run()
// says so first. The settings are changed for the calls only (CUDA has read them already).
TEST(p2p_host, ranks_sharing_a_device_need_the_shared_device_settings) {
  ASSERT_TRUE(shared_device_configured);
  bool started = false;
  const auto body = [&](p2p::communicator&) { started = true; };
  const std::string loading = std::getenv("CUDA_MODULE_LOADING");
  ::setenv("CUDA_MODULE_LOADING", "LAZY", 1);
  const std::string lazy = failure_of([&] { p2p::run({0, 1, 0}, body); });
  ::setenv("CUDA_MODULE_LOADING", loading.c_str(), 1);
  EXPECT_HAS(lazy, "2 ranks share device 0");
  EXPECT_HAS(lazy, "CUDA_MODULE_LOADING=EAGER (it is LAZY)");
  EXPECT_HAS(lazy, "configure_shared_device()");
  const std::string connections = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "2", 1);
  const std::string few = failure_of([&] { p2p::run({0, 0, 0}, body); });
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", connections.c_str(), 1);
  EXPECT_HAS(few, "3 ranks share device 0");
  EXPECT_HAS(few, "CUDA_DEVICE_MAX_CONNECTIONS of at least the ranks (it is 2)");
  EXPECT_FALSE(started);
}

TEST(p2p_host, run_without_a_device_says_why_before_starting_ranks) {
  if (weft::cuda::device_count() > 0) GTEST_SKIP() << "a device is present";
  bool started = false;
  const auto msg = failure_of([&] {
    p2p::run({0, 0}, [&](p2p::communicator&) { started = true; });
  });
  EXPECT_HAS(msg, "cuda::p2p::run");
  EXPECT_HAS(msg, "no CUDA device");
  EXPECT_FALSE(started);
}

TEST(p2p_host, the_workspace_keeps_flags_counters_grid_words_three_staging_areas_then_data) {
  constexpr auto w = wd::p2p_lay_out_workspace(4, 1000);
  EXPECT_EQ(w.flags, 0u);
  EXPECT_EQ(w.counters, 256u);
  EXPECT_EQ(w.grid, 512u);
  EXPECT_EQ(w.staging, 768u);
  EXPECT_EQ(w.staging_stride, max_staged_scratch_bytes);
  EXPECT_EQ(w.data, 768u + 3 * max_staged_scratch_bytes);
  EXPECT_EQ(w.data_bytes, 1024u);
  EXPECT_EQ(w.total, w.data + 1024u);
  // 64 ranks' words take more than one line.
  EXPECT_EQ(wd::p2p_lay_out_workspace(64, 1).counters, 512u);
}

plan direct_plan(collective c, int p, int r, std::size_t count, int root = 0,
                 std::size_t element_size = 4) {
  return algo::direct::make_plan(plan_request{c, p, r, count, root, {}, element_size});
}

TEST(p2p_host, a_staged_all_reduce_runs_in_the_callers_buffers_and_a_staging_area) {
  const plan pl = direct_plan(collective::all_reduce, 4, 1, 100);
  ASSERT_TRUE(pl.staged());
  const std::size_t sizes[3] = {100, 100, pl.scratch_count()};
  const auto lay = wd::p2p_lay_out_call(pl, 1, 4, sizes, 4, 1 << 20, "all_reduce");
  EXPECT_TRUE(lay.staged);
  EXPECT_EQ(lay.bytes, 0u);
  EXPECT_EQ(lay.capacity[2], max_staged_scratch_bytes / 4);
  // It needs no data area at all: a workspace of one byte is enough.
  EXPECT_NO_THROW(wd::p2p_lay_out_call(pl, 1, 4, sizes, 4, 1, "all_reduce"));
}

TEST(p2p_host, other_plans_get_regions_sized_by_the_collective_the_same_on_every_rank) {
  {
    const plan pl = direct_plan(collective::all_reduce, 4, 2, 10000); // two-shot
    ASSERT_FALSE(pl.staged());
    const std::size_t sizes[3] = {10000, 10000, pl.scratch_count()};
    const auto lay = wd::p2p_lay_out_call(pl, 2, 4, sizes, 4, 1 << 20, "all_reduce");
    EXPECT_EQ(lay.offset[0], 0u);
    EXPECT_EQ(lay.offset[1], 40192u); // 40000 bytes, on a 256-byte boundary
    EXPECT_EQ(lay.offset[2], 80384u);
    EXPECT_EQ(lay.bytes, 80384u);
    EXPECT_EQ(lay.capacity[0], 10000u);
    EXPECT_EQ(lay.capacity[1], 10000u);
  }
  {
    // reduce: a rank other than the root passes no output; its region is there all the same.
    const plan root = direct_plan(collective::reduce, 3, 0, 50, 0);
    const plan other = direct_plan(collective::reduce, 3, 1, 50, 0);
    const std::size_t root_sizes[3] = {50, 50, 0};
    const std::size_t other_sizes[3] = {50, 0, 0};
    const auto a = wd::p2p_lay_out_call(root, 0, 3, root_sizes, 8, 1 << 20, "reduce");
    const auto b = wd::p2p_lay_out_call(other, 1, 3, other_sizes, 8, 1 << 20, "reduce");
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(a.offset[i], b.offset[i]) << i;
    EXPECT_EQ(a.bytes, b.bytes);
  }
  {
    // broadcast: input and output are one region.
    const plan pl = direct_plan(collective::broadcast, 3, 1, 10, 0);
    const std::size_t sizes[3] = {10, 10, 0};
    const auto lay = wd::p2p_lay_out_call(pl, 1, 3, sizes, 4, 1 << 20, "broadcast");
    EXPECT_EQ(lay.offset[0], lay.offset[1]);
    EXPECT_EQ(lay.region_bytes[0], 0u);
    EXPECT_EQ(lay.capacity[0], 10u);
    EXPECT_EQ(lay.bytes, 256u);
  }
  {
    // all_to_all: blocks of every rank in and out.
    const plan pl = direct_plan(collective::all_to_all, 4, 3, 64);
    const std::size_t sizes[3] = {256, 256, 0};
    const auto lay = wd::p2p_lay_out_call(pl, 3, 4, sizes, 2, 1 << 20, "all_to_all");
    EXPECT_EQ(lay.capacity[0], 256u);
    EXPECT_EQ(lay.capacity[1], 256u);
    EXPECT_EQ(lay.offset[1], 512u);
  }
}

TEST(p2p_host, a_call_too_large_for_the_workspace_names_the_sizes) {
  const plan pl = direct_plan(collective::all_gather, 2, 0, 1000);
  const std::size_t sizes[3] = {1000, 2000, 0};
  const auto msg =
      failure_of([&] { (void)wd::p2p_lay_out_call(pl, 0, 2, sizes, 4, 8192, "all_gather"); });
  EXPECT_HAS(msg, "all_gather on rank 0");
  EXPECT_HAS(msg, "needs 12288 bytes of workspace (input 4096, output 8192, scratch 0)");
  EXPECT_HAS(msg, "workspace has 8192");
  EXPECT_HAS(msg, "workspace_bytes");
  EXPECT_NO_THROW((void)wd::p2p_lay_out_call(pl, 0, 2, sizes, 4, 12288, "all_gather"));
}

// max_count: the largest call whose layout fits, found against p2p_lay_out_call itself (the call
// of max_count lays out, one more is refused unless its plan is staged), over every collective,
// world sizes that do and do not divide the counts, element sizes, and data areas below, at and
// above a region's alignment. For the all-reduce the test's own closed form: two regions of
// n elements, each rounded up to 256 bytes.
TEST(p2p_host, max_count_is_the_largest_call_that_fits_the_workspace) {
  const collective kinds[] = {collective::all_reduce, collective::reduce,
                              collective::broadcast,  collective::reduce_scatter,
                              collective::all_gather, collective::all_to_all};
  for (const collective c : kinds) {
    for (const int p : {1, 2, 3, 8}) {
      for (const std::size_t es :
           {std::size_t{1}, std::size_t{2}, std::size_t{4}, std::size_t{8}}) {
        for (const std::size_t data : {std::size_t{256}, std::size_t{1000}, std::size_t{65536 + 17},
                                       std::size_t{1} << 20, std::size_t{64} << 20}) {
          const std::size_t n = wd::p2p_max_count(c, p, es, data);
          const std::string what = std::string(name_of(c)) + " on " + std::to_string(p) +
                                   " ranks, " + std::to_string(es) + "-byte elements, " +
                                   std::to_string(data) + " bytes";
          if (c == collective::all_reduce || c == collective::reduce) {
            EXPECT_EQ(n, data / 2 / 256 * 256 / es) << what;
          }
          const auto lays_out = [&](std::size_t count) {
            const plan pl = direct_plan(c, p, 0, count, 0, es);
            const std::size_t sizes[3] = {test::input_count(c, p, count),
                                          test::output_count(c, p, count, 0, 0),
                                          pl.scratch_count()};
            try {
              (void)wd::p2p_lay_out_call(pl, 0, p, sizes, es, data, name_of(c));
              return true;
            } catch (const weft::error& e) {
              EXPECT_HAS(std::string(e.what()), "workspace_bytes");
              return false;
            }
          };
          EXPECT_TRUE(lays_out(n)) << what << ": " << n;
          if (!direct_plan(c, p, 0, n + 1, 0, es).staged()) {
            EXPECT_FALSE(lays_out(n + 1)) << what << ": " << n + 1;
          }
        }
      }
    }
  }
  // 64 MiB of float all-reduced on one rank (a one-GPU two_level) needs 128 MiB of regions: the
  // default workspace takes half of it in one call.
  EXPECT_EQ(wd::p2p_max_count(collective::all_reduce, 1, 4, p2p::options{}.workspace_bytes),
            std::size_t{8} << 20);
}

TEST(p2p_host, buffers_larger_than_the_collective_takes_are_refused) {
  const plan pl = direct_plan(collective::all_reduce, 2, 0, 10000);
  const std::size_t sizes[3] = {10001, 10000, 0};
  EXPECT_HAS(
      failure_of([&] { (void)wd::p2p_lay_out_call(pl, 0, 2, sizes, 4, 1 << 20, "all_reduce"); }),
      "input has 10001 elements, and all_reduce of 10000 on 2 ranks takes at most 10000");
}

TEST(p2p_host, message_steps_are_refused_with_what_to_use_instead) {
  const plan pl = algo::ring::make_plan(plan_request{collective::all_reduce, 4, 1, 1000, 0, {}, 4});
  const std::size_t sizes[3] = {1000, 1000, pl.scratch_count()};
  const auto msg =
      failure_of([&] { (void)wd::p2p_lay_out_call(pl, 1, 4, sizes, 4, 1 << 20, "all_reduce"); });
  EXPECT_HAS(msg, "all_reduce on rank 1 (peer");
  EXPECT_HAS(msg, "peer-access plans only");
  EXPECT_HAS(msg, "algo::direct");
}

TEST(p2p_host, plan_checks_name_the_operation_rank_and_peer) {
  const plan_request q{collective::all_reduce, 4, 1, 10, 0, {}, 4};
  const std::size_t sizes[3] = {10, 10, 0};
  const auto lay_out = [&](const plan& pl, const std::size_t(&s)[3]) {
    return failure_of([&] { (void)wd::p2p_lay_out_call(pl, 1, 4, s, 4, 1 << 20, "all_reduce"); });
  };
  {
    plan pl(q);
    pl.copy(buffer::input, 5, buffer::output, 0, 6); // [5, 11) of 10
    EXPECT_HAS(lay_out(pl, sizes), "[5, 11) of a buffer of 10");
  }
  {
    plan pl(q);
    pl.load(4, buffer::input, 0, buffer::output, 0, 1);
    EXPECT_HAS(lay_out(pl, sizes),
               "all_reduce on rank 1 (peer 4): peer outside the communicator of 4 ranks");
  }
  {
    plan pl(q);
    pl.load(2, buffer::input, 5, buffer::output, 0, 6); // a peer's input region holds 10
    EXPECT_HAS(lay_out(pl, sizes),
               "(peer 2): plan loads elements [5, 11) of a peer's input region of 10");
  }
  {
    plan pl(q);
    const int g = pl.add_group({0, 1, 0});
    pl.sync(g);
    EXPECT_HAS(lay_out(pl, sizes), "(peer 0): plan group 0 names this rank twice");
  }
  {
    plan pl(q);
    pl.sync(3);
    EXPECT_HAS(lay_out(pl, sizes), "names group 3 of 0");
  }
  {
    plan pl(q);
    pl.stage();
    pl.need_scratch(10);
    const int g = pl.add_group({0, 1, 2, 3});
    pl.sync(g);
    pl.load_reduce(g, buffer::input, 0, buffer::output, 0,
                   10); // staged, but not from the staging area
    const std::size_t with_scratch[3] = {10, 10, 10};
    EXPECT_HAS(lay_out(pl, with_scratch),
               "a staged plan may load only from its peers' staging area");
  }
  {
    plan pl(q);
    pl.stage();
    pl.need_scratch(max_staged_scratch_bytes / 4 + 1);
    const std::size_t big[3] = {10, 10, max_staged_scratch_bytes / 4 + 1};
    EXPECT_HAS(lay_out(pl, big),
               "a staged plan needs 16388 bytes of staging; the p2p transport has 16384");
  }
  {
    const plan other = direct_plan(collective::all_reduce, 4, 2, 10);
    EXPECT_HAS(lay_out(other, sizes), "the plan is for rank 2 of 4, not rank 1 of 4");
  }
}

// --- on the device -----------------------------------------------------------------------

const p2p::options test_options{.sync_timeout = 20s, .timeout = 60s};

std::vector<int> on_device_zero(int p) { return std::vector<int>(static_cast<std::size_t>(p), 0); }

template <collective C>
void sweep() {
  for (int p : {1, 2, 3, 4, 5, 8}) {
    shared_outputs shared(p);
    p2p::run(
        on_device_zero(p),
        [&](p2p::communicator& c) {
          rank_memory mem(c.stream());
          for (std::size_t count : counts_for(p))
            check_all_types<algo::direct, C, true>(c, mem, shared, count, p - 1);
          if constexpr (C == collective::broadcast || C == collective::reduce) {
            for (int root = 0; root < p - 1; ++root) {
              call_and_check<algo::direct, C, std::int32_t, op::sum>(c, mem, 7, root,
                                                                     test::pattern::exact, false);
            }
          }
          if constexpr (C ==
                        collective::all_reduce) { // a large two-shot call: many blocks per kernel
            call_and_check<algo::direct, C, float, op::sum>(c, mem, (std::size_t{1} << 20) + 3, 0,
                                                            test::pattern::random, false);
          }
        },
        test_options);
    if (::testing::Test::HasFailure()) return;
  }
}

// op::avg on half: eight ranks of 10000 sum past half's 65504, so each input is scaled by 1/8
// before the plan sums (the host path's rule): 10000 by the one-shot (a staged call, in the
// caller's buffer) and by the two-shot (through the workspace), where summing first gives inf.
TEST(p2p, half_average_scales_before_it_sums) {
  WEFT_REQUIRE_DEVICE();
  for (std::size_t n : {std::size_t{1000}, (std::size_t{1} << 16) + 3}) {
    p2p::run(
        on_device_zero(8),
        [&](p2p::communicator& c) {
          const cudaStream_t s = c.stream();
          weft::cuda::device_buffer<weft::half> a(n);
          upload(a.data(), std::vector<weft::half>(n, weft::half(10000.0f)), s);
          all_reduce<algo::direct>(c, std::span(a.data(), n), op::avg{});
          const auto got = download(a.data(), n, s);
          for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(got[i].bits(), weft::half(10000.0f).bits())
                << "n " << n << " rank " << c.rank() << " i " << i;
          }
        },
        test_options);
  }
}

TEST(p2p, all_reduce_matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<collective::all_reduce>();
}
TEST(p2p, reduce_scatter_matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<collective::reduce_scatter>();
}
TEST(p2p, all_gather_matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<collective::all_gather>();
}
TEST(p2p, broadcast_matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<collective::broadcast>();
}
TEST(p2p, reduce_matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<collective::reduce>();
}
TEST(p2p, all_to_all_matches_the_serial_reference) {
  WEFT_REQUIRE_DEVICE();
  sweep<collective::all_to_all>();
}

// --- stream ordering, graphs, failures, the communicator's own API -------------------------

// Calls queued back to back with no host synchronisation, a different rank held back before
// each, local kernels between them: a staging area reused while a peer reads it, or a
// workspace region overwritten early, shows as a wrong value. A host model gives the result.
TEST(p2p, back_to_back_calls_are_ordered_by_the_device_alone) {
  WEFT_REQUIRE_DEVICE();
  constexpr int calls = 24;
  for (int p : {2, 3, 4}) {
    for (std::size_t n : {std::size_t{1000}, std::size_t{5000}}) { // one-shot, and two-shot
      const auto model = back_to_back_model(p, n, calls, [](int k) { return k % 4 == 3; });
      p2p::run(
          on_device_zero(p),
          [&](p2p::communicator& c) {
            const cudaStream_t s = c.stream();
            weft::cuda::stream_buffer<std::int64_t> a(n, s), b(n, s);
            upload(a.data(), std::vector<std::int64_t>(n, 1), s);
            std::int64_t* x = a.data();
            std::int64_t* y = b.data();
            const unsigned blocks = static_cast<unsigned>((n + 255) / 256);
            for (int k = 0; k < calls; ++k) {
              if (c.rank() == k % p) spin<<<1, 1, 0, s>>>(200000); // about 0.1 ms behind the others
              add_pattern<<<blocks, 256, 0, s>>>(x, n, c.rank() + k);
              switch (k % 4) {
                case 1:
                  all_reduce<algo::direct>(c, std::span<const std::int64_t>(x, n), std::span(y, n));
                  std::swap(x, y);
                  break;
                case 3: broadcast<algo::direct>(c, std::span(x, n), k % p); break;
                default: all_reduce<algo::direct>(c, std::span(x, n)); break;
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

// The fused kernels against the plan step by step: direct's plan with one more sync at the end
// is no fused shape (detail::p2p_fused_shape_of), so execute() runs it kernel by kernel. Both,
// alternated on the same ranks (their epochs mix), give the same bits, with values whose float
// sum depends on the order; and op::avg through weft::all_reduce (fused: the division inside)
// equals the step-by-step sum divided by c.divide().
TEST(p2p, fused_and_step_by_step_all_reduces_give_the_same_bits_and_mix) {
  WEFT_REQUIRE_DEVICE();
  for (int p : {2, 3, 8}) {
    for (std::size_t n : {std::size_t{1001}, std::size_t{70001}}) { // one-shot, two-shot
      p2p::run(
          on_device_zero(p),
          [&](p2p::communicator& c) {
            const cudaStream_t s = c.stream();
            std::vector<float> mine(n);
            for (std::size_t i = 0; i < n; ++i)
              mine[i] = (c.rank() % 2 == 0 ? 1e8f : 1.0f) * static_cast<float>(c.rank() + 1) +
                        0.37f * static_cast<float>(i % 13);
            weft::cuda::device_buffer<float> in(n), fused(n), stepped(n), avg(n);
            upload(in.data(), mine, s);
            plan pl = algo::direct::make_plan(
                plan_request{collective::all_reduce, p, c.rank(), n, 0, {}, sizeof(float)});
            ASSERT_NE(wd::p2p_fused_shape_of(pl, p), wd::p2p_fused_shape::none);
            pl.sync(0); // group 0 is everyone in direct's plans
            ASSERT_EQ(wd::p2p_fused_shape_of(pl, p), wd::p2p_fused_shape::none);
            for (int round = 0; round < 3; ++round) {
              all_reduce<algo::direct>(c, std::span<const float>(in.data(), n),
                                       std::span(fused.data(), n));
              c.execute(pl, in.data(), n, stepped.data(), n, op::sum{}, "all_reduce");
            }
            all_reduce<algo::direct>(c, std::span<const float>(in.data(), n),
                                     std::span(avg.data(), n), op::avg{});
            c.divide(stepped.data(), n); // the step-by-step path's last step of avg
            const auto a = download(fused.data(), n, s);
            const auto b = download(stepped.data(), n, s);
            const auto v = download(avg.data(), n, s);
            c.execute(pl, in.data(), n, stepped.data(), n, op::sum{}, "all_reduce");
            const auto sum = download(stepped.data(), n, s);
            for (std::size_t i = 0; i < n; ++i) {
              ASSERT_EQ(std::memcmp(&a[i], &sum[i], sizeof(float)), 0)
                  << "p " << p << " n " << n << " rank " << c.rank() << " i " << i;
              ASSERT_EQ(std::memcmp(&v[i], &b[i], sizeof(float)), 0)
                  << "avg: p " << p << " n " << n << " rank " << c.rank() << " i " << i;
            }
          },
          test_options);
    }
  }
}

// A captured all-reduce replayed again and again, direct calls between the replays: in place
// on int64, so every call multiplies the (by then equal) values by p, exactly.
TEST(p2p, an_all_reduce_captured_in_a_cuda_graph_replays_right) {
  WEFT_REQUIRE_DEVICE();
  constexpr int replays = 6;
  for (int p : {2, 3, 5}) {
    for (std::size_t n : {std::size_t{1000}, std::size_t{5000}}) { // staged, and two-shot
      p2p::run(
          on_device_zero(p),
          [&](p2p::communicator& c) {
            const cudaStream_t s = c.stream();
            weft::cuda::stream_buffer<std::int64_t> x(n, s);
            std::vector<std::int64_t> start(n);
            for (std::size_t i = 0; i < n; ++i)
              start[i] = (c.rank() + 1) * static_cast<std::int64_t>(i % 3 + 1);
            upload(x.data(), start, s);
            const std::span<std::int64_t> data(x.data(), n);
            all_reduce<algo::direct>(
                c, data); // outside the graph first: nothing is made during capture
            cudaGraph_t graph = nullptr;
            WEFT_CUDA_TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            all_reduce<algo::direct>(c, data);
            WEFT_CUDA_TRY(cudaStreamEndCapture(s, &graph));
            cudaGraphExec_t exec = nullptr;
            WEFT_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
            int calls = 1;
            for (int k = 0; k < replays; ++k) {
              WEFT_CUDA_TRY(cudaGraphLaunch(exec, s));
              ++calls;
              if (k % 2 == 1) {
                all_reduce<algo::direct>(c, data);
                ++calls;
              }
            }
            const auto got = download(x.data(), n, s);
            std::int64_t scale = static_cast<std::int64_t>(p) * (p + 1) / 2;
            for (int k = 1; k < calls; ++k)
              scale *= p;
            std::vector<std::int64_t> want(n);
            for (std::size_t i = 0; i < n; ++i)
              want[i] = scale * static_cast<std::int64_t>(i % 3 + 1);
            const std::string diff = test::compare(got, want, true, 0);
            EXPECT_TRUE(diff.empty())
                << "p=" << p << " n=" << n << " rank " << c.rank() << ": " << diff;
            WEFT_CUDA_TRY(cudaGraphExecDestroy(exec));
            WEFT_CUDA_TRY(cudaGraphDestroy(graph));
          },
          test_options);
    }
  }
}

TEST(p2p, a_call_too_large_for_the_workspace_is_refused_and_leaves_the_stream_usable) {
  WEFT_REQUIRE_DEVICE();
  std::vector<std::string> seen(2);
  p2p::run(on_device_zero(2),
           [&](p2p::communicator& c) {
             constexpr std::size_t big = std::size_t{1} << 18; // 1 MiB of floats in, 1 MiB out
             weft::cuda::stream_buffer<float> x(big, c.stream());
             EXPECT_EQ(c.workspace_bytes(), std::size_t{256} << 10);
             seen[static_cast<std::size_t>(c.rank())] =
                 failure_of([&] { all_reduce<algo::direct>(c, std::span(x.data(), big)); });
             constexpr std::size_t n = 20000; // 160 KiB in all: fits
             upload(x.data(), std::vector<float>(n, static_cast<float>(c.rank() + 1)), c.stream());
             all_reduce<algo::direct>(c, std::span(x.data(), n));
             EXPECT_EQ(download(x.data(), n, c.stream()), std::vector<float>(n, 3.0f));
           },
           {.workspace_bytes = std::size_t{256} << 10, .sync_timeout = 20s});
  for (int r = 0; r < 2; ++r) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_HAS(m, "all_reduce on rank " + std::to_string(r));
    EXPECT_HAS(m, "needs 2097152 bytes of workspace");
    EXPECT_HAS(m, "workspace has 262144");
  }
}

TEST(p2p, a_rank_that_never_reaches_a_barrier_is_named_not_waited_for) {
  WEFT_REQUIRE_DEVICE();
  std::vector<std::string> seen(3);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(p2p::run(on_device_zero(3),
                        [&](p2p::communicator& c) {
                          if (c.rank() == 2) return; // leaves without joining
                          try {
                            c.barrier();
                          } catch (const error& e) {
                            seen[static_cast<std::size_t>(c.rank())] = e.what();
                            throw;
                          }
                        },
                        {.sync_timeout = 300ms}),
               error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (int r = 0; r < 2; ++r) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_HAS(m, "barrier on rank " + std::to_string(r) + " (peer 2)");
    EXPECT_HAS(m, "timed out after 300 ms");
  }
}

TEST(p2p, a_sync_timeout_inside_a_call_names_the_call_when_the_host_looks) {
  WEFT_REQUIRE_DEVICE();
  std::vector<std::string> seen(3);
  std::vector<weft::cuda::device_buffer<float>>
      bufs; // outside the run, as a failing caller's should be
  for (int r = 0; r < 3; ++r)
    bufs.emplace_back(100);
  EXPECT_THROW(p2p::run(on_device_zero(3),
                        [&](p2p::communicator& c) {
                          if (c.rank() == 1) return;
                          float* x = bufs[static_cast<std::size_t>(c.rank())].data();
                          all_reduce<algo::direct>(c, std::span(x, 100)); // queued: returns at once
                          try {
                            c.synchronize();
                          } catch (const error& e) {
                            seen[static_cast<std::size_t>(c.rank())] = e.what();
                            throw;
                          }
                        },
                        {.sync_timeout = 300ms}),
               error);
  for (int r : {0, 2}) {
    const auto& m = seen[static_cast<std::size_t>(r)];
    EXPECT_HAS(m, "all_reduce on rank " + std::to_string(r) + " (peer 1)");
    EXPECT_HAS(m, "found by synchronize");
  }
}

// The epochs a timed-out sync leaves half-advanced are abandoned (detail/p2p_epoch.hpp): rank 0
// gives up on rank 1 at a barrier; rank 1, arriving afterwards, fails instead of passing on
// rank 0's stale flag. Rank 0's later calls throw its first error at once.
TEST(p2p, a_late_peer_finds_the_timed_out_epoch_abandoned_and_later_calls_throw_at_once) {
  WEFT_REQUIRE_DEVICE();
  std::vector<std::string> seen(2);
  std::string later;
  std::chrono::steady_clock::duration later_took{};
  std::atomic<bool> rank0_failed{false};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(
      p2p::run(on_device_zero(2),
               [&](p2p::communicator& c) {
                 if (c.rank() == 1) { // arrives only once rank 0 has given up
                   while (!rank0_failed.load() && std::chrono::steady_clock::now() - start < 20s)
                     std::this_thread::sleep_for(1ms);
                 }
                 try {
                   c.barrier();
                 } catch (const error& e) {
                   seen[static_cast<std::size_t>(c.rank())] = e.what();
                 }
                 if (c.rank() != 0) return;
                 rank0_failed.store(true);
                 EXPECT_TRUE(c.failed());
                 const auto t = std::chrono::steady_clock::now();
                 later = failure_of([&] { c.barrier(); });
                 weft::cuda::stream_buffer<float> d(16, c.stream());
                 EXPECT_HAS(
                     failure_of([&] { all_reduce<algo::direct>(c, std::span(d.data(), 16)); }),
                     seen[0]);
                 EXPECT_HAS(failure_of([&] { (void)c.split(0, 0); }), seen[0]);
                 EXPECT_HAS(failure_of([&] { c.check(); }), seen[0]);
                 later_took = std::chrono::steady_clock::now() - t;
               },
               {.sync_timeout = 300ms, .timeout = 20s}),
      error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s);
  EXPECT_HAS(seen[0], "barrier on rank 0 (peer 1)");
  EXPECT_HAS(seen[0], "timed out after 300 ms");
  EXPECT_HAS(seen[1], "barrier on rank 1 (peer 0)");
  EXPECT_HAS(seen[1], "gave up on a sync with this one");
  EXPECT_HAS(later, "barrier on rank 0");
  EXPECT_HAS(later, "failed earlier");
  EXPECT_HAS(later, seen[0]);
  EXPECT_LT(later_took, 100ms) << "not at once";
}

// A split shares its parent's failure: a call on either after the other failed throws at once.
TEST(p2p, a_split_fails_with_its_parent) {
  WEFT_REQUIRE_DEVICE();
  std::vector<std::string> seen(2);
  EXPECT_THROW(p2p::run(on_device_zero(2),
                        [&](p2p::communicator& c) {
                          auto child = c.split(0, c.rank());
                          if (c.rank() == 1) return; // leaves: rank 0's barrier times out
                          const std::string first = failure_of([&] { c.barrier(); });
                          EXPECT_HAS(first, "timed out after 300 ms");
                          EXPECT_TRUE(child.failed());
                          seen[0] = failure_of([&] { child.barrier(); });
                          EXPECT_HAS(seen[0], first);
                        },
                        {.sync_timeout = 300ms, .timeout = 20s}),
               error);
  EXPECT_HAS(seen[0], "barrier on rank 0");
}

TEST(p2p, split_gives_communicators_with_workspaces_and_streams_of_their_own) {
  WEFT_REQUIRE_DEVICE();
  p2p::run(
      on_device_zero(5),
      [](p2p::communicator& c) {
        constexpr std::size_t n = 6000; // 24000 bytes: two-shot
        weft::cuda::stream_buffer<std::int32_t> d(n, c.stream());
        // Queued on the parent's stream before the split: the half's stream starts after it.
        upload(d.data(), std::vector<std::int32_t>(n, c.rank() + 1), c.stream());
        p2p::communicator half =
            c.split(c.rank() % 2, -c.rank()); // reversed order within each half
        EXPECT_NE(half.stream(), c.stream());
        EXPECT_EQ(half.device(), c.device());
        const std::vector<int> members =
            c.rank() % 2 == 0 ? std::vector<int>{4, 2, 0} : std::vector<int>{3, 1};
        ASSERT_EQ(half.size(), static_cast<int>(members.size()));
        EXPECT_EQ(members[static_cast<std::size_t>(half.rank())], c.rank());
        std::int32_t want = 0;
        for (int m : members)
          want += m + 1;
        all_reduce<algo::direct>(half, std::span(d.data(), n));
        all_reduce<algo::direct>(half, std::span(d.data(), 100), op::max{}); // staged
        half.barrier();
        EXPECT_EQ(download(d.data(), n, half.stream()), std::vector<std::int32_t>(n, want))
            << "rank " << c.rank();
        // The parent still works (the download above left the half's stream idle).
        all_reduce<algo::direct>(c, std::span(d.data(), 10));
        std::int32_t total = 0;
        for (int r = 0; r < 5; ++r)
          total += r % 2 == 0 ? 9 : 6; // each rank holds its half's sum
        EXPECT_EQ(download(d.data(), 10, c.stream()), std::vector<std::int32_t>(10, total));
      },
      test_options);
}

TEST(p2p, a_rank_may_lend_its_own_stream) {
  WEFT_REQUIRE_DEVICE();
  std::vector<cudaStream_t> streams(3);
  for (auto& s : streams)
    WEFT_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  p2p::run(on_device_zero(3), [&](p2p::communicator& c) {
    weft::cuda::stream_buffer<float> d(100, c.stream());
    upload(d.data(), std::vector<float>(100, static_cast<float>(c.rank())),
           c.stream()); // on the old stream
    const cudaStream_t mine = streams[static_cast<std::size_t>(c.rank())];
    c.set_stream(mine);
    EXPECT_EQ(c.stream(), mine);
    all_reduce<algo::direct>(c, std::span(d.data(), 100));
    EXPECT_EQ(download(d.data(), 100, mine), std::vector<float>(100, 3.0f));
    d.release(mine); // the stream it was allocated on went with set_stream
  });
  for (auto s : streams)
    WEFT_CUDA_TRY(cudaStreamDestroy(s)); // borrowed: still valid after the run
}

TEST(p2p, the_call_check_runs_over_the_host_mailbox) {
  WEFT_REQUIRE_DEVICE();
  struct restore {
    ~restore() { check_calls(false); }
  } guard;
  check_calls(true);
  std::vector<std::string> seen(3);
  EXPECT_THROW(p2p::run(
                   on_device_zero(3),
                   [&](p2p::communicator& c) {
                     weft::cuda::stream_buffer<float> d(16, c.stream());
                     try {
                       broadcast<algo::direct>(c, std::span(d.data(), 16), c.rank() == 1 ? 1 : 0);
                     } catch (const error& e) {
                       seen[static_cast<std::size_t>(c.rank())] = e.what();
                       throw;
                     }
                   },
                   test_options),
               error);
  for (const auto& m : seen)
    EXPECT_HAS(m, "rank 1 differs from rank 0 in root");
}

TEST(p2p, host_memory_is_refused_before_anything_is_queued) {
  WEFT_REQUIRE_DEVICE();
  p2p::run(on_device_zero(2), [](p2p::communicator& c) {
    std::vector<float> host(10, 1.0f);
    EXPECT_HAS(failure_of([&] { all_reduce<algo::direct>(c, std::span(host)); }), "is host memory");
    c.barrier(); // both refused the same call: still in step
  });
}

// Ranks on distinct devices, with peer access between them, where the machine has several.
TEST(p2p, ranks_on_distinct_devices_load_over_peer_access) {
  WEFT_REQUIRE_DEVICE();
  if (weft::cuda::device_count() < 2) GTEST_SKIP() << "one device";
  int can = 0;
  WEFT_CUDA_TRY(cudaDeviceCanAccessPeer(&can, 0, 1));
  if (can == 0) GTEST_SKIP() << "devices 0 and 1 have no peer access";
  for (const std::vector<int>& devices : {std::vector<int>{0, 1}, std::vector<int>{0, 1, 1, 0}}) {
    const int p = static_cast<int>(devices.size());
    shared_outputs shared(p);
    p2p::run(
        devices,
        [&](p2p::communicator& c) {
          rank_memory mem(c.stream());
          for (std::size_t count : counts_for(p))
            check_all_types<algo::direct, collective::all_reduce, true>(c, mem, shared, count, 0);
          check_all_types<algo::direct, collective::all_gather, true>(c, mem, shared, 3001, 0);
        },
        test_options);
  }
}

} // namespace
