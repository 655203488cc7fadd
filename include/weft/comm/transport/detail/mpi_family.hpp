#pragma once
// What a weft::mpi communicator shares with every communicator split from it (its family):
// the failed state, the failure policy, and the control channel on which the ranks of the
// family tell each other of a failure and find who holds them up.
//
// The control channel is a private duplicate of the root communicator. Each process keeps one
// receive posted on it (any source, any tag) and reads it whenever it waits inside weft, and
// at the start of every call. Three kinds of message travel on it:
//
//   query     "where are you?", from a rank whose deadline passed
//   state     the answer: the operation and step the rank waits in, and on which rank (a rank
//             answers only while it waits inside weft: one that computes, sleeps or died does
//             not answer, and that silence is what names it)
//   verdict   the family failed: the first failure's message. Every rank that reads it fails
//             its current wait with that message, and every later call throws it at once.
//
// At a deadline the rank follows "waits on" from the peer it waited for, one query per hop,
// until a rank does not answer within the answer window (the stalled rank), answers from
// outside any weft call (it is late), or the chain closes a cycle (the ranks made different
// calls); then it sends its verdict to every rank of the family. So every survivor's error
// names the rank that stalled first, not only its neighbour, at the cost of one query per hop
// and one verdict per rank that reaches one. Messages carry the family's nonce (drawn by rank
// 0 when the root is made), so no message of another family can be taken for one of this
// family's, even on a reused communicator id.
//
// A failed family's communicators are never freed: a message of the failed call still in
// flight can then never match a later communicator's call.
#include <weft/comm/detail/scratch.hpp>
#include <weft/comm/failure.hpp>
#include <weft/comm/progress.hpp>
#include <weft/comm/transport/detail/mpi_comm_handle.hpp>
#include <weft/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace weft::detail {

/// One message of the control channel; see the header comment. Plain bytes on the wire.
struct mpi_control_message {
  enum kind_t : std::int32_t { query = 1, state = 2, verdict = 3 };
  static constexpr std::size_t text_bytes = 2032;

  std::uint64_t nonce = 0;
  std::int32_t kind = 0;
  std::int32_t from = -1;       // the sender's rank in the root communicator
  std::int32_t waiting_on = -1; // state: the root rank it waits on (-1: none, or not in a wait)
  std::int32_t in_call = 0;     // state: 1 while it waits inside weft, 2 once its family failed
  char text[text_bytes] = {};   // state: its position; verdict: the failure

  void set_text(std::string_view s) noexcept {
    const std::size_t n = std::min(s.size(), text_bytes - 1);
    std::memcpy(text, s.data(), n);
    text[n] = '\0';
  }
  [[nodiscard]] std::string_view get_text() const noexcept {
    return {text, static_cast<std::size_t>(std::find(text, text + text_bytes, '\0') - text)};
  }
};

