#pragma once
// Device kernels on stream: element-wise reduce of k sources, copy, and avg's first (scale,
// on half) and last (divide) steps, for every weft element type and operator. Each runs weft's
// WEFT_HOST_DEVICE functors (comm/detail/elementwise.hpp) in a grid-stride loop, one launch per
// range: the elements up to the first 16-byte boundary that every operand shares one by one,
// then 16-byte packs, then the elements past the last whole pack one by one (split_by_packs).
// Operands whose addresses differ mod 16 share no boundary, and go element by element.
// Low-precision types accumulate in float and round once, left to right over the sources, so
// the result is the host's to the bit.
//
// Gates. Each takes a gate last, a trivially copyable functor `bool operator()() const` that
// every block of the kernel asks once, in its first thread, before it touches memory: a block
// that hears false does nothing. The p2p transport's gate reads its rank's failed mark
// (detail/p2p_epoch.hpp), so that no data moves once a sync of the rank gave up. The default,
// ungated, costs nothing.
#include <weft/comm/detail/elementwise.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>
#include <weft/cuda/error.cuh>
#include <weft/cuda/memory.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>

namespace weft::cuda {
namespace detail {

inline constexpr int block_threads = 512;

/// The gate that always opens: no read, no barrier.
struct ungated {
  WEFT_HOST_DEVICE constexpr bool operator()() const noexcept { return true; }
};

// Bounded to the block it is launched with (more registers per thread than 512 threads can have
// would fail the launch), and f left in the parameter space where the threads read it
// (__grid_constant__): a reduce's functor holds up to max_sources pointers, indexed at run time,
// which would otherwise be copied per thread. The gate is asked once per block.
template <class F, class Gate>
__global__ void __launch_bounds__(block_threads)
    for_each_index(const __grid_constant__ F f, std::size_t n, const Gate gate) {
  if constexpr (!std::is_same_v<Gate, ungated>) {
    __shared__ bool open;
    if (threadIdx.x == 0) open = gate();
    __syncthreads();
    if (!open) return;
  }
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    f(i);
}

/// The current device's SMs (asked once per thread and device).
inline int sm_count() {
  thread_local int device = -1;
  thread_local int sms = 0;
  int d = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&d));
  if (d != device) {
    WEFT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
    device = d;
  }
  return sms;
}

/// Enough blocks to cover n indices, at most a few waves of the current device's SMs (the
/// grid-stride loop does the rest).
inline unsigned grid_for(std::size_t n) {
  const int sms = sm_count();
  const std::size_t wanted = (n + block_threads - 1) / block_threads;
  return static_cast<unsigned>(
      std::max<std::size_t>(1, std::min<std::size_t>(wanted, static_cast<std::size_t>(sms) * 8)));
}

template <class F, class Gate = ungated>
void launch(const F& f, std::size_t n, cudaStream_t s, const Gate& gate = {}) {
  if (n == 0) return;
  for_each_index<<<grid_for(n), block_threads, 0, s>>>(f, n, gate);
  WEFT_CUDA_TRY(cudaGetLastError());
}

} // namespace detail

/// dst[i] = src[0][i] op ... op src[k-1][i] for i < n, on stream s. dst may equal a source
/// (each element is read before it is written); 1 <= k <= weft::detail::max_sources.
template <element T, class Op, class Gate = detail::ungated>
void reduce(T* dst, const T* const* src, int k, std::size_t n, const Op& op, cudaStream_t s,
            const Gate& gate = {}) {
  using weft::detail::max_sources;
  if (k < 1 || k > max_sources) {
    throw error("weft: cuda::reduce of " + std::to_string(k) + " sources; it takes 1 to " +
                std::to_string(max_sources));
  }
  weft::detail::reduce_sources<T, Op> f{dst, {}, k, op};
  std::copy(src, src + k, f.src);
  const weft::detail::pack_split cut = weft::detail::split_for_packs(dst, src, k, n);
  detail::launch(weft::detail::split_by_packs<weft::detail::reduce_sources<T, Op>>{f, cut},
                 cut.indices(), s, gate);
}

/// dst[i] = a[i] op b[i] (the two-source case of reduce).
template <element T, class Op, class Gate = detail::ungated>
void reduce(T* dst, const T* a, const T* b, std::size_t n, const Op& op, cudaStream_t s,
            const Gate& gate = {}) {
  const T* src[2] = {a, b};
  reduce(dst, src, 2, n, op, s, gate);
}

/// dst[i] = src[i] for i < n, with 16-byte loads and stores between the operands' first and
/// last common 16-byte boundaries; the ranges are the same or disjoint.
template <element T, class Gate = detail::ungated>
void copy(T* dst, const T* src, std::size_t n, cudaStream_t s, const Gate& gate = {}) {
  if (dst == src || n == 0) return;
  const T* const from[1] = {src};
  const weft::detail::pack_split cut = weft::detail::split_for_packs(dst, from, 1, n);
  detail::launch(weft::detail::split_by_packs<weft::detail::copy_elements<T>>{{dst, src}, cut},
                 cut.indices(), s, gate);
}

/// A copy of src's n elements, each times 1 / ranks in the accumulation type and rounded once
/// (weft::detail::scale_elements), in memory allocated and freed in s's order: op::avg's first
/// step on half, whose plan then sums. The returned buffer frees itself on s, after the work
/// queued meanwhile.
template <element T, class Gate = detail::ungated>
stream_buffer<T> scaled_by_ranks(const T* src, std::size_t n, int ranks, cudaStream_t s,
                                 const Gate& gate = {}) {
  stream_buffer<T> scaled(n, s);
  detail::launch(
      weft::detail::scale_elements<T>{scaled.data(), src, weft::detail::average_scale<T>(ranks)}, n,
      s, gate);
  return scaled;
}

/// data[i] /= ranks in the accumulation type (the avg operator's last step).
template <element T, class Gate = detail::ungated>
void divide(T* data, std::size_t n, int ranks, cudaStream_t s, const Gate& gate = {}) {
  detail::launch(weft::detail::divide_elements<T>{data, ranks}, n, s, gate);
}

} // namespace weft::cuda
