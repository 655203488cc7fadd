#pragma once
// The epochs of the p2p transport's syncs (detail/p2p_sync.cuh) and what a failure does to
// them: the rules the sync kernel follows, as functions the host tests run too.
//
//   counters[q]  (rank r's workspace)  the epoch of the pair r, q: the syncs r has made with q
//   flags[q]     (rank r's workspace)  the epoch q has reached with r, stored there by q
//
// A sync at epoch e of r with q: r counts counters[q] = e, stores e into q's flags[r], and
// passes once its own flags[q] >= e. A timed-out sync leaves the pair half-advanced: r has
// counted (and published) an epoch that q never reached, or q publishes one later that r
// gave up on. So a rank fails for good at its first failed sync, and
//
//   - the failed sync stores e | abandoned into every member's flag: a peer that arrives late
//     at e, or at any later sync with r, reads "abandoned" and fails at once instead of
//     passing on r's stale flag (an abandoned flag passes no wait, whatever epoch it carries);
//   - r's failed mark stays set (counters[r], r's count with itself, which no sync makes: in
//     device memory, so a sync reads it cheaply before anything else), and so does its
//     host-mapped error word; every later sync of r reads the mark first and, set, neither
//     counts nor publishes a live epoch: it stores abandoned again and gives up. The host
//     writes the error word when it fails the communicator itself (a host deadline), and a
//     waiting sync that reads it gives up the same way;
//   - r's data steps (the copy, reduce and load kernels of its calls, and avg's divide) read
//     the same mark, once per block (p2p_data_gate), and do nothing once it is set: the sync
//     that gave up may be one that a peer passed on r's live flag, so r's later steps would
//     load data that no sync vouches for and write it into r's buffers;
//   - the host refuses to queue more (the communicator is failed).
//
// Hence after a failure no epoch of the rank advances, no flag it stored earlier can be taken
// for a later sync, and no data of the rank moves past the sync that gave up. A peer that read
// r's live flag e before the abandoned one replaced it passes e rightly (r had arrived, and what
// it wrote before the sync is visible); its next sync with r fails.
//
// The error word: bit 63 set (nonzero), the sync's number in bits 32..62, the cause in bits
// 16..23, the peer in bits 0..15.
#include <weft/core/config.hpp>

#include <cstdint>
#include <string_view>

namespace weft::cuda::detail {

/// The mark of a flag whose rank gave up: no wait passes on it.
inline constexpr std::uint64_t p2p_abandoned_bit = std::uint64_t{1} << 63;

WEFT_HOST_DEVICE constexpr std::uint64_t p2p_abandoned(std::uint64_t epoch) noexcept {
  return epoch | p2p_abandoned_bit;
}
WEFT_HOST_DEVICE constexpr bool p2p_is_abandoned(std::uint64_t flag) noexcept {
  return (flag & p2p_abandoned_bit) != 0;
}

/// Whether a step of the rank may start (a sync count and publish a new epoch, a data step move
/// data): only while the rank's failed mark (counters[rank]) is clear.
WEFT_HOST_DEVICE constexpr bool p2p_may_start(std::uint64_t failed_mark) noexcept {
  return failed_mark == 0;
}

/// The gate of a rank's data kernels (weft/cuda/kernels.cuh): each block reads the rank's failed
/// mark once, before it touches memory, and runs only while p2p_may_start says so. The mark is
/// device memory that only the rank's own syncs set, earlier on the same stream, so the read is
/// cheap and sees them.
struct p2p_data_gate {
  const std::uint64_t* failed_mark = nullptr; // counters[rank], in the rank's workspace