class mpi_family {
public:
  /// `control`: a duplicate of the root communicator, taken over; `root_rank`/`world_of_root`:
  /// this process's rank in it and every root rank's rank in MPI_COMM_WORLD.
  mpi_family(mpi_comm_handle control, std::uint64_t nonce, int root_rank,
             std::vector<int> world_of_root, on_failure policy)
      : control_(std::move(control)),
        nonce_(nonce),
        me_(root_rank),
        world_of_(std::move(world_of_root)),
        policy_(policy) {
    post_receive();
  }
  mpi_family(const mpi_family&) = delete;
  mpi_family& operator=(const mpi_family&) = delete;
  ~mpi_family() {
    if (!mpi_alive()) return;
    poll();
    if (receive_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&receive_);
      MPI_Status st;
      int flag = 0;
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      while (MPI_Test(&receive_, &flag, &st) == MPI_SUCCESS && flag == 0 &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
      if (flag == 0) { // still live: its buffer must stay
        MPI_Request_free(&receive_);
        (void)inbox_.release();
      }
    }
    for (outgoing& o : sent_) {
      int flag = 0;
      if (o.request != MPI_REQUEST_NULL &&
          MPI_Test(&o.request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag == 0) {
        MPI_Request_free(&o.request);
        (void)o.message.release();
      }
    }
    if (failure_.failed()) {
      // Never freed (see the header comment); nor is what MPI may still write into.
      control_.keep();
      for (auto& p : parked_)
        (void)p.release();
      for (auto& s : parked_scratch_)
        (void)s.release();
    }
  }

  [[nodiscard]] on_failure policy() const noexcept { return policy_; }
  [[nodiscard]] int root_rank() const noexcept { return me_; }
  [[nodiscard]] int root_size() const noexcept { return static_cast<int>(world_of_.size()); }
  [[nodiscard]] int world_rank_of(int root_rank) const {
    return world_of_.at(static_cast<std::size_t>(root_rank));
  }
  [[nodiscard]] failure_state& failure() noexcept { return failure_; }

  /// A communicator of the family registers its progress record while it lives, so that a
  /// query finds where this process waits; `root_of` maps its ranks to root ranks.
  void enlist(const progress_record* record, const std::vector<int>* root_of) {
    std::lock_guard lock(mutex_);
    members_.push_back({record, root_of});
  }
  void delist(const progress_record* record) {
    std::lock_guard lock(mutex_);
    std::erase_if(members_, [&](const member& m) { return m.record == record; });
  }

  /// Reads what the control channel holds: answers queries, keeps answers, takes a verdict
  /// (the family is failed from then on). Never throws.
  void poll() noexcept {
    std::lock_guard lock(mutex_);
    poll_locked();
  }

  /// Throws, if the family failed, the error for a call of `operation` on `rank`. Reads the
  /// control channel first unless this process read it within the last millisecond (calls in
  /// quick succession pay no extra MPI test; a rank that comes back late always reads it, so
  /// it learns of a failure before it sends anything).
  void check(std::string_view operation, int rank) {
    if (progress_record::now_ns() - last_poll_ns_.load(std::memory_order_relaxed) >= 1'000'000)
      poll();
    failure_.check(operation, rank);
  }

  /// Records `what` as the family's failure and, when this is the first failure this process
  /// records, sends it to every other rank. Returns the failure recorded (the first).
  std::string fail_and_tell(const std::string& what) {
    std::lock_guard lock(mutex_);
    return fail_locked(what, true);
  }

  /// At a deadline: follows "waits on" from root rank `peer` (or from every rank of
  /// `members`, root ranks, when the wait has no single peer) and returns the verdict, which
  /// is also recorded and sent to every rank. `found` says who found it and how ("rank 1,
  /// which timed out after ...").
  std::string investigate(int peer, const std::vector<int>& members,
                          std::chrono::milliseconds window, const std::string& found) {
    std::unique_lock lock(mutex_);
    poll_locked();
    if (failure_.failed()) return failure_.what();
    std::vector<int> frontier;
    if (peer >= 0) {
      frontier.push_back(peer);
    } else {
      for (int q : members) {
        if (q != me_) frontier.push_back(q);
      }
    }
    std::vector<char> visited(world_of_.size(), 0);
    visited[static_cast<std::size_t>(me_)] = 1;
    std::string chain; // what each answering rank said, in order
    std::string verdict;
    for (std::size_t hop = 0; hop <= world_of_.size() && verdict.empty(); ++hop) {
      if (frontier.empty()) {
        verdict =
            "no rank could be named: the ranks wait on each other in a cycle (they made different "
            "calls, or "
            "in different orders; WEFT_CHECK_CALLS=1 finds the call)";
        break;
      }
      for (int q : frontier) {
        visited[static_cast<std::size_t>(q)] = 1;
        answers_.erase(q);
        mpi_control_message m;
        m.kind = mpi_control_message::query;
        send_locked(m, q);
      }
      const auto until = std::chrono::steady_clock::now() + window;
      const auto answered = [&] {
        return std::all_of(frontier.begin(), frontier.end(),
                           [&](int q) { return answers_.has(q); });
      };
      while (!failure_.failed() && !answered() && std::chrono::steady_clock::now() < until) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        lock.lock();
        poll_locked();
      }
      if (failure_.failed()) return failure_.what(); // another rank's verdict came first
      std::vector<int> silent;
      for (int q : frontier) {
        if (!answers_.has(q)) silent.push_back(q);
      }
      if (!silent.empty()) {
        verdict =
            ranks_text(silent) + (silent.size() == 1 ? " stalled: it" : " stalled: they") +
            " did not answer within " + std::to_string(window.count()) +
            " ms (it is not waiting inside weft: in its own code or a reduction, stopped, or dead)";
        break;
      }
      std::vector<int> next;
      for (int q : frontier) {
        const mpi_control_message& a = answers_.get(q);
        if (a.in_call == 2) return adopt_locked(a.get_text());
        if (a.in_call == 0) {
          verdict = "world rank " + std::to_string(world_rank_of(q)) +
                    " stalled: it had not made the call (" + std::string(a.get_text()) + ")";
          break;
        }
        chain +=
            "; world rank " + std::to_string(world_rank_of(q)) + " " + std::string(a.get_text());
        if (a.waiting_on >= 0 && a.waiting_on < root_size() &&
            visited[static_cast<std::size_t>(a.waiting_on)] == 0 &&
            std::find(next.begin(), next.end(), a.waiting_on) == next.end()) {
          next.push_back(a.waiting_on);
        }
      }
      frontier = std::move(next);
    }
    if (verdict.empty()) verdict = "no rank could be named";
    return fail_locked(verdict + " (found by " + found + chain + ")", true);
  }

