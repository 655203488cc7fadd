#pragma once
// The life of a CUDA communicator (weft/cuda/nccl.cuh) as a host state machine: what each host
// call does in each state, when the native communicator is aborted and when it is finalized.
// Nothing here calls CUDA or NCCL: the native result codes come in as plain values
// (ncclSuccess, ncclInProgress), the communicator makes the native calls that the answers ask
// for, and the host tests drive every transition with made-up answers.
//
//              returned(in progress)             polled: not yet
//     +----+ ------------------------> +-------------+ ---+
//     | ok |                           | in_progress |    |
//     +----+ <------------------------ +-------------+ <--+
//       |  |      polled: done                |
//       |  | an error; the family failed      | an asynchronous error; the deadline
//       |  +---------------------+------------+
//       |                        v
//       |                   +--------+  owned: abort   +---------+
//       |                   | failed | --------------> | aborted | --> destroyed
//       |                   +--------+                 +---------+
//       | destroy                | destroy (borrowed: nothing to release)
//       v                        v
//   +------------+  done   +-----------+
//   | finalizing | ------> | destroyed |      finalizing, the deadline or an error: abort
//   +------------+         +-----------+
//
// A family is a communicator and the ones split from it: they share one failure_state, so the
// first failure of any of them fails all, and each later call of any of them throws at once
// with that first failure's message (a member that still holds its native communicator aborts
// it first). Only an owned native communicator is ever aborted or finalized: a borrowed one
// stays the program's, which aborts or destroys it itself.
//
// The stream after an abort. The abort makes the native library's kernels return, but work
// queued behind them on the communicator's stream (weft's own copy and reduce kernels of the
// failed call) still runs and may write the call's buffers. So before a failure leaves the
// call, a communicator that has just aborted drains its stream, polled at most a bound
// (drain_bound: the communicator's deadline, at least drain_floor): idle, or broken (a CUDA
// error: the device runs nothing of it any more), the failure leaves; still busy at the bound,
// the process must not return into the program with that work queued, and the job ends
// (end_job: weft's message, then MPI_Abort or std::abort), whatever the policy says. A borrowed
// communicator is never aborted by weft and so never drained: the program that owns it aborts
// it and waits for the stream itself.
#include <weft/comm/failure.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace weft::cuda::detail {

/// The native library's result codes that the state machine tells apart (for NCCL:
/// ncclSuccess and ncclInProgress); every other value is an error.
struct native_codes {
  int success = 0;
  int in_progress = 0;
};

enum class comm_phase {
  ok,          // usable
  in_progress, // a native call answered "in progress": polled until it settles
  failed,      // the family failed; the native communicator is still allocated
  aborted,     // the native communicator is aborted: every call throws
  finalizing,  // being destroyed: finalized, polled until quiet within the deadline
  destroyed,   // nothing native is left
};

[[nodiscard]] constexpr std::string_view name_of(comm_phase p) noexcept {
  switch (p) {
    case comm_phase::ok: return "ok";
    case comm_phase::in_progress: return "in_progress";
    case comm_phase::failed: return "failed";
    case comm_phase::aborted: return "aborted";
    case comm_phase::finalizing: return "finalizing";
    case comm_phase::destroyed: return "destroyed";
  }
  return "?";
}

/// What the communicator does next, as the state machine answers it.
enum class comm_action {
  proceed,        // go on: the call, or the wait, is done
  poll,           // ask again (the asynchronous error, the stream) until the deadline
  record_failure, // an error or the deadline: describe it and call fail(what)
  abort,          // abort the native communicator, then call aborted()
  throw_failure,  // throw the family's failure; nothing native is left to do
  finalize,       // destroying: finalize the native communicator, then finalize_returned()
  destroy,        // destroying: destroy the native communicator (it waits for no one now)
  none,           // destroying: nothing native to release
  end_job,        // the stream did not drain after an abort: end the job (end_job())
};

[[nodiscard]] constexpr std::string_view name_of(comm_action a) noexcept {
  switch (a) {
    case comm_action::proceed: return "proceed";
    case comm_action::poll: return "poll";
    case comm_action::record_failure: return "record_failure";
    case comm_action::abort: return "abort";
    case comm_action::throw_failure: return "throw_failure";
    case comm_action::finalize: return "finalize";
    case comm_action::destroy: return "destroy";
    case comm_action::none: return "none";
    case comm_action::end_job: return "end_job";
  }
  return "?";
}

