#pragma once
// Progress counters and the flight recorder. Every rank of a host transport records where it
// is: the operation and its sequence number on its communicator, the plan round and step, and
// the peer it waits on. A stalled job then names its culprit: the watchdog (the deadline of
// every wait) follows "waits on" from the rank that timed out until it reaches a rank that
// waits on nobody (it is stuck in its own code, or never made the call) or closes a cycle
// (the ranks wait on each other: they made different calls), and every rank's error carries
// that verdict and the dump of all ranks' pending operations.
//
//   rank 2 | all_reduce #7 (comm 0, rank 2 of 4) | round 1 step 3 of 12 recv_reduce | busy 812 ms
//   rank 3 | all_reduce #7 (comm 0, rank 3 of 4) | round 1 step 2 of 12 recv
//          | waiting 805 ms on rank 2 to receive from it
//
// A record (one per rank per communicator, so a rank's progress thread keeps its own) is
// written only by the thread using that communicator and read by any: the counters are
// relaxed atomics (a dump is a snapshot, not a consistent cut), the operation's name sits
// behind a mutex that is taken once per operation.
#include <weft/comm/plan.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace weft {

/// One rank's position, as its communicator last recorded it (a copy, safe to keep).
struct rank_progress {
  int rank = 0;          // in the world of the transport (local::run's threads, MPI_COMM_WORLD)
  std::string status;    // "running", "finished", "failed", "left" (not in a shrunk world)
  std::string operation; // empty outside any operation
  std::uint64_t sequence = 0; // the operation's number on its communicator (1 = the first)
  int comm = 0;               // which communicator (0: the world's; splits count up)
  int comm_rank = 0;
  int comm_size = 0;
  std::uint32_t round = 0; // plan round and step (steps == 0: not a plan)
  std::size_t step = 0;
  std::size_t steps = 0;
  std::string step_kind;
  int waiting_on = -1;              // world rank, -1: not waiting
  int waiting_on_comm_rank = -1;    // the same peer's rank in the communicator
  std::string waiting_to;           // completes "waiting to ..."
  double busy_ms = 0;               // since the operation began
  double waiting_ms = 0;            // since the wait began
  std::vector<std::string> history; // the last operations it finished, oldest first

  [[nodiscard]] bool in_operation() const noexcept { return !operation.empty(); }

  /// "all_reduce #7 round 1 step 3 of 12 (recv_reduce)".
  [[nodiscard]] std::string position() const {
    std::string s = operation + " #" + std::to_string(sequence);
    if (steps > 0) {
      s += " round " + std::to_string(round) + " step " + std::to_string(step) + " of " +
           std::to_string(steps);
      if (!step_kind.empty()) s += " (" + step_kind + ")";
    }
    return s;
  }

  /// One line of the dump.
  [[nodiscard]] std::string to_string() const {
    std::string s = "rank " + std::to_string(rank) + " | " + status;
    if (in_operation()) {
      s += " | " + position() + " on comm " + std::to_string(comm) + " as rank " +
           std::to_string(comm_rank) + " of " + std::to_string(comm_size) + " | busy " +
           std::to_string(static_cast<long long>(busy_ms)) + " ms";
      if (waiting_on >= 0) {
        s += " | waiting " + std::to_string(static_cast<long long>(waiting_ms)) + " ms on rank " +
             std::to_string(waiting_on) + " to " + waiting_to;
      } else {
        s += " | not waiting";
      }
    } else {
      s += " | outside any weft operation";
    }
    if (!history.empty()) {
      s += " | last done:";
      for (const auto& h : history)
        s += " " + h;
    }
    return s;
  }
};

/// The flight recorder's dump: one line per rank.
[[nodiscard]] inline std::string to_string(const std::vector<rank_progress>& ranks) {
  std::string s;
  for (const auto& r : ranks)
    s += "  " + r.to_string() + "\n";
  return s;
}

} // namespace weft

namespace weft::detail {

/// What one rank writes as it goes; see the header comment.
class progress_record {
public:
  static constexpr std::size_t history_length = 4;

