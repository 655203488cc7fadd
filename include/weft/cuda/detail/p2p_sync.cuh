#pragma once
// The sync step of the p2p transport: one kernel of one block, a thread per member of the
// group. Rank r's thread for member q
//
//   counters[q] += 1                          (r's own workspace; only r's stream writes it)
//   fence, then store counters[q] into q's flags[r] with release semantics at system scope
//   spin until r's own flags[q] >= counters[q], then an acquire fence at system scope
//
// Counting per pair of ranks, not per communicator, lets syncs of different groups (plans
// made of sub-plans) interleave: r and q make the same syncs with each other in the same
// order, whatever else each of them syncs with. A peer can be at most one sync ahead (it
// waits for r at each), so ">=" is the whole test.
//
// Memory ordering. What r wrote before the sync (earlier kernels on its stream) is ordered
// before this kernel by the stream; __threadfence_system() makes those writes visible at
// system scope before the release store of the flag, and q's acquire of the flag, which
// the kernels q queues after its sync are ordered behind, makes them visible to q's loads. (The
// loads in the spin are relaxed; the acquire fence after the one that saw the flag orders as an
// acquire load would.)
// So a peer's loads after a sync see what the rank wrote before it, on one device or across
// NVLink, in one process or across processes (IPC).
//
// The spin is bounded: after timeout_ns of the device's global timer the thread writes
// p2p_timeout_word(sync, q) into the rank's host-mapped error word and gives up, and so does
// every later sync of that rank once it sees the word set. The host reads the word when it
// next checks (weft::error naming the sync's operation, the rank and q); the data of that call
// and of later ones is then garbage.
//
// Co-scheduling: a sync's block spins until its peers' syncs run, so each peer's stream must
// be able to start its own kernels meanwhile. One block per sync keeps that true when ranks
// share a device (a rank's kernels need the SMs that the spinning blocks leave free), provided
// the ranks' streams are on different hardware queues: CUDA_DEVICE_MAX_CONNECTIONS (8 by
// default, at most 32) must be at least the streams in use on the device, or one rank's work
// can queue behind another's spinning sync until the timeout. Ranks of several processes on
// one device take turns on it (time slicing) unless MPS runs them at once; syncs are slow then.
#include <weft/cuda/detail/p2p_plan.cuh>

#include <cuda/atomic>
#include <cuda_runtime.h>

#include <cstdint>

namespace weft::cuda::detail {

/// Everything one sync needs, by value in the kernel's parameters.
struct p2p_sync_args {
  std::uint64_t* peer_flags[p2p_max_ranks]; // member j's flag words, in this rank's address space
  int members[p2p_max_ranks];               // ranks of the group (this rank's own entry is skipped)
  std::uint64_t* flags;                     // this rank's flag words
  std::uint64_t* counters;                  // this rank's count of syncs with each rank
  std::uint64_t* error;                     // host-mapped: the first timeout this rank saw
  std::uint64_t timeout_ns;
  std::uint32_t sync; // this sync's number, which names it in a timeout
  int count;          // members
  int rank;
};

/// Threads of a sync's block: one per possible member.
inline constexpr unsigned p2p_sync_threads = p2p_max_ranks;

__device__ inline std::uint64_t p2p_clock_ns() {
  std::uint64_t t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <class = void>
__global__ void __launch_bounds__(p2p_sync_threads) p2p_sync_kernel(const p2p_sync_args a) {
  using flag = ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_system>;
  const int j = static_cast<int>(threadIdx.x);
  if (j < a.count && a.members[j] != a.rank) {
    const int q = a.members[j];
    const std::uint64_t want = a.counters[q] + 1;
    a.counters[q] = want;
    __threadfence_system(); // this rank's earlier writes, before the flag that publishes them
    flag(a.peer_flags[j][a.rank]).store(want, ::cuda::std::memory_order_release);
    flag mine(a.flags[q]);
    volatile std::uint64_t* const error = a.error;
    const std::uint64_t start = p2p_clock_ns();
    // Relaxed loads while it waits, then one acquire fence: an acquire load on every spin would
    // also invalidate the L1 of an SM it shares with other ranks' copy and reduce blocks.
    for (unsigned spins = 1; mine.load(::cuda::std::memory_order_relaxed) < want; ++spins) {
      if (spins % 64 != 0) continue;
      __nanosleep(100);  // leave the SM's issue slots to the blocks doing work
      // The error word is host memory: read it seldom, it crosses the bus.
      if (spins % 1024 == 0 && *error != 0) break; // an earlier sync of this rank timed out
      if (p2p_clock_ns() - start > a.timeout_ns) {
        if (*error == 0) *error = p2p_timeout_word(a.sync, q);
        __threadfence_system();
        break;
      }
    }
    ::cuda::atomic_thread_fence(::cuda::std::memory_order_acquire, ::cuda::thread_scope_system);
  }
  __syncthreads();
}

} // namespace weft::cuda::detail
