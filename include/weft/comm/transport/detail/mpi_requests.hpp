#pragma once
// In-flight MPI requests and the waits on them. Every wait has a deadline: MPI's own
// blocking calls (MPI_Wait, MPI_Recv) would hang forever on a peer that stalls, so weft
// polls with MPI_Test instead: a short spin, then yielding the core (ranks may outnumber
// cores, and the peer we wait for may need this one), then short sleeps once the wait is
// clearly long. At the deadline it throws weft::error naming the operation, the rank and
// the peer it was waiting for.
#include <weft/comm/transport/detail/mpi_comm_handle.hpp>
#include <weft/comm/transport/detail/mpi_error.hpp>
#include <weft/comm/detail/deadline.hpp>
#include <weft/comm/progress.hpp>
#include <weft/core/error.hpp>

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace weft::detail {

/// Whose wait this is, for the messages of its errors.
struct mpi_wait_context {
  std::string_view operation;
  int rank = error::unknown;
  std::chrono::milliseconds timeout{};
  // The rank's progress counters (operation, sequence number, plan step), for the message of
  // a timeout; null outside a recorded operation.
  const progress_record* progress = nullptr;
};

/// Polls done() until it returns true (then true) or the deadline passes (then false).
template <class Done>
bool mpi_poll(Done&& done, std::chrono::milliseconds timeout) {
  for (int i = 0; i < 64; ++i) {
    if (done()) return true;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = deadline_after(timeout);
  for (;;) {
    if (done()) return true;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return done();
    // A wait this long is a peer still computing, not a message in flight: stop competing
    // with it for the core. Before that, yielding keeps the latency of a hand-off low.
    if (now - start < std::chrono::milliseconds(10)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

[[noreturn]] inline void mpi_timeout(const mpi_wait_context& ctx, int peer, std::string_view what) {
  std::string where;
  if (ctx.progress != nullptr && ctx.progress->active()) {
    where = " in " + ctx.progress->snapshot(ctx.rank, "running").position();
  }
  throw error(ctx.operation, ctx.rank, peer,
              "timed out after " + std::to_string(ctx.timeout.count()) + " ms waiting to " +
                  std::string(what) + where +
                  " (is every rank alive and making the same calls in the same order? The peer's "
                  "own error, if it has one, names its position)");
}

/// Waits for one request that has no peer of its own (a collective: barrier, broadcast,
/// all-gather, dup); `what` completes "waiting to ...".
inline void mpi_wait(MPI_Request& request, const mpi_wait_context& ctx, std::string_view what) {
  int rc = MPI_SUCCESS;
  const bool done = mpi_poll(
      [&] {
        int flag = 0;
        rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
        return rc != MPI_SUCCESS || flag != 0;
      },
      ctx.timeout);
  if (rc != MPI_SUCCESS)
    mpi_fail(rc, "MPI_Test", __FILE__, __LINE__, ctx.operation, ctx.rank, error::unknown);
  // On a timeout the request stays with MPI: a nonblocking collective can be neither
  // cancelled nor freed, and the communicator is not usable after this error anyway.
  if (!done) mpi_timeout(ctx, error::unknown, what);
}

/// A set of point-to-point requests: sends, and receives that must deliver an exact
/// number of elements. Waiting checks each receive's count, so ranks that disagree on a
/// call get an error instead of silently short data. What is still in flight when the set
/// is abandoned (an exception on the way out) is cancelled where MPI allows it (receives)
/// and released, so MPI does not write into buffers the unwinding is about to free.
class mpi_requests {
public:
  mpi_requests() = default;
  mpi_requests(mpi_requests&&) noexcept = default;
  mpi_requests& operator=(mpi_requests&&) noexcept = default;
  mpi_requests(const mpi_requests&) = delete;
  mpi_requests& operator=(const mpi_requests&) = delete;
  ~mpi_requests() { abandon(); }

  [[nodiscard]] std::size_t size() const noexcept { return requests_.size(); }

  /// Appends a send to `peer`; returns the request for MPI_Isend to fill.
  MPI_Request& add_send(int peer) { return add({peer, send_marker}); }
  /// Appends a receive from `peer` that must deliver `count` elements.
  MPI_Request& add_recv(int peer, std::size_t count) {
    return add({peer, static_cast<std::int64_t>(count)});
  }

  /// Makes slot i a receive from `peer` of `count` elements; the slot must be idle.
  MPI_Request& set_recv(std::size_t i, int peer, std::size_t count) {
    entries_[i] = {peer, static_cast<std::int64_t>(count)};
    return requests_[i];
  }
  /// n idle slots, for set_recv.
  void resize(std::size_t n) {
    abandon();
    requests_.assign(n, MPI_REQUEST_NULL);
    entries_.assign(n, {error::unknown, send_marker});
  }

  /// Waits for slot i; checks a receive's count against `type`.
  void wait(std::size_t i, MPI_Datatype type, std::string_view type_name,
            const mpi_wait_context& ctx) {
    MPI_Status status{};
    int rc = MPI_SUCCESS;
    const bool done = mpi_poll(
        [&] {
          int flag = 0;
          rc = MPI_Test(&requests_[i], &flag, &status);
          return rc != MPI_SUCCESS || flag != 0;
        },
        ctx.timeout);
    if (rc != MPI_SUCCESS) fail(rc, "MPI_Test", entries_[i], ctx, type_name);
    if (!done) mpi_timeout(ctx, entries_[i].peer, describe(entries_[i]));
    check(status, entries_[i], type, type_name, ctx);
  }

  /// Waits for every request, then forgets them all.
  void wait_all(MPI_Datatype type, std::string_view type_name, const mpi_wait_context& ctx) {
    const std::size_t n = requests_.size();
    if (n == 0) return;
    indices_.resize(n);
    statuses_.resize(n);
    int rc = MPI_SUCCESS;
    bool all_done = false;
    const auto progress = [&] {
      int completed = 0;
      rc = MPI_Testsome(static_cast<int>(n), requests_.data(), &completed, indices_.data(),
                        statuses_.data());
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) return true;
      if (completed == MPI_UNDEFINED) { // every request was already done
        all_done = true;
        return true;
      }
      for (int k = 0; k < completed; ++k) {
        const auto i = static_cast<std::size_t>(indices_[static_cast<std::size_t>(k)]);
        const MPI_Status& st = statuses_[static_cast<std::size_t>(k)];
        if (rc == MPI_ERR_IN_STATUS && st.MPI_ERROR != MPI_SUCCESS) {
          rc = st.MPI_ERROR;
          failed_ = i;
          return true;
        }
        check(st, entries_[i], type, type_name, ctx);
      }
      rc = MPI_SUCCESS;
      return false;
    };
    failed_ = n;
    const bool done = mpi_poll(progress, ctx.timeout);
    if (rc != MPI_SUCCESS) {
      if (failed_ < n)
        fail(rc, describe_call(entries_[failed_]), entries_[failed_], ctx, type_name);
      fail(rc, "MPI_Testsome", entry{}, ctx, type_name);
    }
    if (!done || !all_done) {
      for (std::size_t i = 0; i < n; ++i) {
        if (requests_[i] != MPI_REQUEST_NULL)
          mpi_timeout(ctx, entries_[i].peer, describe(entries_[i]));
      }
    }
    requests_.clear();
    entries_.clear();
  }

  /// Whether every request has completed, without waiting; when they have, forgets them all.
  /// A failed request is a weft::error, as in wait_all.
  bool test_all(std::string_view type_name, const mpi_wait_context& ctx) {
    if (requests_.empty()) return true;
    int flag = 0;
    const int rc = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                               MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) fail(rc, "MPI_Testall", entry{}, ctx, type_name);
    if (flag == 0) return false;
    requests_.clear();
    entries_.clear();
    return true;
  }

  /// Cancels the receives still in flight, gives them a moment to finish cancelling, and
  /// releases whatever is left. Never throws.
  void abandon() noexcept {
    if (requests_.empty()) return;
    if (!mpi_alive()) {
      requests_.clear();
      entries_.clear();
      return;
    }
    bool pending = false;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      pending = true;
      // Cancelling sends is deprecated (MPI 4.0) and unreliable; only receives.
      if (entries_[i].count != send_marker) MPI_Cancel(&requests_[i]);
    }
    if (pending) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      int flag = 0;
      while (MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                         MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
             flag == 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
      for (MPI_Request& r : requests_) {
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      }
    }
    requests_.clear();
    entries_.clear();
  }

private:
  static constexpr std::int64_t send_marker = -1;

  struct entry {
    int peer = error::unknown;
    std::int64_t count = send_marker; // elements a receive must deliver; send_marker: a send
  };

  MPI_Request& add(entry e) {
    entries_.push_back(e);
    requests_.push_back(MPI_REQUEST_NULL);
    return requests_.back();
  }

  static std::string_view describe(const entry& e) {
    return e.count == send_marker ? "have its message received" : "receive from it";
  }

  static std::string_view describe_call(const entry& e) {
    return e.count == send_marker ? "MPI_Isend" : "MPI_Irecv";
  }

  [[noreturn]] static void fail(int rc, std::string_view call, const entry& e,
                                const mpi_wait_context& ctx, std::string_view type_name) {
    int cls = MPI_ERR_UNKNOWN;
    MPI_Error_class(rc, &cls);
    if (cls == MPI_ERR_TRUNCATE && e.count != send_marker) {
      throw error(ctx.operation, ctx.rank, e.peer,
                  "expected " + std::to_string(e.count) + " x " + std::string(type_name) +
                      " but the peer sent more: the ranks disagree on the call (set "
                      "WEFT_CHECK_CALLS=1 to find where)");
    }
    mpi_fail(rc, call, __FILE__, __LINE__, ctx.operation, ctx.rank, e.peer);
  }

  static void check(const MPI_Status& status, const entry& e, MPI_Datatype type,
                    std::string_view type_name, const mpi_wait_context& ctx) {
    if (e.count == send_marker) return;
    int got = 0;
    WEFT_MPI_TRY(MPI_Get_count(&status, type, &got), ctx.operation, ctx.rank, e.peer);
    if (got != e.count) {
      throw error(
          ctx.operation, ctx.rank, e.peer,
          "expected " + std::to_string(e.count) + " x " + std::string(type_name) +
              " but the peer sent " +
              (got == MPI_UNDEFINED ? std::string("a different amount") : std::to_string(got)) +
              ": the ranks disagree on the call (set WEFT_CHECK_CALLS=1 to find where)");
    }
  }

  std::vector<MPI_Request> requests_;
  std::vector<entry> entries_;
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  std::size_t failed_ = 0;
};

} // namespace weft::detail
