#pragma once
// In-flight MPI requests and the waits on them. Every wait has a deadline: MPI's own
// blocking calls (MPI_Wait, MPI_Recv) would hang forever on a peer that stalls, so weft
// polls with MPI_Test instead: a short spin, then yielding the core (ranks may outnumber
// cores, and the peer we wait for may need this one), then short sleeps once the wait is
// clearly long. While it waits it reads the family's control channel (another rank's verdict
// ends the wait at once); at the deadline it finds the rank that holds everyone up
// (mpi_family::investigate) and throws weft::error naming the operation, this rank, the peer
// it waited for and the culprit.
#include <weft/comm/detail/deadline.hpp>
#include <weft/comm/progress.hpp>
#include <weft/comm/transport/detail/mpi_comm_handle.hpp>
#include <weft/comm/transport/detail/mpi_error.hpp>
#include <weft/comm/transport/detail/mpi_family.hpp>
#include <weft/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::detail {

/// Whose wait this is, for the messages of its errors, and what else it keeps going.
struct mpi_wait_context {
  std::string_view operation;
  int rank = error::unknown;
  std::chrono::milliseconds timeout{};
  // The rank's progress counters (operation, sequence number, plan step, the peer it waits
  // on), for the message of a timeout and the answers to the control channel's queries;
  // null outside a recorded operation.
  progress_record* progress = nullptr;
  // The communicator's family: read while waiting (a verdict ends the wait), asked at the
  // deadline to find the culprit. `root_of` maps the communicator's ranks to the root's.
  mpi_family* family = nullptr;
  const std::vector<int>* root_of = nullptr;
  // Called on every poll of a long wait: a plan's sends that wait for their receivers' credit.
  void (*tick)(void*) = nullptr;
  void* tick_arg = nullptr;
};

/// How long a rank asked "where are you?" at a deadline has to answer: a rank waiting inside
/// weft answers within microseconds; one that does not answer in this time is stalled.
[[nodiscard]] inline std::chrono::milliseconds mpi_answer_window(
    std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 4, std::chrono::milliseconds(100), std::chrono::milliseconds(2000));
}

[[noreturn]] WEFT_COLD inline void mpi_timeout(const mpi_wait_context& ctx, int peer,
                                               std::string_view what) {
  std::string where;
  if (ctx.progress != nullptr && ctx.progress->active()) {
    where = " in " + ctx.progress->snapshot(ctx.rank, "running").position();
  }
  std::string mine = "timed out after " + std::to_string(ctx.timeout.count()) + " ms waiting to " +
                     std::string(what) + where;
  if (ctx.family == nullptr) {
    throw error(ctx.operation, ctx.rank, peer,
                mine +
                    " (is every rank alive and making the same calls in the same order? The peer's "
                    "own error, "
                    "if it has one, names its position)");
  }
  mpi_family& f = *ctx.family;
  const auto root = [&](int r) {
    return ctx.root_of != nullptr && r >= 0 && static_cast<std::size_t>(r) < ctx.root_of->size()
               ? (*ctx.root_of)[static_cast<std::size_t>(r)]
               : r;
  };
  std::vector<int> members;
  if (ctx.root_of != nullptr) members = *ctx.root_of;
  std::string found =
      "world rank " + std::to_string(f.world_rank_of(f.root_rank())) + ", which " + mine;
  if (peer >= 0) found += " (peer: world rank " + std::to_string(f.world_rank_of(root(peer))) + ")";
  const std::string verdict =
      f.investigate(peer >= 0 ? root(peer) : -1, members, mpi_answer_window(ctx.timeout), found);
  throw error(ctx.operation, ctx.rank, peer, mine + "; the communicator failed: " + verdict);
}

[[noreturn]] WEFT_COLD inline void mpi_stopped(const mpi_wait_context& ctx, int peer,
                                               std::string_view what) {
  std::string where;
  if (ctx.progress != nullptr && ctx.progress->active()) {
    where = " in " + ctx.progress->snapshot(ctx.rank, "running").position();
  }
  throw error(ctx.operation, ctx.rank, peer,
              "stopped waiting to " + std::string(what) + where +
                  ": the communicator failed: " + ctx.family->failure().what());
}

/// What a wait is waiting for now: a rank of the communicator (-1: none, or every rank of a
/// collective) and a string literal completing "waiting to ...".
struct mpi_waiting_for {
  int peer = error::unknown;
  const char* what = "";
};

