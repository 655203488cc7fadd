// weft::cuda::async_communicator on one GPU: collectives on a side stream that start after
// the main stream's work, give the serial reference's sums, and finish while the main stream
// is still busy; NCCL's split_with_stream gives the side a stream of its own.
#include <weft/comm/algorithm/ring.hpp>
#include <weft/cuda/async.cuh>
#include <weft/cuda/emulated.cuh>
#include <weft/cuda/nccl.cuh>
#include <weft/cuda/p2p.cuh>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "support/cuda.cuh"
#include "support/device_collectives.cuh"

namespace {

using namespace weft;
namespace emu = weft::cuda::emulated;
using namespace weft::test::device;

// The main and side streams of every rank share one device, and a test below needs the side
// stream's work to run while a main stream spins: each stream needs a hardware queue of its own
// (some images set CUDA_DEVICE_MAX_CONNECTIONS=1). Set before the first CUDA call.
const bool shared_device_configured = [] {
  weft::cuda::p2p::configure_shared_device();
  return true;
}();

// Overwrites x with v, after holding the stream back: the side stream must wait for it.
__global__ void late_fill(std::int64_t* x, std::size_t n, std::int64_t v, long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x)
    x[i] = v + static_cast<std::int64_t>(i);
}

TEST(cuda_async, side_stream_collectives_start_after_the_main_streams_work) {
  WEFT_REQUIRE_DEVICE();
  const int p = 3;
  const std::size_t n = 4099;
  emu::run(p, [&](emu::communicator& c) {
    weft::cuda::async_communicator ac(c);
    EXPECT_NE(ac.side_stream(), ac.stream());
    weft::cuda::device_buffer<std::int64_t> a(n), b(p * n);
    // Written late on the main stream: a call queued right after must see these values.
    late_fill<<<1, 256, 0, c.stream()>>>(a.data(), n, 1000 * (c.rank() + 1), 20'000'000);
    auto w1 = weft::cuda::all_reduce_async<algo::ring>(ac, std::span(a.data(), n));
    auto w2 = weft::cuda::all_gather_async(ac, std::span<const std::int64_t>(a.data(), n),
                                           std::span(b.data(), p * n));
    w2.wait(c.stream());
    const auto sum = download(a.data(), n, c.stream());
    const auto gathered = download(b.data(), p * n, c.stream());
    EXPECT_TRUE(w1.done());
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t want = 1000 * (1 + 2 + 3) + p * static_cast<std::int64_t>(i);
      ASSERT_EQ(sum[i], want) << "element " << i;
      for (int r = 0; r < p; ++r)
        ASSERT_EQ(gathered[r * n + i], want) << "rank " << r << ", element " << i;
    }
  });
}

TEST(cuda_async, the_work_finishes_while_the_main_stream_is_busy) {
  WEFT_REQUIRE_DEVICE();
  emu::run(2, [&](emu::communicator& c) {
    weft::cuda::async_communicator ac(c);
    weft::cuda::device_buffer<float> g(1 << 20);
    WEFT_CUDA_TRY(cudaMemsetAsync(g.data(), 0, g.size() * sizeof(float), c.stream()));
    auto w = weft::cuda::all_reduce_async(ac, std::span(g.data(), g.size()));
    // More "backward" on the main stream: about a second of it.
    late_fill<<<1, 1, 0, c.stream()>>>(nullptr, 0, 0, 2'000'000'000);
    w.wait(); // the host waits for the side stream only
    // Its polls saw "not ready" and left no error behind for the next launch's check.
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
    EXPECT_EQ(cudaStreamQuery(c.stream()), cudaErrorNotReady)
        << "the side stream waited for the main stream's later work";
    (void)cudaGetLastError();
    WEFT_CUDA_TRY(cudaStreamSynchronize(c.stream()));
  });
}

TEST(cuda_async, nccl_splits_a_side_stream_of_its_own) {
  WEFT_REQUIRE_DEVICE();
  auto all = weft::cuda::nccl::communicator::init_all({0});
  auto& c = all.front();
  weft::cuda::async_communicator ac(c);
  EXPECT_NE(ac.side_stream(), c.stream());
  EXPECT_NE(c.split(0, 0).stream(), ac.side_stream());
  weft::cuda::device_buffer<std::int64_t> a(1000);
  late_fill<<<1, 256, 0, c.stream()>>>(a.data(), 1000, 7, 10'000'000);
  auto w = weft::cuda::all_reduce_async<algo::vendor>(ac, std::span(a.data(), 1000));
  w.wait(c.stream());
  const auto back = download(a.data(), 1000, c.stream());
  for (std::size_t i = 0; i < back.size(); ++i)
    ASSERT_EQ(back[i], 7 + static_cast<std::int64_t>(i));
}

} // namespace