/// One poll's verdict from what the native asynchronous error, the awaited work and the clock
/// say. An asynchronous error wins over everything (a peer's failure shows there); work done
/// wins over the deadline (a late answer is still an answer).
enum class poll_verdict { done, waiting, async_error, timed_out };

[[nodiscard]] constexpr poll_verdict judge_poll(native_codes codes, int async, bool work_done,
                                                bool deadline_passed) noexcept {
  if (async != codes.success && async != codes.in_progress) return poll_verdict::async_error;
  if (async == codes.success && work_done) return poll_verdict::done;
  return deadline_passed ? poll_verdict::timed_out : poll_verdict::waiting;
}

/// The least time a drain gets: the abort returns NCCL's kernels within milliseconds, and weft's
/// kernels behind them move data at device bandwidth, but the stream may also hold the program's
/// own kernels queued before the call (a training step's: up to seconds), which must not end the
/// job when the deadline is short.
inline constexpr std::chrono::milliseconds drain_floor = std::chrono::seconds(10);

/// How long a drain after an abort may take, for a communicator whose deadline is `timeout`.
[[nodiscard]] constexpr std::chrono::milliseconds drain_bound(
    std::chrono::milliseconds timeout) noexcept {
  return std::max(timeout, drain_floor);
}

/// What one query of the communicator's stream answers (for CUDA: cudaSuccess, cudaErrorNotReady,
/// or an error, after which the device runs none of the stream's work).
enum class stream_poll { idle, busy, broken };

/// One poll of the stream after an abort, before the failure leaves the call (see the header
/// comment): proceed (let the failure leave) once nothing of the stream runs any more, poll
/// while it is busy within the bound, end_job when it is still busy at the bound. A stream
/// that drains is an answer even at the bound.
[[nodiscard]] constexpr comm_action judge_drain(stream_poll stream, bool bound_passed) noexcept {
  if (stream != stream_poll::busy) return comm_action::proceed;
  return bound_passed ? comm_action::end_job : comm_action::poll;
}

/// Ends the job after a failure: prints `what` and `reason` (weft::detail::print_abort_message),
/// then calls `end` where there is one (MPI_Abort, for a job of MPI processes), then std::abort().
/// What on_failure::abort_job does, and what a stream that does not drain after an abort forces.
[[noreturn]] WEFT_COLD inline void end_job(
    std::string_view what, void (*end)() noexcept,
    std::string_view reason = "on_failure::abort_job") noexcept {
  weft::detail::print_abort_message(what, reason);
  if (end != nullptr) end();
  std::abort();
}

class comm_state {
public:
  comm_state(native_codes codes, bool owned, std::shared_ptr<weft::detail::failure_state> family,
             on_failure policy = on_failure::throw_error)
      : codes_(codes), owned_(owned), policy_(policy), family_(std::move(family)) {
    if (!family_) family_ = std::make_shared<weft::detail::failure_state>();
  }

  [[nodiscard]] comm_phase phase() const noexcept { return phase_; }
  [[nodiscard]] bool owned() const noexcept { return owned_; }
  [[nodiscard]] on_failure policy() const noexcept { return policy_; }
  void set_policy(on_failure p) noexcept { policy_ = p; }
  /// The failure state this communicator shares with its family (give it to a split).
  [[nodiscard]] const std::shared_ptr<weft::detail::failure_state>& family() const noexcept {
    return family_;
  }
  /// Why the last poll that asked for record_failure did: async_error or timed_out.
  [[nodiscard]] poll_verdict last_verdict() const noexcept { return last_; }
  /// Whether the native communicator is still allocated and this one's to abort.
  [[nodiscard]] bool holds_native() const noexcept {
    return owned_ && phase_ != comm_phase::aborted && phase_ != comm_phase::destroyed;
  }