/// Polls done() until it returns true. Meanwhile it runs the context's tick, reads the
/// family's control channel (a verdict: weft::error), and at the deadline finds the culprit
/// and throws weft::error. now() says what the wait waits for at the moment (a wait on several
/// requests moves from peer to peer as they complete): it is asked when the wait begins,
/// every 16th poll (for the progress record, which answers the control channel's queries)
/// and at the deadline, so that the error and the search for the culprit start from the peer
/// still outstanding, not from one that has long finished.
template <class Done, class Now>
requires std::is_invocable_r_v<mpi_waiting_for, Now&>
void mpi_poll(Done&& done, const mpi_wait_context& ctx, Now&& now) {
  for (int i = 0; i < 64; ++i) {
    if (done()) return;
    if (ctx.tick != nullptr) ctx.tick(ctx.tick_arg);
  }
  struct waiting_scope {
    progress_record* r;
    ~waiting_scope() {
      if (r != nullptr) r->not_waiting();
    }
  } const waiting{ctx.progress};
  mpi_waiting_for w = now();
  if (ctx.progress != nullptr) ctx.progress->waiting(w.peer, w.what);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = deadline_after(ctx.timeout);
  for (std::uint32_t i = 0;; ++i) {
    if (done()) return;
    if (ctx.tick != nullptr) ctx.tick(ctx.tick_arg);
    // The control channel is read every 16th poll: a verdict waits a few microseconds more,
    // and a short wait pays for no extra test.
    if (i % 16 == 15) {
      const mpi_waiting_for moved = now();
      if (ctx.progress != nullptr && (moved.peer != w.peer || moved.what != w.what)) {
        ctx.progress->waiting(moved.peer, moved.what);
      }
      w = moved;
      if (ctx.family != nullptr) {
        ctx.family->poll();
        if (ctx.family->failure().failed()) mpi_stopped(ctx, w.peer, w.what);
      }
    }
    const auto t = std::chrono::steady_clock::now();
    if (t >= deadline) {
      if (done()) return;
      w = now();
      mpi_timeout(ctx, w.peer, w.what);
    }
    // A wait this long is a peer still computing, not a message in flight: stop competing
    // with it for the core. Before that, yielding keeps the latency of a hand-off low.
    if (t - start < std::chrono::milliseconds(10)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

/// The same for a wait on one peer (or none) for one reason.
template <class Done>
void mpi_poll(Done&& done, const mpi_wait_context& ctx, int peer, const char* what) {
  mpi_poll(std::forward<Done>(done), ctx, [peer, what] { return mpi_waiting_for{peer, what}; });
}

/// Waits for one request that has no peer of its own (a collective: barrier, broadcast,
/// all-gather, dup); `what` completes "waiting to ...". On a failure the request stays with
/// MPI (a nonblocking collective can be neither cancelled nor freed): its buffers must be
/// parked by the caller, and its communicator is never freed (the family failed).
inline void mpi_wait(MPI_Request& request, const mpi_wait_context& ctx, const char* what) {
  int rc = MPI_SUCCESS;
  mpi_poll(
      [&] {
        int flag = 0;
        rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
        return rc != MPI_SUCCESS || flag != 0;
      },
      ctx, -1, what);
  if (rc != MPI_SUCCESS)
    mpi_fail(rc, "MPI_Test", __FILE__, __LINE__, ctx.operation, ctx.rank, error::unknown);
}

/// What retiring a set of requests left live.
struct mpi_retired {
  bool caller_memory = false; // a request on the caller's buffers is still live
  bool weft_memory = false;   // a request on weft's own buffers (staging, scratch, copies) is
};

/// A set of point-to-point requests: sends, and receives that must deliver an exact
/// number of elements. Waiting checks each receive's count, so ranks that disagree on a
/// call get an error instead of silently short data. After a failure, retire() ends every
/// request before the call returns: see there.
class mpi_requests {
public:
  mpi_requests() = default;
  mpi_requests(mpi_requests&&) noexcept = default;
  mpi_requests& operator=(mpi_requests&&) noexcept = default;
  mpi_requests(const mpi_requests&) = delete;
  mpi_requests& operator=(const mpi_requests&) = delete;
  ~mpi_requests() { (void)retire(std::chrono::milliseconds(0)); }

  [[nodiscard]] std::size_t size() const noexcept { return requests_.size(); }

  /// Appends a send to `peer`; returns the request for MPI_Isend to fill. `weft_memory`: the
  /// data is weft's own (scratch, a copy), not the caller's buffer.
  MPI_Request& add_send(int peer, bool weft_memory = false) {
    return add({peer, send_marker, weft_memory});
  }
  /// Appends a receive from `peer` that must deliver `count` elements.
  MPI_Request& add_recv(int peer, std::size_t count, bool weft_memory = false) {
    return add({peer, static_cast<std::int64_t>(count), weft_memory});
  }

  /// Makes slot i a receive from `peer` of `count` elements into weft's memory; the slot
  /// must be idle.
  MPI_Request& set_recv(std::size_t i, int peer, std::size_t count) {
    entries_[i] = {peer, static_cast<std::int64_t>(count), true};
    return requests_[i];
  }
  /// n idle slots, for set_recv.
  void resize(std::size_t n) {
    requests_.assign(n, MPI_REQUEST_NULL);
    entries_.assign(n, {error::unknown, send_marker, true});
  }

  /// Waits for slot i; checks a receive's count against `type`.
  void wait(std::size_t i, MPI_Datatype type, std::string_view type_name,
            const mpi_wait_context& ctx) {
    MPI_Status status{};
    int rc = MPI_SUCCESS;
    mpi_poll(
        [&] {
          int flag = 0;
          rc = MPI_Test(&requests_[i], &flag, &status);
          return rc != MPI_SUCCESS || flag != 0;
        },
        ctx, entries_[i].peer, describe(entries_[i]));
    if (rc != MPI_SUCCESS) fail(rc, "MPI_Test", entries_[i], ctx, type_name);
    check(status, entries_[i], type, type_name, ctx);
  }

  /// Whether every request has completed, without waiting; when they have, forgets them all.
  /// A failed request, or a receive of another count, is a weft::error.
  bool test_all(MPI_Datatype type, std::string_view type_name, const mpi_wait_context& ctx) {
    const std::size_t n = requests_.size();
    if (n == 0) return true;
    indices_.resize(n);
    statuses_.resize(n);
    int completed = 0;
    const int rc = MPI_Testsome(static_cast<int>(n), requests_.data(), &completed, indices_.data(),
                                statuses_.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS)
      fail(rc, "MPI_Testsome", entry{}, ctx, type_name);
    if (completed != MPI_UNDEFINED) {
      for (int k = 0; k < completed; ++k) {
        const auto i = static_cast<std::size_t>(indices_[static_cast<std::size_t>(k)]);
        const MPI_Status& st = statuses_[static_cast<std::size_t>(k)];
        if (rc == MPI_ERR_IN_STATUS && st.MPI_ERROR != MPI_SUCCESS)
          fail(st.MPI_ERROR, describe_call(entries_[i]), entries_[i], ctx, type_name);
        check(st, entries_[i], type, type_name, ctx);
      }
    }
    for (const MPI_Request& r : requests_) {
      if (r != MPI_REQUEST_NULL) return false;
    }
    requests_.clear();
    entries_.clear();
    return true;
  }

  /// Waits for every request, then forgets them all.
  void wait_all(MPI_Datatype type, std::string_view type_name, const mpi_wait_context& ctx) {
    if (requests_.empty()) return;
    mpi_poll([&] { return test_all(type, type_name, ctx); }, ctx,
             [&] {
               return mpi_waiting_for{first_pending_peer(), first_pending_what()};
             });
  }

  /// The peer of the first request still in flight (-1: none).
  [[nodiscard]] int first_pending_peer() const noexcept {
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] != MPI_REQUEST_NULL) return entries_[i].peer;
    }
    return error::unknown;
  }
  [[nodiscard]] const char* first_pending_what() const noexcept {
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] != MPI_REQUEST_NULL) return describe(entries_[i]);
    }
    return "complete its messages";
  }

  /// Ends every request after a failure, before the call that failed returns. What is in
  /// flight gets `window` to complete (a peer still in the call finishes its part); then the
  /// receives still pending are cancelled, and the cancellations get `window` too. Sends
  /// cannot be cancelled (MPI 4.0 deprecates it; Open MPI ignores it). What is still live
  /// after that is released to MPI and reported: the caller parks weft's memory and must
  /// not return into the program while the caller's buffer is still in use. Never throws.
  mpi_retired retire(std::chrono::milliseconds window) noexcept {
    mpi_retired left;
    if (requests_.empty()) return left;
    if (!mpi_alive()) {
      requests_.clear();
      entries_.clear();
      return left;
    }
    const auto settle = [&] {
      const auto until = std::chrono::steady_clock::now() + window;
      int flag = 0;
      while (MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                         MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
             flag == 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      // MPI_Testall may leave completed requests set when one of them failed: test each.
      for (MPI_Request& r : requests_) {
        if (r == MPI_REQUEST_NULL) continue;
        int done = 0;
        if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) r = MPI_REQUEST_NULL;
      }
    };
    settle();
    bool cancelled = false;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] != MPI_REQUEST_NULL && entries_[i].count != send_marker) {
        MPI_Cancel(&requests_[i]);
        cancelled = true;
      }
    }
    if (cancelled) settle();
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      (entries_[i].weft_memory ? left.weft_memory : left.caller_memory) = true;
      MPI_Request_free(&requests_[i]);
    }
    requests_.clear();
    entries_.clear();
    return left;
  }

private:
  static constexpr std::int64_t send_marker = -1;

  struct entry {
    int peer = error::unknown;
    std::int64_t count = send_marker; // elements a receive must deliver; send_marker: a send
    bool weft_memory = false;         // the buffer is weft's, not the caller's
  };

  MPI_Request& add(entry e) {
    entries_.push_back(e);
    requests_.push_back(MPI_REQUEST_NULL);
    return requests_.back();
  }

  static const char* describe(const entry& e) {
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
};

} // namespace weft::detail
