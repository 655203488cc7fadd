#pragma once
// host_handoff: what weft::two_level needs besides its transports, on the host.
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/two_level/scratch_pool.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>

namespace weft {

/// The order between two_level's levels where each call returns only when its work is done
/// (the host transports): nothing to do.
struct host_handoff {
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
  void copy_rows(Comm&, T* dst, std::size_t dst_stride, const T* src, std::size_t src_stride, std::size_t n,
                 std::size_t rows) {
    for (std::size_t i = 0; i < rows; ++i) std::copy_n(src + i * src_stride, n, dst + i * dst_stride);
  }

private:
  std::shared_ptr<detail::scratch_pool> pool_ = std::make_shared<detail::scratch_pool>();
};

} // namespace weft