  /// A host call starts: proceed when usable; once the family has failed, abort (this one's
  /// native communicator may still be waiting for a dead peer) or throw at once.
  [[nodiscard]] comm_action enter() noexcept {
    if (phase_ == comm_phase::ok && !family_->failed()) return comm_action::proceed;
    if (phase_ == comm_phase::ok || phase_ == comm_phase::in_progress) phase_ = comm_phase::failed;
    return failure_action();
  }

  /// A native call returned `result`. (Outside ok and in_progress nothing native is called:
  /// an answer then changes nothing and is a failure.)
  [[nodiscard]] comm_action returned(int result) noexcept {
    if (!usable()) return comm_action::record_failure;
    if (result == codes_.success) {
      phase_ = comm_phase::ok;
      return comm_action::proceed;
    }
    if (result == codes_.in_progress) {
      phase_ = comm_phase::in_progress;
      return comm_action::poll;
    }
    return comm_action::record_failure;
  }

  /// One poll of a host wait, or of a call that is in progress (work_done: true).
  [[nodiscard]] comm_action polled(int async, bool work_done, bool deadline_passed) noexcept {
    last_ = judge_poll(codes_, async, work_done, deadline_passed);
    if (!usable() && last_ != poll_verdict::async_error) last_ = poll_verdict::timed_out;
    if (!usable()) return comm_action::record_failure;
    switch (last_) {
      case poll_verdict::done: phase_ = comm_phase::ok; return comm_action::proceed;
      case poll_verdict::waiting: return comm_action::poll;
      default: return comm_action::record_failure;
    }
  }

  /// Records `what` as the family's failure (the first one recorded stays) and answers abort
  /// when this one still holds a native communicator, else throw_failure.
  [[nodiscard]] comm_action fail(const std::string& what) {
    family_->fail(what);
    if (phase_ != comm_phase::aborted && phase_ != comm_phase::destroyed)
      phase_ = comm_phase::failed;
    return failure_action();
  }

  /// The native communicator was aborted. The caller then drains the stream before the failure
  /// leaves (judge_drain).
  void aborted() noexcept { phase_ = comm_phase::aborted; }

  /// Whether a failure ends the job (on_failure::abort_job) rather than throws.
  [[nodiscard]] bool ends_job() const noexcept { return policy_ == on_failure::abort_job; }

  /// Destruction starts. `abort_requested`: the program asked for an abort, or the stream's
  /// work did not finish within the deadline. A borrowed or already aborted communicator has
  /// nothing to release; a failed family aborts; a healthy one is finalized.
  [[nodiscard]] comm_action destroy_begin(bool abort_requested) noexcept {
    if (!holds_native()) {
      phase_ = comm_phase::destroyed;
      return comm_action::none;
    }
    if (abort_requested || phase_ != comm_phase::ok || family_->failed()) return comm_action::abort;
    phase_ = comm_phase::finalizing;
    return comm_action::finalize;
  }

  /// The native finalize returned `result`: destroy when it is done, poll while in progress,
  /// abort on an error.
  [[nodiscard]] comm_action finalize_returned(int result) noexcept {
    if (result == codes_.success) return comm_action::destroy;
    if (result == codes_.in_progress) return comm_action::poll;
    return comm_action::abort;
  }

  /// One poll of a finalize: destroy once quiet, abort on an error or at the deadline.
  [[nodiscard]] comm_action finalize_polled(int async, bool deadline_passed) noexcept {
    if (async == codes_.success) return comm_action::destroy;
    if (async == codes_.in_progress && !deadline_passed) return comm_action::poll;
    return comm_action::abort;
  }

  /// The native communicator was destroyed (or aborted during destruction).
  void destroyed() noexcept { phase_ = comm_phase::destroyed; }

private:
  [[nodiscard]] bool usable() const noexcept {
    return phase_ == comm_phase::ok || phase_ == comm_phase::in_progress;
  }
  [[nodiscard]] comm_action failure_action() const noexcept {
    return phase_ == comm_phase::failed && owned_ ? comm_action::abort : comm_action::throw_failure;
  }

  native_codes codes_;
  bool owned_;
  on_failure policy_;
  std::shared_ptr<weft::detail::failure_state> family_;
  comm_phase phase_ = comm_phase::ok;
  poll_verdict last_ = poll_verdict::done;
};

} // namespace weft::cuda::detail
