#pragma once
// A device layer's token ids (the embedding's): copied to device memory on the layer's stream
// without the host waiting for that stream, and grouped by id there with CUB.
//
//   weft::layer::detail::token_ids<weft::device_space> ids;
//   ids.upload(host_ids, s);        // queued on s; the host returns at once
//   lookup<<<..., s>>>(ids.data(), ...);
//   ids.group(vocab, s);            // sorted_ids(), positions(): the tokens grouped by id
//
// Upload. A copy from pageable host memory may wait for the stream before it starts (CUDA
// Runtime API, "API synchronization behavior": "If pageable memory must first be staged to
// pinned memory, the driver may synchronize with the stream"), so the ids go through a pinned
// stage of the object's own, copied from there asynchronously. The stage is reused: a new upload
// first waits for the previous one's copy to have left it, an event recorded a forward ago on
// the same stream, normally long complete; never for the work queued since.
//
// Grouping. cub::DeviceRadixSort::SortPairs sorts the ids with their token indices as values,
// over the bits that ids below the vocabulary use. It is stable (CUB's DeviceRadixSort
// documentation says so), so equal ids keep their token order, and its result (a permutation)
// does not depend on scheduling: the embedding's backward then adds each id's rows in token order
// (embedding_grad_run), as the host does.
#include <weft/core/error.hpp>
#include <weft/cuda/error.cuh>
#include <weft/cuda/kernels.cuh>
#include <weft/cuda/memory.cuh>
#include <weft/layer/cuda/matrix.cuh>
#include <weft/layer/matrix.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace weft::layer::detail {

template <class Space>
class token_ids;

/// The key bits the sort looks at: those of the largest id below vocab (at least one).
[[nodiscard]] constexpr int id_bits(std::size_t vocab) noexcept {
  return vocab <= 2 ? 1 : static_cast<int>(std::bit_width(vocab - 1));
}
static_assert(id_bits(1) == 1 && id_bits(2) == 1 && id_bits(3) == 2 && id_bits(4) == 2 &&
              id_bits(5) == 3 && id_bits(50257) == 16 && id_bits(65536) == 16 &&
              id_bits(65537) == 17 && id_bits(std::size_t{1} << 31) == 31);

/// p[i] = i: each token's index, the values the sort carries.
struct token_index {
  std::int32_t* p;
  __device__ void operator()(std::size_t i) const { p[i] = static_cast<std::int32_t>(i); }
};

