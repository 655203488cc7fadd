#pragma once
// The p2p transport's fused all-reduce kernels: direct's one-shot and two-shot plans in one
// launch each, with the barriers of detail/p2p_sync.cuh inside (what they do, which calls take
// them, how blocks cut the elements: detail/p2p_fused.hpp).
//
// Grid barrier, in every block:
//
//   all threads done with the phase (bar.sync); thread 0: read the generation word, fence at
//   system scope, add one to the arrival counter
//   the last block to arrive: reset the counter, run the sync with every peer (p2p_sync_in_block),
//   fence, bump the generation word (release)
//   the others: thread 0 spins until the generation word moves (acquire), bar.sync
//   every block: read the rank's failed mark; set, the kernel ends in every block
//
// The fence before the arrival makes the block's writes visible at system scope before the
// last block's release store of the flag (cumulativity through the arrival's atomic), so a peer
// that passes its sync sees every block's part of the staging area or region.
#include <weft/cuda/detail/p2p_fused.hpp>
#include <weft/cuda/detail/p2p_sync.cuh>
#include <weft/cuda/kernels.cuh>

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace weft::cuda::detail {

/// A fused call's kernel parameters: every functor built on the host.
template <class T, class Op>
struct p2p_fused_args {
  using copy_f = weft::detail::split_by_packs<p2p_stage_elements<T>>;
  using reduce_f = weft::detail::split_by_packs<p2p_reduce_elements<T, Op>>;
  using gather_f = weft::detail::split_by_packs<weft::detail::copy_elements<T>>;
  p2p_sync_args sync;    // its number is the first barrier's; the k-th barrier's is sync + k
  std::uint32_t* arrive; // the rank's arrival counter and generation word (its workspace)
  std::uint32_t* generation;
  copy_f copy;
  reduce_f reduce;
  gather_f gather[p2p_fused_max_ranks];
  int gathers; // 0: one-shot
  int barriers;
};

/// A grid barrier (see above); true in every block while the rank has not failed.
__device__ inline bool p2p_grid_barrier(const p2p_sync_args& a, std::uint32_t sync,
                                        std::uint32_t* arrive, std::uint32_t* generation,
                                        volatile int* gave_up, volatile int* last) {
  using gen_ref = ::cuda::atomic_ref<std::uint32_t, ::cuda::thread_scope_device>;
  __syncthreads();
  std::uint32_t seen = 0;
  if (threadIdx.x == 0) {
    seen = gen_ref(*generation).load(::cuda::std::memory_order_relaxed);
    __threadfence_system();
    *last = p2p_grid_last(atomicAdd(arrive, 1u), gridDim.x) ? 1 : 0;
  }
  __syncthreads();
  if (*last != 0) {
    if (threadIdx.x == 0) atomicExch(arrive, 0u); // the next barrier counts from zero
    (void)p2p_sync_in_block(a, sync, gave_up);
    if (threadIdx.x == 0) {
      __threadfence();
      gen_ref(*generation).store(seen + 1, ::cuda::std::memory_order_release);
    }
  } else if (threadIdx.x == 0) {
    while (!p2p_grid_released(gen_ref(*generation).load(::cuda::std::memory_order_acquire), seen))
      __nanosleep(64);
  }
  __syncthreads();
  return p2p_may_start(*static_cast<volatile std::uint64_t*>(a.counters + a.rank));
}

template <class T, class Op>
__global__ void __launch_bounds__(block_threads)
    p2p_fused_kernel(const __grid_constant__ p2p_fused_args<T, Op> a) {
  __shared__ int gave_up;
  __shared__ int last;
  __shared__ int open;
  const unsigned b = blockIdx.x;
  const unsigned blocks = gridDim.x;
  const unsigned t = threadIdx.x;
  const unsigned threads = blockDim.x;
  if (t == 0)
    open =
        p2p_may_start(*static_cast<volatile std::uint64_t*>(a.sync.counters + a.sync.rank)) ? 1 : 0;
  __syncthreads();
  if (open != 0) p2p_fused_indices(a.copy.cut.indices(), b, blocks, t, threads, a.copy);
  if (a.barriers == 0) return; // one rank: the copy is the call
  // Barrier k of the call is sync number a.sync.sync + k.
  std::uint32_t k = 0;
  const auto barrier = [&] {
    return p2p_grid_barrier(a.sync, a.sync.sync + k++, a.arrive, a.generation, &gave_up, &last);
  };
  if (!barrier()) return;
  p2p_fused_indices(a.reduce.cut.indices(), b, blocks, t, threads, a.reduce);
  if (a.gathers > 0) {
    if (!barrier()) return;
    for (int g = 0; g < a.gathers; ++g)
      p2p_fused_indices(a.gather[g].cut.indices(), b, blocks, t, threads, a.gather[g]);
  }
  while (static_cast<int>(k) < a.barriers)
    if (!barrier()) return;
}

} // namespace weft::cuda::detail
