#pragma once
// Device scratch that grows in the order of one stream: the NCCL communicator
// (weft/cuda/nccl.cuh) keeps its plans' scratch and temporaries, and its staging for the
// blocking calls, in these. A larger block is allocated with cudaMallocAsync and the old one
// freed with cudaFreeAsync on the same stream, so the old block goes only after the work
// already queued (which may still use it) and the host never waits. Inside a CUDA graph
// capture it cannot grow: the graph would free memory it did not allocate.
#include <weft/core/error.hpp>
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/memory.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace weft::cuda::detail {

/// Device memory used by the work of one stream, allocated and freed in that stream's order.
/// It keeps the stream alive until the memory is released.
class stream_memory {
public:
  explicit stream_memory(std::shared_ptr<const stream> s) : stream_(std::move(s)) {}
  stream_memory(stream_memory&& o) noexcept
      : stream_(std::move(o.stream_)),
        p_(std::exchange(o.p_, nullptr)),
        n_(std::exchange(o.n_, 0)) {}
  stream_memory& operator=(stream_memory&& o) noexcept {
    if (this != &o) {
      release();
      stream_ = std::move(o.stream_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  stream_memory(const stream_memory&) = delete;
  stream_memory& operator=(const stream_memory&) = delete;
  ~stream_memory() { release(); }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }

  /// At least `bytes` for work queued from now on (contents unspecified). The device whose
  /// memory it is must be current.
  std::byte* reserve(std::size_t bytes, std::string_view operation, int rank) {
    if (bytes <= n_) return p_;
    if (capturing(stream_->get())) {
      throw error(operation, rank, error::unknown,
                  "needs " + std::to_string(bytes) + " bytes of device scratch and has " +
                      std::to_string(n_) +
                      ", and its stream is being captured into a CUDA graph, where weft cannot "
                      "allocate: run the "
                      "call once before capturing it, or reserve() the scratch first");
    }
    constexpr std::size_t granule = std::size_t{64}
                                    << 10; // fewer regrowths for slowly rising sizes
    const std::size_t want = (bytes + granule - 1) / granule * granule;
    // NCCL between GPUs of one process writes straight into a peer's receive buffer, and pool
    // memory is reachable from other devices only once the pool grants them access.
    share_default_pool(stream_device(stream_->get()));
    void* p = nullptr;
    cuda_check(cudaMallocAsync(&p, want, stream_->get()), "cudaMallocAsync", operation, rank);
    release(); // stream-ordered: after the queued work that may still use the old block
    p_ = static_cast<std::byte*>(p);
    n_ = want;
    return p_;
  }

private:
  void release() noexcept {
    if (p_ != nullptr) (void)cudaFreeAsync(p_, stream_->get());
    p_ = nullptr;
    n_ = 0;
  }

  std::shared_ptr<const stream> stream_;
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

} // namespace weft::cuda::detail
