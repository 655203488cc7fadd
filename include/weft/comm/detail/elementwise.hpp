#pragma once
// Element-wise functors that host loops and device kernels share (WEFT_HOST_DEVICE): the
// arithmetic of a reduction is written once, so host tests check what the GPU computes.
// Each functor handles one index; a host loop or a grid-stride device loop calls it for
// every index.
//
//   reduce_sources<T, Op>   dst[i] = src[0][i] op src[1][i] op ... op src[k-1][i], left to
//                           right in the accumulation type, rounded once (as reduce_many)
//   scale_elements<T>       dst[i] = src[i] * (1 / ranks): op::avg's first step on half
//   packed<T>, reduce_sources_packed, copy_packed
//                           the same over 16-byte packs (16 / sizeof(T) elements at a
//                           time), for 16-byte aligned pointers: one 128-bit load per source
//                           and one store per pack on the device
#include <weft/core/config.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <cstddef>
#include <cstdint>

namespace weft::detail {

/// The most sources one functor reduces (load_reduce over a group, so at most the ranks that
/// share memory); sized so the functor fits a kernel's parameters.
inline constexpr int max_sources = 128;

template <class T, class Op>
struct reduce_sources {
  T* dst;
  const T* src[max_sources];
  int k; // 1 <= k <= max_sources
  Op op;

  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    using A = accumulate_t<T>;
    A acc = static_cast<A>(src[0][i]);
    for (int j = 1; j < k; ++j)
      acc = op(acc, static_cast<A>(src[j][i]));
    dst[i] = static_cast<T>(acc);
  }
};

/// 16 bytes of T: what one vector load or store moves.
template <class T>
struct alignas(16) packed {
  static constexpr int width = static_cast<int>(16 / sizeof(T));
  T v[width];
};

/// Whether p can be read or written as packed<T>.
WEFT_HOST_DEVICE inline bool is_pack_aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

/// reduce_sources over packs: index i covers elements [i * width, (i + 1) * width). Every
/// pointer must be 16-byte aligned; the caller handles the elements past the last whole pack
/// with reduce_sources. The same arithmetic, element by element, as reduce_sources.
template <class T, class Op>
struct reduce_sources_packed {
  T* dst;
  const T* src[max_sources];
  int k;
  Op op;

  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    using A = accumulate_t<T>;
    constexpr int w = packed<T>::width;
    A acc[w];
    {
      const packed<T> p = reinterpret_cast<const packed<T>*>(src[0])[i];
      for (int e = 0; e < w; ++e)
        acc[e] = static_cast<A>(p.v[e]);
    }
    for (int j = 1; j < k; ++j) {
      const packed<T> p = reinterpret_cast<const packed<T>*>(src[j])[i];
      for (int e = 0; e < w; ++e)
        acc[e] = op(acc[e], static_cast<A>(p.v[e]));
    }
    packed<T> out;
    for (int e = 0; e < w; ++e)
      out.v[e] = static_cast<T>(acc[e]);
    reinterpret_cast<packed<T>*>(dst)[i] = out;
  }
};

/// dst = src over packs (16-byte aligned pointers).
template <class T>
struct copy_packed {
  T* dst;
  const T* src;
  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    reinterpret_cast<packed<T>*>(dst)[i] = reinterpret_cast<const packed<T>*>(src)[i];
  }
};

/// dst[i] = src[i].
template <class T>
struct copy_elements {
  T* dst;
  const T* src;
  WEFT_HOST_DEVICE void operator()(std::size_t i) const { dst[i] = src[i]; }
};

/// op::avg's first step on half, whose sum of inputs can overflow where their mean does not:
/// dst[i] = src[i] * by in the accumulation type, rounded once, with `by` the
/// average_scale of the ranks. The plan then sums the scaled inputs (as ncclAvg premultiplies
/// floating types), so every transport, host or device, computes the same bits.
template <class T>
struct scale_elements {
  T* dst;
  const T* src;
  accumulate_t<T> by;
  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    using A = accumulate_t<T>;
    dst[i] = static_cast<T>(static_cast<A>(src[i]) * by);
  }
};

/// The factor scale_elements multiplies by: 1 / ranks, rounded once in the accumulation type.
template <class T>
constexpr accumulate_t<T> average_scale(int ranks) noexcept {
  using A = accumulate_t<T>;
  return A{1} / static_cast<A>(ranks);
}

/// The avg operator's last step on one element: divide by the ranks in the accumulation type.
template <class T>
struct divide_elements {
  T* data;
  int ranks;
  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    using A = accumulate_t<T>;
    data[i] = static_cast<T>(static_cast<A>(data[i]) / static_cast<A>(ranks));
  }
};

} // namespace weft::detail
