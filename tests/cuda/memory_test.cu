// weft's stream-ordered memory (weft/cuda/memory.cuh): one pool per device, made once, keeping
// freed memory (release threshold UINT64_MAX unless the user sets one); stream_buffer allocates
// from it; the application's default pool keeps its own settings unless it opts in
// (share_default_pool). The device checks skip without a device.
#include <weft/cuda/memory.cuh>

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "support/cuda.cuh"

namespace {

std::uint64_t attribute(cudaMemPool_t pool, cudaMemPoolAttr a) {
  std::uint64_t v = 0;
  WEFT_CUDA_TRY(cudaMemPoolGetAttribute(pool, a, &v));
  return v;
}

TEST(cuda_memory, weft_keeps_its_own_pool_and_leaves_the_default_one_alone) {
  WEFT_REQUIRE_DEVICE();
  int device = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&device));
  cudaMemPool_t fallback{};
  WEFT_CUDA_TRY(cudaDeviceGetDefaultMemPool(&fallback, device));
  const std::uint64_t default_threshold = attribute(fallback, cudaMemPoolAttrReleaseThreshold);

  const cudaMemPool_t pool = weft::cuda::memory_pool(device);
  EXPECT_EQ(weft::cuda::memory_pool(device), pool) << "made once per device";
  EXPECT_NE(pool, fallback);
  EXPECT_EQ(attribute(pool, cudaMemPoolAttrReleaseThreshold),
            std::numeric_limits<std::uint64_t>::max());

  weft::cuda::stream s;
  const std::uint64_t before = attribute(pool, cudaMemPoolAttrUsedMemCurrent);
  {
    weft::cuda::stream_buffer<float> b(std::size_t{1} << 20, s.get());
    s.synchronize();
    EXPECT_GE(attribute(pool, cudaMemPoolAttrUsedMemCurrent), before + (std::uint64_t{4} << 20))
        << "stream_buffer allocates from weft's pool";
  }
  s.synchronize();
  // Freed, but kept by the pool for the next allocation.
  EXPECT_GE(attribute(pool, cudaMemPoolAttrReservedMemCurrent), std::uint64_t{4} << 20);
  EXPECT_EQ(attribute(fallback, cudaMemPoolAttrReleaseThreshold), default_threshold);
}

// The release threshold is the user's: kept everything by default, set for the pools made so
// far and later; trimming where weft made no pool calls nothing. Runs without a device.
TEST(cuda_memory, the_pools_release_threshold_is_a_setting_with_keep_everything_as_default) {
  EXPECT_EQ(weft::cuda::pool_release_threshold(), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(weft::cuda::default_pool_release_threshold, std::numeric_limits<std::uint64_t>::max());
  weft::cuda::set_pool_release_threshold(std::uint64_t{3} << 20);
  EXPECT_EQ(weft::cuda::pool_release_threshold(), std::uint64_t{3} << 20);
  if (weft::cuda::device_count() > 0) {
    int device = 0;
    WEFT_CUDA_TRY(cudaGetDevice(&device));
    const cudaMemPool_t pool = weft::cuda::memory_pool(device);
    EXPECT_EQ(attribute(pool, cudaMemPoolAttrReleaseThreshold), std::uint64_t{3} << 20);
    weft::cuda::set_pool_release_threshold(0);
    EXPECT_EQ(attribute(pool, cudaMemPoolAttrReleaseThreshold), 0u) << "a pool made before";
    weft::cuda::stream s;
    { weft::cuda::stream_buffer<float> b(std::size_t{1} << 20, s.get()); }
    s.synchronize();
    weft::cuda::trim_pools();
    EXPECT_EQ(attribute(pool, cudaMemPoolAttrReservedMemCurrent), 0u)
        << "threshold 0 and a trim give everything unused back";
  } else {
    weft::cuda::trim_pools(); // no pool: nothing to call
  }
  weft::cuda::set_pool_release_threshold(weft::cuda::default_pool_release_threshold);
  EXPECT_EQ(weft::cuda::pool_release_threshold(), std::numeric_limits<std::uint64_t>::max());
}

// The opt-in for NCCL across the GPUs of one process on cudaMallocAsync buffers: every device
// that can reach this one may then read and write its default pool; calling twice is harmless.
TEST(cuda_memory, share_default_pool_opens_the_default_pool_to_every_peer_that_can_reach_it) {
  WEFT_REQUIRE_DEVICE();
  int device = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&device));
  weft::cuda::share_default_pool(device);
  weft::cuda::share_default_pool(device);
  cudaMemPool_t fallback{};
  WEFT_CUDA_TRY(cudaDeviceGetDefaultMemPool(&fallback, device));
  for (int peer = 0; peer < weft::cuda::device_count(); ++peer) {
    if (peer == device) continue;
    int can = 0;
    WEFT_CUDA_TRY(cudaDeviceCanAccessPeer(&can, peer, device));
    cudaMemLocation where{};
    where.type = cudaMemLocationTypeDevice;
    where.id = peer;
    cudaMemAccessFlags flags{};
    WEFT_CUDA_TRY(cudaMemPoolGetAccess(&flags, fallback, &where));
    EXPECT_EQ(flags, can != 0 ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone)
        << "device " << peer;
  }
}

} // namespace
