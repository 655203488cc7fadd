#pragma once
// Device scratch that grows in the order of one stream: the NCCL communicator
// (weft/cuda/nccl.cuh) keeps its plans' scratch and temporaries, and its staging for the
// blocking calls, in these. A larger block is allocated from weft's pool
// (cudaMallocFromPoolAsync, cuda/memory.cuh) and the old one
// freed with cudaFreeAsync on the same stream, so the old block goes only after the work
// already queued (which may still use it) and the host never waits; but a block that a call
// captured into a CUDA graph used is kept (the graph points into it) until release_retired() or
// the end. Inside a capture it cannot grow: the graph would free memory it did not allocate.
#include <weft/core/error.hpp>
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/detail/scratch_ledger.hpp>
#include <weft/cuda/memory.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace weft::cuda::detail {

/// Device memory used by the work of one stream, allocated and freed in that stream's order.
/// It keeps the stream alive until the memory is released. A block that a captured call used is
/// retired rather than freed when the memory grows (scratch_ledger), and freed by
/// release_retired() or when this goes: the graph still points into it.
class stream_memory {
public:
  explicit stream_memory(std::shared_ptr<const stream> s) : stream_(std::move(s)) {}
  stream_memory(stream_memory&& o) noexcept
      : stream_(std::move(o.stream_)), ledger_(std::exchange(o.ledger_, {})) {}
  stream_memory& operator=(stream_memory&& o) noexcept {
    if (this != &o) {
      release();
      stream_ = std::move(o.stream_);
      ledger_ = std::exchange(o.ledger_, {});
    }
    return *this;
  }
  stream_memory(const stream_memory&) = delete;
  stream_memory& operator=(const stream_memory&) = delete;
  ~stream_memory() { release(); }

  [[nodiscard]] std::size_t size() const noexcept { return ledger_.current().bytes; }
  /// Bytes of superseded blocks kept for graphs that captured calls using them.
  [[nodiscard]] std::size_t retired_bytes() const noexcept { return ledger_.retired_bytes(); }

  /// At least `bytes` for work queued from now on (contents unspecified). The device whose
  /// memory it is must be current.
  std::byte* reserve(std::size_t bytes, std::string_view operation, int rank) {
    const bool in_capture = capturing(stream_->get());
    if (ledger_.fits(bytes, in_capture)) return static_cast<std::byte*>(ledger_.current().p);
    if (in_capture) {
      throw error(operation, rank, error::unknown,
                  "needs " + std::to_string(bytes) + " bytes of device scratch and has " +
                      std::to_string(size()) +
                      ", and its stream is being captured into a CUDA graph, where weft cannot "
                      "allocate: run the "
                      "call once before capturing it, or reserve() the scratch first");
    }
    constexpr std::size_t granule = std::size_t{64}
                                    << 10; // fewer regrowths for slowly rising sizes
    const std::size_t want = (bytes + granule - 1) / granule * granule;
    void* p = nullptr;
    // From weft's pool, which the devices that reach this one may access: NCCL between GPUs of
    // one process writes straight into a peer's receive buffer.
    cuda_check(allocate_async(&p, want, stream_->get()), "cudaMallocFromPoolAsync", operation,
               rank);
    // Stream-ordered: after the queued work that may still use the old block; a block that a
    // captured graph points into stays.
    free(ledger_.replace({p, want}));
    return static_cast<std::byte*>(p);
  }

  /// Frees the superseded blocks kept for graphs (after the work queued so far): call once every
  /// graph that captured a call on this memory is destroyed.
  void release_retired() noexcept {
    for (const auto& b : ledger_.take_retired())
      free(b);
  }

private:
  void free(const scratch_ledger::block& b) noexcept {
    if (b.p != nullptr) (void)cudaFreeAsync(b.p, stream_->get());
  }
  void release() noexcept {
    if (!stream_) return; // moved from
    release_retired();
    free(ledger_.take_current());
  }

  std::shared_ptr<const stream> stream_;
  scratch_ledger ledger_;
};

} // namespace weft::cuda::detail
