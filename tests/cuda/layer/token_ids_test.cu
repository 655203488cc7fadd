// token_ids<device_space> (include/weft/layer/cuda/token_ids.cuh): ids uploaded through the pinned
// stage and grouped by id with CUB's radix sort, against a host std::stable_sort of the token
// indices by id (equal ids in token order): small vocabularies and GPT-2's, repeats, a second
// upload of another size on the same object, and none. Skipped, with the reason, without a GPU.
#include <weft/cuda/memory.cuh>
#include <weft/layer/cuda/token_ids.cuh>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "support/cuda.cuh"

namespace {

using ids_t = weft::layer::detail::token_ids<weft::device_space>;

std::vector<std::int32_t> download(const std::int32_t* d, std::size_t n, cudaStream_t s) {
  std::vector<std::int32_t> h(n);
  if (n != 0) {
    WEFT_CUDA_TRY(
        cudaMemcpyAsync(h.data(), d, n * sizeof(std::int32_t), cudaMemcpyDeviceToHost, s));
  }
  WEFT_CUDA_TRY(cudaStreamSynchronize(s));
  return h;
}

void check(ids_t& t, const std::vector<std::int32_t>& ids, std::size_t vocab, cudaStream_t s) {
  t.upload(ids, s);
  t.group(vocab, s);
  const std::size_t n = ids.size();
  ASSERT_EQ(t.size(), n);
  std::vector<std::int32_t> positions(n);
  for (std::size_t i = 0; i < n; ++i)
    positions[i] = static_cast<std::int32_t>(i);
  std::stable_sort(positions.begin(), positions.end(), [&](std::int32_t a, std::int32_t b) {
    return ids[static_cast<std::size_t>(a)] < ids[static_cast<std::size_t>(b)];
  });
  std::vector<std::int32_t> sorted(n);
  for (std::size_t k = 0; k < n; ++k)
    sorted[k] = ids[static_cast<std::size_t>(positions[k])];
  EXPECT_EQ(download(t.data(), n, s), ids) << "vocab " << vocab;
  EXPECT_EQ(download(t.sorted_ids(), n, s), sorted) << "vocab " << vocab;
  EXPECT_EQ(download(t.positions(), n, s), positions) << "vocab " << vocab;
}

TEST(token_ids, group_by_id_stably_as_a_host_sort) {
  WEFT_REQUIRE_DEVICE();
  weft::cuda::stream s;
  ids_t t;
  check(t, {3, 0, 10, 3, 7, 5, 5, 5, 1, 9, 10, 2}, 11, s.get());
  check(t, {0, 0, 0}, 1, s.get());
  std::vector<std::int32_t> many(100'003);
  std::uint32_t x = 12345;
  for (auto& id : many) { // skewed: many repeats of small ids, some large ones
    x = x * 1664525u + 1013904223u;
    id = static_cast<std::int32_t>((x >> 8) % ((x & 1) != 0 ? 50257u : 97u));
  }
  check(t, many, 50257, s.get());
  check(t, {}, 50257, s.get());
  check(t, {1, 0}, 2, s.get());
}

} // namespace
