// weft's stream-ordered memory (weft/cuda/memory.cuh): one pool per device, made once, keeping
// freed memory (release threshold UINT64_MAX); stream_buffer allocates from it; the
// application's default pool keeps its own settings. Skips without a device.
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

} // namespace