  /// Keeps memory that an MPI request may still write into or read until MPI is done with
  /// it: for good once the family failed (see the header comment).
  void park(std::unique_ptr<std::byte[]> bytes) {
    std::lock_guard lock(mutex_);
    parked_.push_back(std::move(bytes));
  }
  void park(scratch_buffer&& s) {
    std::lock_guard lock(mutex_);
    parked_scratch_.push_back(std::make_unique<scratch_buffer>(std::move(s)));
  }

private:
  struct member {
    const progress_record* record;
    const std::vector<int>* root_of;
  };
  struct outgoing {
    std::unique_ptr<mpi_control_message> message;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  // The latest answer of each rank.
  class answer_table {
  public:
    [[nodiscard]] bool has(int q) const {
      return std::any_of(v_.begin(), v_.end(), [&](const auto& a) { return a.first == q; });
    }
    [[nodiscard]] const mpi_control_message& get(int q) const {
      return std::find_if(v_.begin(), v_.end(), [&](const auto& a) { return a.first == q; })
          ->second;
    }
    void put(int q, const mpi_control_message& m) {
      erase(q);
      v_.emplace_back(q, m);
    }
    void erase(int q) {
      std::erase_if(v_, [&](const auto& a) { return a.first == q; });
    }

  private:
    std::vector<std::pair<int, mpi_control_message>> v_;
  };

  void post_receive() {
    receive_ = MPI_REQUEST_NULL;
    if (MPI_Irecv(inbox_.get(), static_cast<int>(sizeof(mpi_control_message)), MPI_BYTE,
                  MPI_ANY_SOURCE, MPI_ANY_TAG, control_.get(), &receive_) != MPI_SUCCESS) {
      receive_ = MPI_REQUEST_NULL;
    }
  }

