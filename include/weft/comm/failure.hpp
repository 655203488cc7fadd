#pragma once
// What a communicator does when one of its operations fails part-way (a deadline, a peer's
// error, a check that fails after data moved), and the state it is in afterwards.
//
//   on_failure::throw_error   the call throws weft::error; the communicator (and every
//                             communicator split from it) is failed: each later call throws
//                             at once with the first failure's message. The buffers of the
//                             failed call are the caller's again: no request of the transport
//                             still reads or writes them.
//   on_failure::abort_job     weft prints the error to stderr and ends the job (MPI_Abort on
//                             weft::mpi; std::abort on a single process), the way a training
//                             job is torn down rather than left running on a broken
//                             communicator.
//
// Errors found before any data moves (a bad argument, a plan for another rank, ranks that
// disagree on the call under WEFT_CHECK_CALLS) are not failures of the communicator: they
// throw and leave it usable. docs/reliability.md says what a program may do after each.
#include <weft/core/error.hpp>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

namespace weft {

enum class on_failure {
  /// Throw weft::error; the communicator is failed from then on.
  throw_error,
  /// Print weft's error and end the job.
  abort_job,
};

[[nodiscard]] constexpr std::string_view name_of(on_failure p) noexcept {
  return p == on_failure::throw_error ? "throw_error" : "abort_job";
}

namespace detail {

/// The failed state of a family of communicators (one and its splits): the first failure's
/// message, kept for good once recorded. Thread-safe: a progress thread and the caller's
/// thread may fail and check it at once.
class failure_state {
public:
  [[nodiscard]] bool failed() const noexcept { return failed_.load(std::memory_order_acquire); }

  /// Records `what` as the failure, unless one is already recorded; returns the one recorded.
  std::string fail(const std::string& what) {
    std::lock_guard lock(mutex_);
    if (!failed_.load(std::memory_order_relaxed)) {
      what_ = what;
      failed_.store(true, std::memory_order_release);
    }
    return what_;
  }

  /// The recorded failure ("" while there is none).
  [[nodiscard]] std::string what() const {
    std::lock_guard lock(mutex_);
    return what_;
  }

  /// Throws, if the family failed, a weft::error for `operation` on `rank` that quotes the
  /// first failure.
  void check(std::string_view operation, int rank) const {
    if (failed()) rethrow(operation, rank);
  }

  [[noreturn]] WEFT_COLD void rethrow(std::string_view operation, int rank) const {
    throw error(operation, rank, error::unknown,
                "the communicator failed earlier and cannot be used again (abort the job, or on "
                "weft::local continue on shrink()): " +
                    what());
  }

private:
  mutable std::mutex mutex_;
  std::atomic<bool> failed_{false};
  std::string what_;
};

/// Prints a failure the way weft reports it before it ends the job; `reason` says why the job
/// ends (the policy, or what left no other way).
WEFT_COLD inline void print_abort_message(
    std::string_view what, std::string_view reason = "on_failure::abort_job") noexcept {
  std::fprintf(stderr, "%.*s\nweft: ending the job (%.*s)\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(reason.size()), reason.data());
  std::fflush(stderr);
}

} // namespace detail

} // namespace weft
