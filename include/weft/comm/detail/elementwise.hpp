#pragma once
// Element-wise functors that host loops and device kernels share (WEFT_HOST_DEVICE): the
// arithmetic of a reduction is written once, so host tests check what the GPU computes.
// Each functor handles one index; a host loop or a grid-stride device loop calls it for
// every index.
//
//   reduce_sources<T, Op>   dst[i] = src[0][i] op src[1][i] op ... op src[k-1][i], left to
//                           right in the accumulation type, rounded once (as reduce_many)
//   scale_elements<T>       dst[i] = src[i] * (1 / ranks): op::avg's first step on half
//   copy_elements<T>        dst[i] = src[i]
//   pack_split, split_by_packs
//                           either functor over a range in 16-byte packs (16 / sizeof(T)
//                           elements, one 128-bit load per operand on the device), with the
//                           elements before the operands' first common 16-byte boundary and
//                           after the last whole pack one by one
#include <weft/core/config.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <cstddef>
#include <cstdint>

namespace weft::detail {

/// The most sources one functor reduces (load_reduce over a group, so at most the ranks that
/// share memory); sized so the functor fits a kernel's parameters.
inline constexpr int max_sources = 128;

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

/// How a range of n elements splits for 16-byte packs: `head` elements one by one up to the
/// first 16-byte boundary of every operand, `packs` whole packs, then `tail` elements one by
/// one. Where no whole pack fits, or the operands' addresses differ mod 16 and so share no
/// boundary, all n go one by one, as the tail.
struct pack_split {
  std::size_t head = 0;
  std::size_t packs = 0;
  std::size_t tail = 0;
  /// The indices of a launch over the split: one per head element, pack and tail element.
  WEFT_HOST_DEVICE constexpr std::size_t indices() const noexcept { return head + packs + tail; }
  friend constexpr bool operator==(const pack_split&, const pack_split&) = default;
};

/// The split of n elements of element_size bytes whose operands start at addresses[0, count).
constexpr pack_split split_for_packs(const std::uintptr_t* addresses, int count,
                                     std::size_t element_size, std::size_t n) noexcept {
  const std::uintptr_t off = addresses[0] % 16;
  bool agree = off % element_size == 0;
  for (int j = 1; j < count; ++j)
    agree = agree && addresses[j] % 16 == off;
  if (!agree) return {0, 0, n};
  const std::size_t to_boundary = (16 - off) % 16 / element_size;
  const std::size_t head = to_boundary < n ? to_boundary : n;
  const std::size_t width = 16 / element_size;
  const std::size_t packs = (n - head) / width;
  if (packs == 0) return {0, 0, n};
  return {head, packs, n - head - packs * width};
}

/// The split of n elements of T at dst and the k sources.
template <class T>
pack_split split_for_packs(const T* dst, const T* const* src, int k, std::size_t n) {
  std::uintptr_t at[max_sources + 1] = {reinterpret_cast<std::uintptr_t>(dst)};
  for (int j = 0; j < k; ++j)
    at[j + 1] = reinterpret_cast<std::uintptr_t>(src[j]);
  return split_for_packs(at, k + 1, sizeof(T), n);
}

/// Runs an element functor over a range split by pack_split, in one index space: index
/// i < head is element i, the next `packs` indices are the packs from element `head` on
/// (F::pack, one 16-byte load per operand), the rest the elements after the last pack.
template <class F>
struct split_by_packs {
  F f;
  pack_split cut;

  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    constexpr std::size_t w = F::width;
    if (i < cut.head) {
      f(i);
    } else if (i - cut.head < cut.packs) {
      f.pack(cut.head + (i - cut.head) * w);
    } else {
      f(cut.head + cut.packs * w + (i - cut.head - cut.packs));
    }
  }
};

template <class T, class Op>
struct reduce_sources {
  static constexpr int width = packed<T>::width;
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

  /// Elements [e, e + width), each as operator() computes it, with one 16-byte load per source
  /// and one store: every operand must be 16-byte aligned at element e.
  WEFT_HOST_DEVICE void pack(std::size_t e) const {
    using A = accumulate_t<T>;
    constexpr int w = width;
    A acc[w];
    {
      const packed<T> p = *reinterpret_cast<const packed<T>*>(src[0] + e);
      for (int l = 0; l < w; ++l)
        acc[l] = static_cast<A>(p.v[l]);
    }
    for (int j = 1; j < k; ++j) {
      const packed<T> p = *reinterpret_cast<const packed<T>*>(src[j] + e);
      for (int l = 0; l < w; ++l)
        acc[l] = op(acc[l], static_cast<A>(p.v[l]));
    }
    packed<T> out;
    for (int l = 0; l < w; ++l)
      out.v[l] = static_cast<T>(acc[l]);
    *reinterpret_cast<packed<T>*>(dst + e) = out;
  }
};

/// dst[i] = src[i].
template <class T>
struct copy_elements {
  static constexpr int width = packed<T>::width;
  T* dst;
  const T* src;
  WEFT_HOST_DEVICE void operator()(std::size_t i) const { dst[i] = src[i]; }
  /// Elements [e, e + width) by one 16-byte load and store (both aligned at e).
  WEFT_HOST_DEVICE void pack(std::size_t e) const {
    *reinterpret_cast<packed<T>*>(dst + e) = *reinterpret_cast<const packed<T>*>(src + e);
  }
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