  void poll_locked() noexcept {
    last_poll_ns_.store(progress_record::now_ns(), std::memory_order_relaxed);
    // Takes what has arrived: each test runs MPI's progress engine once, which moves what is
    // already there into the posted receive. (One test that finds nothing ends it: on an
    // oversubscribed node Open MPI yields the core in every idle test.)
    while (receive_ != MPI_REQUEST_NULL) {
      int flag = 0;
      if (MPI_Test(&receive_, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        receive_ = MPI_REQUEST_NULL;
        break;
      }
      if (flag == 0) break;
      const mpi_control_message m = *inbox_;
      post_receive();
      if (m.nonce == nonce_) handle_locked(m);
    }
    if (sent_.empty()) return;
    std::erase_if(sent_, [](outgoing& o) {
      int flag = 0;
      return o.request == MPI_REQUEST_NULL ||
             (MPI_Test(&o.request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag != 0);
    });
  }

  void handle_locked(const mpi_control_message& m) {
    if (m.from < 0 || m.from >= root_size()) return;
    switch (m.kind) {
      case mpi_control_message::query: {
        mpi_control_message a;
        a.kind = mpi_control_message::state;
        describe_locked(a);
        send_locked(a, m.from);
        break;
      }
      case mpi_control_message::state: answers_.put(m.from, m); break;
      case mpi_control_message::verdict: (void)adopt_locked(m.get_text()); break;
      default: break;
    }
  }

  // Where this process waits: the longest wait of the family's communicators here.
  void describe_locked(mpi_control_message& a) const {
    if (failure_.failed()) {
      a.in_call = 2;
      a.set_text(failure_.what());
      return;
    }
    const member* best = nullptr;
    rank_progress best_p;
    std::string
        last; // the operation this process finished last, for an answer from outside any call
    std::int64_t last_done = 0;
    for (const member& m : members_) {
      if (m.record != nullptr && !m.record->active() && m.record->last_done() > last_done) {
        const rank_progress p =
            m.record->snapshot(world_of_[static_cast<std::size_t>(me_)], "running");
        if (!p.history.empty()) {
          last = p.history.back();
          last_done = m.record->last_done();
        }
      }
      if (m.record == nullptr || !m.record->active()) continue;
      rank_progress p =
          m.record->snapshot(world_of_[static_cast<std::size_t>(me_)], "running", m.root_of);
      if (best == nullptr ||
          (p.waiting_on >= 0 && (best_p.waiting_on < 0 || p.waiting_ms > best_p.waiting_ms))) {
        best = &m;
        best_p = std::move(p);
      }
    }
    if (best == nullptr) {
      a.in_call = 0;
      a.set_text(last.empty() ? std::string("outside any weft call")
                              : "outside any weft call; its last was " + last);
      return;
    }
    a.in_call = 1;
    a.waiting_on = best_p.waiting_on;
    std::string s = "is in " + best_p.position();
    if (best_p.waiting_on >= 0) {
      s += ", waiting " + std::to_string(static_cast<long long>(best_p.waiting_ms)) +
           " ms on world rank " + std::to_string(world_rank_of(best_p.waiting_on)) + " to " +
           best_p.waiting_to;
    } else {
      s += ", waiting on no single rank";
    }
    a.set_text(s);
  }

  std::string adopt_locked(std::string_view what) { return fail_locked(std::string(what), false); }

  std::string fail_locked(const std::string& what, bool tell) {
    const bool first = !failure_.failed();
    std::string recorded = failure_.fail(what);
    if (first && tell) {
      mpi_control_message v;
      v.kind = mpi_control_message::verdict;
      v.set_text(recorded);
      for (int q = 0; q < root_size(); ++q) {
        if (q != me_) send_locked(v, q);
      }
    }
    return recorded;
  }

  void send_locked(mpi_control_message m, int to) {
    m.nonce = nonce_;
    m.from = me_;
    outgoing o{std::make_unique<mpi_control_message>(m), MPI_REQUEST_NULL};
    if (MPI_Isend(o.message.get(), static_cast<int>(sizeof(mpi_control_message)), MPI_BYTE, to,
                  m.kind, control_.get(), &o.request) == MPI_SUCCESS) {
      sent_.push_back(std::move(o));
    }
  }

  std::string ranks_text(const std::vector<int>& roots) const {
    std::string s = roots.size() == 1 ? "world rank " : "world ranks ";
    for (std::size_t i = 0; i < roots.size(); ++i) {
      if (i > 0) s += ", ";
      s += std::to_string(world_rank_of(roots[i]));
    }
    return s;
  }

  std::mutex mutex_;
  std::atomic<std::int64_t> last_poll_ns_{0};
  mpi_comm_handle control_;
  std::uint64_t nonce_;
  int me_;
  std::vector<int> world_of_;
  on_failure policy_;
  failure_state failure_;
  std::unique_ptr<mpi_control_message> inbox_ = std::make_unique<mpi_control_message>();
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::deque<outgoing> sent_;
  answer_table answers_;
  std::vector<member> members_;
  std::vector<std::unique_ptr<std::byte[]>> parked_;
  std::vector<std::unique_ptr<scratch_buffer>> parked_scratch_;
};

} // namespace weft::detail