  /// Enters an operation; every later field describes it until done().
  void begin(std::string_view operation, std::uint64_t sequence, int comm, int comm_rank,
             int comm_size, std::size_t steps = 0) {
    {
      std::lock_guard lock(mutex_);
      const std::size_t n =
          operation.size() < name_.size() - 1 ? operation.size() : name_.size() - 1;
      std::memcpy(name_.data(), operation.data(), n);
      name_[n] = '\0';
    }
    sequence_.store(sequence, std::memory_order_relaxed);
    comm_.store(comm, std::memory_order_relaxed);
    comm_rank_.store(comm_rank, std::memory_order_relaxed);
    comm_size_.store(comm_size, std::memory_order_relaxed);
    steps_.store(steps, std::memory_order_relaxed);
    step_.store(0, std::memory_order_relaxed);
    round_.store(0, std::memory_order_relaxed);
    kind_.store(-1, std::memory_order_relaxed);
    begun_.store(now_ns(), std::memory_order_relaxed);
    active_.store(true, std::memory_order_release);
  }
  void at_step(std::uint32_t round, std::size_t step, step_kind kind) {
    round_.store(round, std::memory_order_relaxed);
    step_.store(step, std::memory_order_relaxed);
    kind_.store(static_cast<int>(kind), std::memory_order_relaxed);
  }
  /// `peer` is a rank of the operation's communicator; `what` must be a string literal (it
  /// completes "waiting to ...").
  void waiting(int peer, const char* what) {
    what_.store(what, std::memory_order_relaxed);
    wait_begun_.store(now_ns(), std::memory_order_relaxed);
    peer_.store(peer, std::memory_order_release);
  }
  void not_waiting() { peer_.store(-1, std::memory_order_release); }
  void done() { end(""); }
  /// Ends an operation that threw: no longer "in" it (a rank that caught the error and went on
  /// elsewhere is not stalled there), kept in the history as "all_reduce#7 (threw)".
  void threw() { end(" (threw)"); }

  [[nodiscard]] bool active() const noexcept { return active_.load(std::memory_order_acquire); }
  /// When the last operation ended (steady clock, ns; 0: none yet).
  [[nodiscard]] std::int64_t last_done() const noexcept {
    return last_done_.load(std::memory_order_relaxed);
  }

  /// A copy of the record. `world_of` maps the communicator's ranks to world ranks (null:
  /// they are the same).
  [[nodiscard]] rank_progress snapshot(int world_rank, std::string status,
                                       const std::vector<int>* world_of = nullptr) const {
    rank_progress p;
    p.rank = world_rank;
    p.status = std::move(status);
    const std::int64_t now = now_ns();
    {
      std::lock_guard lock(mutex_);
      if (active()) p.operation = name_.data();
      const std::size_t kept = done_count_ < history_length ? done_count_ : history_length;
      for (std::size_t i = done_count_ - kept; i < done_count_; ++i)
        p.history.push_back(history_[i % history_length]);
    }
    if (!p.in_operation()) return p;
    p.sequence = sequence_.load(std::memory_order_relaxed);
    p.comm = comm_.load(std::memory_order_relaxed);
    p.comm_rank = comm_rank_.load(std::memory_order_relaxed);
    p.comm_size = comm_size_.load(std::memory_order_relaxed);
    p.steps = steps_.load(std::memory_order_relaxed);
    p.step = step_.load(std::memory_order_relaxed);
    p.round = round_.load(std::memory_order_relaxed);
    const int kind = kind_.load(std::memory_order_relaxed);
    if (kind >= 0) p.step_kind = std::string(name_of(static_cast<step_kind>(kind)));
    p.busy_ms = static_cast<double>(now - begun_.load(std::memory_order_relaxed)) / 1e6;
    p.waiting_on_comm_rank = peer_.load(std::memory_order_acquire);
    p.waiting_on = p.waiting_on_comm_rank;
    if (world_of != nullptr && p.waiting_on >= 0 &&
        static_cast<std::size_t>(p.waiting_on) < world_of->size()) {
      p.waiting_on = (*world_of)[static_cast<std::size_t>(p.waiting_on)];
    }
    if (p.waiting_on >= 0) {
      p.waiting_to = what_.load(std::memory_order_relaxed);
      p.waiting_ms = static_cast<double>(now - wait_begun_.load(std::memory_order_relaxed)) / 1e6;
    }
    return p;
  }

  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

private:
  void end(const char* how) {
    peer_.store(-1, std::memory_order_relaxed);
    last_done_.store(now_ns(), std::memory_order_relaxed);
    active_.store(false, std::memory_order_release);
    std::lock_guard lock(mutex_);
    auto& h = history_[done_count_ % history_length];
    h = std::string(name_.data()) + "#" +
        std::to_string(sequence_.load(std::memory_order_relaxed)) + how;
    ++done_count_;
  }

  mutable std::mutex mutex_;
  std::array<char, 48> name_{};
  std::array<std::string, history_length> history_;
  std::size_t done_count_ = 0;
  std::atomic<bool> active_{false};
  std::atomic<std::uint64_t> sequence_{0};
  std::atomic<int> comm_{0};
  std::atomic<int> comm_rank_{0};
  std::atomic<int> comm_size_{0};
  std::atomic<std::size_t> steps_{0};
  std::atomic<std::size_t> step_{0};
  std::atomic<std::uint32_t> round_{0};
  std::atomic<int> kind_{-1};
  std::atomic<int> peer_{-1};
  std::atomic<const char*> what_{""};
  std::atomic<std::int64_t> begun_{0};
  std::atomic<std::int64_t> wait_begun_{0};
  std::atomic<std::int64_t> last_done_{0};
};

} // namespace weft::detail
