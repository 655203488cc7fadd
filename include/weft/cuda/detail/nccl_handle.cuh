#pragma once
// The ncclComm_t as the NCCL communicator (weft/cuda/nccl.cuh) holds and polls it: NCCL's
// failures as weft::error, the owned-or-borrowed handle, the non-blocking configuration of
// every communicator weft makes, and the wait for a new one to settle, bounded by a deadline
// (the states are detail/comm_state.hpp's).
#include <weft/core/error.hpp>
#include <weft/cuda/detail/comm_state.hpp>
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/error.cuh>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <string_view>
#include <utility>

namespace weft::cuda::detail {

/// "`call` failed: " and NCCL's name for `r`, then NCCL's last message for `comm`, if any.
WEFT_COLD inline std::string nccl_failure_text(ncclResult_t r, std::string_view call,
                                               ncclComm_t comm) {
  std::string what = std::string(call) + " failed: " + nccl_error_text(r);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') what += ": " + std::string(last);
  return what;
}

[[noreturn]] WEFT_COLD inline void nccl_fail(ncclResult_t r, std::string_view call,
                                             std::string_view operation, int rank, int peer,
                                             ncclComm_t comm) {
  throw error(operation, rank, peer, nccl_failure_text(r, call, comm));
}

inline void nccl_check(ncclResult_t r, std::string_view call, std::string_view operation, int rank,
                       int peer = error::unknown, ncclComm_t comm = nullptr) {
  if (r != ncclSuccess) nccl_fail(r, call, operation, rank, peer, comm);
}
/// An ncclComm_t, owned or the program's. The communicator releases an owned one itself, bounded
/// by its deadline (finalized, or aborted); what is still held when this goes (a constructor
/// that threw) is aborted, which waits for no peer.
class nccl_comm_handle {
public:
  nccl_comm_handle() = default;
  nccl_comm_handle(ncclComm_t comm, bool owned) noexcept : comm_(comm), owned_(owned) {}
  nccl_comm_handle(nccl_comm_handle&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), owned_(std::exchange(o.owned_, false)) {}
  nccl_comm_handle& operator=(nccl_comm_handle&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      owned_ = std::exchange(o.owned_, false);
    }
    return *this;
  }
  nccl_comm_handle(const nccl_comm_handle&) = delete;
  nccl_comm_handle& operator=(const nccl_comm_handle&) = delete;
  ~nccl_comm_handle() { release(); }

  [[nodiscard]] ncclComm_t get() const noexcept { return comm_; }
  [[nodiscard]] bool owned() const noexcept { return owned_; }
  /// Lets go of the communicator without a call: it was aborted or destroyed, or is borrowed.
  void forget() noexcept { comm_ = nullptr; }

private:
  void release() noexcept {
    if (owned_ && comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    owned_ = false;
  }

  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
};

/// NCCL's result codes as the host state machine (detail/comm_state.hpp) takes them.
inline constexpr native_codes nccl_codes{static_cast<int>(ncclSuccess),
                                         static_cast<int>(ncclInProgress)};

/// The configuration of every communicator weft makes: non-blocking, so that no NCCL call
/// waits without weft's deadline (a call may answer ncclInProgress, and weft polls
/// ncclCommGetAsyncError until it settles).
inline ncclConfig_t nonblocking_config() noexcept {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

/// NCCL's asynchronous state of `comm`: ncclInProgress while a non-blocking call is settling,
/// an error once one happened (a peer's failure shows here), else ncclSuccess. A failure of
/// the query itself is answered as that failure.
inline ncclResult_t nccl_async_state(ncclComm_t comm) noexcept {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &async);
  return r != ncclSuccess ? r : async;
}

/// Polls a new communicator (ncclCommInitRankConfig, ncclCommSplit) whose call answered `r`
/// until it is ready, at most until `deadline`. Returns "" when it is; else aborts it and
/// returns what went wrong.
[[nodiscard]] inline std::string nccl_settle_new(ncclComm_t comm, ncclResult_t r,
                                                 std::string_view call,
                                                 std::chrono::steady_clock::time_point deadline,
                                                 std::chrono::milliseconds timeout) {
  comm_state state(nccl_codes, true, nullptr);
  const comm_action first = state.returned(static_cast<int>(r));
  comm_action a = first;
  if (a == comm_action::poll) {
    (void)poll_until(
        [&] {
          a = state.polled(static_cast<int>(nccl_async_state(comm)), true, false);
          return a == comm_action::poll ? cudaErrorNotReady : cudaSuccess;
        },
        deadline, [] {});
    if (a == comm_action::poll)
      a = state.polled(static_cast<int>(nccl_async_state(comm)), true, true);
  }
  if (a == comm_action::proceed) return {};
  std::string what;
  if (state.last_verdict() == poll_verdict::timed_out) {
    what = "timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
           std::string(call) +
           " to complete (does every rank make the call?); the new NCCL communicator is aborted";
  } else {
    const ncclResult_t e = first == comm_action::record_failure ? r : nccl_async_state(comm);
    what = nccl_failure_text(e, call, comm);
  }
  if (comm != nullptr) (void)ncclCommAbort(comm);
  return what;
}

} // namespace weft::cuda::detail