  WEFT_HOST_DEVICE bool operator()() const noexcept {
    return p2p_may_start(*static_cast<const volatile std::uint64_t*>(failed_mark));
  }
};

/// One look of a sync at the flag its peer stores, waiting for epoch `want`.
enum class p2p_wait {
  waiting,        // not there yet
  passed,         // the peer reached the epoch
  peer_abandoned, // the peer gave up: fail
  rank_failed,    // this rank failed meanwhile (another member, or its host): give up
  timed_out,      // the sync's time is over: fail
};

/// The flag decides first (a peer that arrived is an answer, even at the deadline; an
/// abandoned flag never passes), then this rank's own failure, then the clock.
WEFT_HOST_DEVICE constexpr p2p_wait p2p_judge_flag(std::uint64_t flag, std::uint64_t want,
                                                   bool rank_failed,
                                                   bool deadline_passed) noexcept {
  if (p2p_is_abandoned(flag)) return p2p_wait::peer_abandoned;
  if (flag >= want) return p2p_wait::passed;
  if (rank_failed) return p2p_wait::rank_failed;
  return deadline_passed ? p2p_wait::timed_out : p2p_wait::waiting;
}

/// One member's part of a sync of this rank with rank q, written once over a memory policy M so
/// that the sync kernel, the fused all-reduce kernels' barrier (detail/p2p_sync.cuh) and the host
/// tests' simulation on threads (plain atomics) follow the same steps. M gives:
///
///   counter(q), set_counter(q, e)  this rank's count of syncs with q (its own workspace)
///   publish(q, e)                  fence at system scope, then a release store of e into q's
///                                  flags[rank]
///   flag(q)                        a relaxed load of this rank's own flags[q]
///   failed()                       whether the rank failed meanwhile (another member gave up, or
///                                  its host wrote the error word); asked every few looks
///   late()                         whether the sync's time is over
///   pause()                        backs off between looks
///   give_up(w, q)                  records the failure: the error word (unless w is
///                                  rank_failed), the failed mark, the sync's "gave up" note
///   acquire()                      an acquire fence at system scope
///
/// A sync is p2p_sync_arrive for every member, then p2p_sync_wait for every member, then, where
/// the rank gave up (now or before), p2p_sync_abandon for every member: every member publishes
/// before any waits, so no two ranks wait on each other's unpublished flags.

/// Counts and publishes the next epoch with q; returns it.
template <class M>
WEFT_HOST_DEVICE std::uint64_t p2p_sync_arrive(M& m, int q) {
  const std::uint64_t want = m.counter(q) + 1;
  m.set_counter(q, want);
  m.publish(q, want);
  return want;
}

/// Waits until q reaches epoch `want`: true once it has (an acquire follows), false where the
/// wait ends in a failure, which it records (m.give_up).
template <class M>
WEFT_HOST_DEVICE bool p2p_sync_wait(M& m, int q, std::uint64_t want) {
  // Relaxed loads while it waits, then one acquire fence: an acquire load on every look would
  // also invalidate the L1 of an SM it shares with other ranks' data blocks.
  for (unsigned looks = 1;; ++looks) {
    const bool look = looks % 64 == 0; // the clock and the failures, every so often
    const p2p_wait w = p2p_judge_flag(m.flag(q), want, look && m.failed(looks), look && m.late());
    if (w == p2p_wait::passed) {
      m.acquire();
      return true;
    }
    if (w == p2p_wait::waiting) {
      if (look) m.pause();
      continue;
    }
    m.give_up(w, q);
    m.acquire();
    return false;
  }
}

/// What a rank that gave up, now or before, leaves in q's flag: its epoch marked abandoned, on
/// which no wait passes.
template <class M>
WEFT_HOST_DEVICE void p2p_sync_abandon(M& m, int q) {
  m.publish(q, p2p_abandoned(m.counter(q)));
}

/// Why a rank's error word is set.
enum class p2p_cause : std::uint32_t {
  timed_out = 0,      // a sync waited for the peer past its timeout
  peer_abandoned = 1, // a sync found the peer's flag abandoned: the peer failed first
  host_failed = 2,    // the host failed the communicator (its deadline, another error)
};

[[nodiscard]] constexpr std::string_view name_of(p2p_cause c) noexcept {
  switch (c) {
    case p2p_cause::timed_out: return "timed_out";
    case p2p_cause::peer_abandoned: return "peer_abandoned";
    case p2p_cause::host_failed: return "host_failed";
  }
  return "?";
}

WEFT_HOST_DEVICE constexpr std::uint64_t p2p_error_word(p2p_cause cause, std::uint32_t sync,
                                                        int peer) noexcept {
  return (std::uint64_t{1} << 63) | (std::uint64_t{sync & 0x7fffffffu} << 32) |
         (std::uint64_t{static_cast<std::uint32_t>(cause) & 0xffu} << 16) |
         (static_cast<std::uint32_t>(peer) & 0xffffu);
}

struct p2p_error {
  p2p_cause cause = p2p_cause::timed_out;
  std::uint32_t sync = 0;
  int peer = -1;
};

constexpr p2p_error p2p_read_error_word(std::uint64_t w) noexcept {
  return {static_cast<p2p_cause>((w >> 16) & 0xffu),
          static_cast<std::uint32_t>(w >> 32) & 0x7fffffffu, static_cast<int>(w & 0xffffu)};
}

/// The cause a sync that gives up records, from how its wait ended (rank_failed records none:
/// the word holds the first failure already).
WEFT_HOST_DEVICE constexpr p2p_cause p2p_cause_of(p2p_wait w) noexcept {
  return w == p2p_wait::peer_abandoned ? p2p_cause::peer_abandoned : p2p_cause::timed_out;
}

static_assert(p2p_read_error_word(p2p_error_word(p2p_cause::peer_abandoned, 0x12345, 7)).sync ==
              0x12345);
static_assert(p2p_read_error_word(p2p_error_word(p2p_cause::peer_abandoned, 0x12345, 7)).peer == 7);
static_assert(p2p_read_error_word(p2p_error_word(p2p_cause::host_failed, 3, 63)).cause ==
              p2p_cause::host_failed);
static_assert(p2p_error_word(p2p_cause::timed_out, 0, 0) != 0);

} // namespace weft::cuda::detail
