#pragma once
// host_runtime: where weft::two_level's own work runs and its working memory lives, for host
// transports. A two_level's Runtime does what a call needs besides the levels' collectives:
//   operator()(from, to)   orders the levels: work queued on `to` from now on follows the work
//                          queued on `from` so far
//   scratch<T>(comm, n)    working memory for the call, in the transports' memory
//   copy, copy_rows        copies in that memory, in order with comm's work
//   divide                 op::avg's last step
//   scaled_by_ranks        op::avg's first step on half, where the runtime's memory is not the
//                          host's (optional: cuda::stream_runtime has it)
// cuda/two_level.cuh's stream_runtime is the device one: two streams ordered by an event,
// stream-ordered device memory, cudaMemcpyAsync copies and a divide kernel.
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/two_level/scratch_pool.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>

namespace weft {

/// The host's runtime: each transport call returns only when its work is done, so the levels
/// need no ordering; working memory comes from a pool kept between calls.
struct host_runtime {
  /// Nothing to order: the host transports' calls return when done.
  template <class From, class To>
  void operator()(From&, To&) {}
  /// data /= ranks, on the host (op::avg's last step).
  template <class Comm, class T>
  void divide(Comm&, T* data, std::size_t n, int ranks) {
    detail::divide(data, n, ranks);
  }
  /// n elements of working memory for a call on comm, back in the pool when the call returns;
  /// not zeroed (every use writes before it reads).
  template <class T, class Comm>
  detail::host_scratch<T> scratch(Comm&, std::size_t n) {
    return detail::host_scratch<T>(pool_, n);
  }
  /// dst[0, n) = src[0, n), in order with comm's work (disjoint ranges).
  template <class Comm, class T>
  void copy(Comm&, T* dst, const T* src, std::size_t n) {
    std::copy_n(src, n, dst);
  }
  /// rows x n elements: row i from src + i * src_stride to dst + i * dst_stride (disjoint).
  template <class Comm, class T>
  void copy_rows(Comm&, T* dst, std::size_t dst_stride, const T* src, std::size_t src_stride,
                 std::size_t n, std::size_t rows) {
    for (std::size_t i = 0; i < rows; ++i)
      std::copy_n(src + i * src_stride, n, dst + i * dst_stride);
  }

private:
  std::shared_ptr<detail::scratch_pool> pool_ = std::make_shared<detail::scratch_pool>();
};

using host_handoff [[deprecated("use weft::host_runtime")]] = host_runtime;

} // namespace weft
