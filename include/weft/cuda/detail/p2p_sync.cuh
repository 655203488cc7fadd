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
// p2p_error_word(timed_out, sync, q) into the rank's host-mapped error word and gives up. A
// failure is for good (detail/p2p_epoch.hpp): the sync that gives up, for whatever member,
// marks the rank failed (counters[rank], its count with itself, which no sync uses) and
// stores "abandoned" into every member's flag, so that no peer passes on the epoch it counted;
// every later sync of the rank finds the mark and, without counting or publishing an epoch,
// stores "abandoned" again and returns. A sync that finds its peer's flag abandoned gives up
// the same way (cause peer_abandoned), so a failure spreads to every rank that syncs with the
// failed one, each at its next sync with it. The host reads the word when it next checks
// (weft::error naming the sync's operation, the rank and q); a host that fails the
// communicator itself writes the word (cause host_failed), and a waiting sync that reads it
// gives up too. The rank's copy, reduce and load kernels queued after a sync that gave up read
// the mark first and do nothing (p2p_data_gate); the data of the failed call is garbage.
//
// Co-scheduling: a sync's block spins until its peers' syncs run, so each peer's stream must
// be able to start its own kernels meanwhile. One block per sync keeps that true when ranks
// share a device (a rank's kernels need the SMs that the spinning blocks leave free), provided
// the ranks' streams are on different hardware queues: CUDA_DEVICE_MAX_CONNECTIONS (8 by
// default, at most 32) must be at least the streams in use on the device, or one rank's work
// can queue behind another's spinning sync until the timeout. Ranks of several processes on
// one device take turns on it (time slicing) unless MPS runs them at once; syncs are slow then.
#include <weft/cuda/detail/p2p_epoch.hpp>
#include <weft/cuda/detail/p2p_plan.hpp>

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
  __shared__ int gave_up; // this sync gave up, for any member (or the rank had failed before)
  volatile int* const given_up = &gave_up;
  volatile std::uint64_t* const failed_mark = a.counters + a.rank; // device memory: cheap to read
  const int j = static_cast<int>(threadIdx.x);
  const bool member = j < a.count && a.members[j] != a.rank;
  if (j == 0) *given_up = p2p_may_start(*failed_mark) ? 0 : 1;
  __syncthreads();
  std::uint64_t epoch = 0;
  if (member) {
    const int q = a.members[j];
    epoch = a.counters[q];
    if (*given_up == 0) {
      const std::uint64_t want = epoch + 1;
      epoch = want;
      a.counters[q] = want;
      __threadfence_system(); // this rank's earlier writes, before the flag that publishes them
      flag(a.peer_flags[j][a.rank]).store(want, ::cuda::std::memory_order_release);
      flag mine(a.flags[q]);
      volatile std::uint64_t* const error = a.error;
      const std::uint64_t start = p2p_clock_ns();
      // Relaxed loads while it waits, then one acquire fence: an acquire load on every spin would
      // also invalidate the L1 of an SM it shares with other ranks' copy and reduce blocks.
      for (unsigned spins = 1;; ++spins) {
        const bool look = spins % 64 == 0; // the clock and the failures, every so often
        // The error word is host memory: read it seldom, it crosses the bus.
        const bool failed = look && (*given_up != 0 || (spins % 1024 == 0 && *error != 0));
        const bool late = look && p2p_clock_ns() - start > a.timeout_ns;
        const p2p_wait w =
            p2p_judge_flag(mine.load(::cuda::std::memory_order_relaxed), want, failed, late);
        if (w == p2p_wait::passed) break;
        if (w == p2p_wait::waiting) {
          if (look) __nanosleep(100); // leave the SM's issue slots to the blocks doing work
          continue;
        }
        if (w != p2p_wait::rank_failed && *error == 0)
          *error = p2p_error_word(p2p_cause_of(w), a.sync, q);
        *failed_mark = 1;
        *given_up = 1;
        __threadfence_system();
        break;
      }
      ::cuda::atomic_thread_fence(::cuda::std::memory_order_acquire, ::cuda::thread_scope_system);
    }
  }
  __syncthreads();
  // A rank that gave up, now or before, publishes no epoch: its peers must not pass on the one
  // it counted (or on any earlier flag of it) when they arrive.
  if (member && *given_up != 0) {
    flag(a.peer_flags[j][a.rank]).store(p2p_abandoned(epoch), ::cuda::std::memory_order_release);
  }
}

} // namespace weft::cuda::detail
