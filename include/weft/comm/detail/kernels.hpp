#pragma once
// Element-wise kernels on host memory. Each element is combined in the operator's
// accumulation type and rounded once, so half and bfloat16 sum in float.
#include <weft/core/config.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace weft::detail {

// Large writes bypass the cache (non-temporal stores): a destination that will not be read
// again soon costs one memory write instead of a read-for-ownership plus a write, which
// is most of the gap between a copy-heavy all-reduce and the memory-traffic bound.
inline constexpr std::size_t streaming_store_bytes = std::size_t{1} << 20;

/// Writes `bytes` from src to dst with non-temporal stores where the target has them
/// (plain memcpy elsewhere); call store_fence() before publishing the data.
inline void store_stream(void* dst, const void* src, std::size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(d) % 16) % 16;
  head = head < bytes ? head : bytes;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const std::size_t blocks = bytes / 16;
  for (std::size_t i = 0; i < blocks; ++i) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d) + i,
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s) + i));
  }
  std::memcpy(d + blocks * 16, s + blocks * 16, bytes % 16);
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Orders earlier non-temporal stores before later stores (such as a flag another rank reads).
inline void store_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

/// memcpy for non-overlapping ranges; large ones bypass the cache.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes >= streaming_store_bytes) {
    store_stream(dst, src, bytes);
    store_fence();
  } else {
    std::memcpy(dst, src, bytes);
  }
}

template <class T, class Op>
WEFT_HOST_DEVICE inline T combine(const Op& op, T a, T b) {
  using A = accumulate_t<T>;
  return static_cast<T>(op(static_cast<A>(a), static_cast<A>(b)));
}

/// dst[0, n) = src[0, n); the ranges are the same or disjoint (plans never overlap them).
template <class T>
inline void copy_n(T* dst, const T* src, std::size_t n) {
  if (n != 0 && dst != src) copy_bytes(dst, src, n * sizeof(T));
}

/// dst[i] = a[i] op b[i]; dst may alias a or b.
template <class T, class Op>
inline void reduce2(T* dst, const T* a, const T* b, std::size_t n, const Op& op) {
  for (std::size_t i = 0; i < n; ++i)
    dst[i] = combine(op, a[i], b[i]);
}

/// dst[i] = src[0][i] op src[1][i] op ... op src[k-1][i], left to right, accumulated and rounded
/// once. dst may alias any source (each element is read before it is written).
template <class T, class Op>
inline void reduce_many(T* dst, const T* const* src, std::size_t k, std::size_t n, const Op& op) {
  using A = accumulate_t<T>;
  if (k == 0) return;
  if (k == 1) {
    copy_n(dst, src[0], n);
    return;
  }
  constexpr std::size_t tile = 1024; // keeps the accumulators in L1 across sources
  A acc[tile];
  T out[tile];
  const bool stream = n * sizeof(T) >= streaming_store_bytes;
  for (std::size_t base = 0; base < n; base += tile) {
    const std::size_t m = n - base < tile ? n - base : tile;
    const T* s0 = src[0] + base;
    const T* s1 = src[1] + base;
    for (std::size_t i = 0; i < m; ++i)
      acc[i] = op(static_cast<A>(s0[i]), static_cast<A>(s1[i]));
    for (std::size_t j = 2; j < k; ++j) {
      const T* sj = src[j] + base;
      for (std::size_t i = 0; i < m; ++i)
        acc[i] = op(acc[i], static_cast<A>(sj[i]));
    }
    T* d = stream ? out : dst + base;
    for (std::size_t i = 0; i < m; ++i)
      d[i] = static_cast<T>(acc[i]);
    if (stream) store_stream(dst + base, out, m * sizeof(T));
  }
  if (stream) store_fence();
}

/// The avg operator's last step: divide by the number of ranks, in the accumulation type.
template <class T>
inline void divide(T* data, std::size_t n, int ranks) {
  using A = accumulate_t<T>;
  const A d = static_cast<A>(ranks);
  for (std::size_t i = 0; i < n; ++i)
    data[i] = static_cast<T>(static_cast<A>(data[i]) / d);
}

} // namespace weft::detail
