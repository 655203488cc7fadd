#pragma once
// The sync step of the p2p transport: one kernel of one block, a thread per member of the
// group (p2p_sync_in_block, which the fused all-reduce kernels' grid barrier runs too, in the
// last block to arrive: detail/p2p_fused.cuh). Rank r's thread for member q
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

/// The memory policy of p2p_sync_arrive/wait/abandon (detail/p2p_epoch.hpp) on the device: one
/// thread per member, the block's "gave up" note in shared memory.
struct p2p_device_sync_memory {
  using flag_ref = ::cuda::atomic_ref<std::uint64_t, ::cuda::thread_scope_system>;
  const p2p_sync_args& a;
  std::uint32_t sync;      // this sync's number, which names it in a timeout
  int j;                   // the member's index in a.members
  volatile int* given_up;  // shared by the block
  std::uint64_t start = 0; // the global timer when the wait began

  __device__ std::uint64_t counter(int q) const { return a.counters[q]; }
  __device__ void set_counter(int q, std::uint64_t e) const { a.counters[q] = e; }
  __device__ void publish(int, std::uint64_t e) const {
    __threadfence_system(); // this rank's earlier writes, before the flag that publishes them
    flag_ref(a.peer_flags[j][a.rank]).store(e, ::cuda::std::memory_order_release);
  }
  __device__ std::uint64_t flag(int q) const {
    return flag_ref(a.flags[q]).load(::cuda::std::memory_order_relaxed);
  }
  // The error word is host memory: read it seldom, it crosses the bus.
  __device__ bool failed(unsigned looks) const {
    return *given_up != 0 ||
           (looks % 1024 == 0 && *static_cast<volatile std::uint64_t*>(a.error) != 0);
  }
  __device__ bool late() const { return p2p_clock_ns() - start > a.timeout_ns; }
  __device__ void pause() const { __nanosleep(100); } // leave the SM's issue slots to data blocks
  __device__ void give_up(p2p_wait w, int q) const {
    volatile std::uint64_t* const error = a.error;
    if (w != p2p_wait::rank_failed && *error == 0)
      *error = p2p_error_word(p2p_cause_of(w), sync, q);
    *static_cast<volatile std::uint64_t*>(a.counters + a.rank) = 1; // the failed mark
    *given_up = 1;
    __threadfence_system();
  }
  __device__ void acquire() const {
    ::cuda::atomic_thread_fence(::cuda::std::memory_order_acquire, ::cuda::thread_scope_system);
  }
};

/// One sync, numbered `sync`, run by every thread of a block of at least a.count threads (thread j
/// for member j); every thread of the block must call it. `gave_up` is a word of the block's shared
/// memory. Its result, the same in every thread: whether the sync passed (false: the rank gave up,
/// now or before, and its failed mark is set).
__device__ inline bool p2p_sync_in_block(const p2p_sync_args& a, std::uint32_t sync,
                                         volatile int* gave_up) {
  const int j = static_cast<int>(threadIdx.x);
  const bool member = j < a.count && a.members[j] != a.rank;
  if (j == 0)
    *gave_up = p2p_may_start(*static_cast<volatile std::uint64_t*>(a.counters + a.rank)) ? 0 : 1;
  __syncthreads();
  p2p_device_sync_memory m{a, sync, j, gave_up};
  std::uint64_t want = 0;
  if (member && *gave_up == 0) want = p2p_sync_arrive(m, a.members[j]);
  if (member && want != 0) {
    m.start = p2p_clock_ns();
    (void)p2p_sync_wait(m, a.members[j], want);
  }
  __syncthreads();
  // A rank that gave up, now or before, publishes no epoch: its peers must not pass on the one
  // it counted (or on any earlier flag of it) when they arrive.
  const bool passed = *gave_up == 0;
  if (member && !passed) p2p_sync_abandon(m, a.members[j]);
  __syncthreads(); // every thread has read the note before a later sync of the block writes it
  return passed;
}

// The arguments stay in the parameter space (__grid_constant__), where p2p_sync_in_block reads
// them by reference, rather than being copied per thread.
template <class = void>
__global__ void __launch_bounds__(p2p_sync_threads)
    p2p_sync_kernel(const __grid_constant__ p2p_sync_args a) {
  __shared__ int gave_up; // this sync gave up, for any member (or the rank had failed before)
  (void)p2p_sync_in_block(a, a.sync, &gave_up);
}

} // namespace weft::cuda::detail