template <>
class token_ids<device_space> {
public:
  token_ids() = default;
  token_ids(token_ids&& o) noexcept { *this = std::move(o); }
  token_ids& operator=(token_ids&& o) noexcept {
    if (this != &o) {
      drain();
      device_ = std::move(o.device_);
      order_ = std::move(o.order_);
      sorted_ = std::move(o.sorted_);
      positions_ = std::move(o.positions_);
      temp_ = std::move(o.temp_);
      stage_ = std::move(o.stage_);
      stage_size_ = std::exchange(o.stage_size_, 0);
      outgrown_ = std::move(o.outgrown_);
      staged_ = std::move(o.staged_);
      pending_ = std::exchange(o.pending_, false);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  token_ids(const token_ids&) = delete;
  token_ids& operator=(const token_ids&) = delete;
  ~token_ids() { drain(); }

  /// data() = ids, queued on s (see the header: the host does not wait for s).
  void upload(std::span<const std::int32_t> ids, cudaStream_t s) {
    const std::size_t n = ids.size();
    if (n > static_cast<std::size_t>(INT32_MAX)) {
      throw error("token_ids: " + std::to_string(n) +
                  " tokens exceed the int32 token indices the grouping sorts");
    }
    wait_for_stage();
    if (n > stage_size_) {
      // cudaFreeHost, like cudaFree, may wait for the whole device, where a rank sharing it may
      // be waiting in a kernel for this one: an outgrown stage is kept until the object goes.
      // Stages at least double, so there are few.
      const std::size_t size = std::max(n, 2 * stage_size_);
      void* p = nullptr;
      WEFT_CUDA_TRY(cudaMallocHost(&p, size * sizeof(std::int32_t)));
      if (stage_) outgrown_.push_back(std::move(stage_));
      stage_.reset(static_cast<std::int32_t*>(p));
      stage_size_ = size;
    }
    if (device_.cols() != n) device_.resize(1, n, s);
    n_ = n;
    if (n == 0) return;
    std::copy_n(ids.data(), n, stage_.get());
    WEFT_CUDA_TRY(cudaMemcpyAsync(device_.data(), stage_.get(), n * sizeof(std::int32_t),
                                  cudaMemcpyHostToDevice, s));
    if (!staged_) staged_.emplace();
    staged_->record(s);
    pending_ = true;
  }

  /// sorted_ids() = data() sorted stably, positions() = each one's token index, queued on s;
  /// every id is below vocab (the caller has checked).
  void group(std::size_t vocab, cudaStream_t s) {
    const std::size_t n = n_;
    if (order_.cols() != n) order_.resize(1, n, s);
    if (sorted_.cols() != n) sorted_.resize(1, n, s);
    if (positions_.cols() != n) positions_.resize(1, n, s);
    if (n == 0) return;
    cuda::detail::launch(token_index{order_.data()}, n, s);
    WEFT_EXPECTS(vocab > 0, "token_ids::group: the vocabulary must be non-empty");
    const int bits = id_bits(vocab);
    // Non-negative ids sort as unsigned (no sign bit to reorder).
    const auto* keys = reinterpret_cast<const std::uint32_t*>(device_.data());
    auto* sorted_keys = reinterpret_cast<std::uint32_t*>(sorted_.data());
    const int items = static_cast<int>(n);
    std::size_t bytes = 0;
    WEFT_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, sorted_keys, order_.data(),
                                                  positions_.data(), items, 0, bits, s));
    if (temp_.size() < bytes) temp_.resize(1, bytes, s);
    WEFT_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp_.data(), bytes, keys, sorted_keys,
                                                  order_.data(), positions_.data(), items, 0, bits,
                                                  s));
  }

  [[nodiscard]] const std::int32_t* data() const noexcept { return device_.data(); }
  [[nodiscard]] const std::int32_t* sorted_ids() const noexcept { return sorted_.data(); }
  [[nodiscard]] const std::int32_t* positions() const noexcept { return positions_.data(); }
  /// The ids uploaded (0 after release()).
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

  /// Gives the device memory back (freed after the work queued on its stream); the pinned stage
  /// stays for the next upload.
  void release() {
    device_ = {};
    order_ = {};
    sorted_ = {};
    positions_ = {};
    temp_ = {};
    n_ = 0;
  }

private:
  struct free_pinned {
    void operator()(std::int32_t* p) const noexcept { (void)cudaFreeHost(p); }
  };

  void wait_for_stage() {
    if (pending_ && staged_) WEFT_CUDA_TRY(cudaEventSynchronize(staged_->get()));
    pending_ = false;
  }
  // Before the stage goes: a copy may still be reading it (errors surface at the next call).
  void drain() noexcept {
    if (pending_ && staged_) (void)cudaEventSynchronize(staged_->get());
    pending_ = false;
  }

  matrix<std::int32_t, device_space> device_;    // 1 x n: the ids
  matrix<std::int32_t, device_space> order_;     // 1 x n: 0, 1, ..., n - 1
  matrix<std::int32_t, device_space> sorted_;    // 1 x n: the ids, sorted
  matrix<std::int32_t, device_space> positions_; // 1 x n: their token indices
  matrix<unsigned char, device_space> temp_;     // CUB's scratch
  std::unique_ptr<std::int32_t, free_pinned> stage_;
  std::size_t stage_size_ = 0;
  std::vector<std::unique_ptr<std::int32_t, free_pinned>> outgrown_; // kept: see upload
  std::optional<cuda::event> staged_; // recorded after the copy out of stage_
  bool pending_ = false;
  std::size_t n_ = 0;
};

} // namespace weft::layer::detail
