#pragma once
// weft::local: N ranks as threads of one process, sharing an address space.
//
//   weft::local::run(4, [](weft::local::communicator& c) { ... });        // 4 ranks, one node
//   // 8 ranks in 2 emulated nodes
//   weft::local::run(weft::topology::parse("2x4"), [](auto& c) { ... });
//
// Plans run single-copy: a receiver copies or reduces straight from the sender's buffer, and
// peer-access plans (algo::direct) load from peers' buffers after a sync.
//
// Failure behaviour. Every rank records its progress (operation, sequence number, plan step,
// the peer it waits on: weft/comm/progress.hpp), and every wait has a deadline, the watchdog
// (communicator::set_timeout, default 5 minutes; options::watchdog = false waits forever).
// When a rank stalls, the first wait to pass its deadline follows the waits to the culprit
// and aborts the world with a verdict naming the culprit's operation, sequence number and
// step and the dump of every rank's pending operations; every other rank fails promptly with
// that verdict, so every survivor names the stalled rank, not only its neighbours. When a
// rank throws or returns early, the ranks waiting on it get a weft::error naming the
// operation and that rank.
//
// A call that fails part-way (a deadline, a peer's failure, a check inside a plan after data
// may have moved, a user's reduction that throws) fails the world of its communicator: that
// communicator, those split from it and every other one of its world, on every rank. Each
// later call on any of them, collective or point-to-point, throws at once, quoting the error
// this rank's first failed call threw (a rank that was in no call quotes the world's first
// failure), so no message of a failed call pairs with a later call. Errors found before any
// data moves (a bad peer or root, a plan for another rank, a point-to-point receive whose
// message is not the one asked for, which stays queued, the call check's "no data moved")
// leave the communicator usable. Before a failed call's error leaves, no peer can read the
// rank's buffers any more: its unconsumed messages are withdrawn, and the buffers it
// published for a peer-access plan are withdrawn once the peers loading from them let go (a
// load waits on no one, so this lasts one copy or reduction at most). Peers never write a
// rank's buffers. With options::on_failure = on_failure::abort_job, a call that fails, or is
// made on a failed communicator, prints weft's error and ends the process instead of
// throwing (weft/comm/failure.hpp). After a failure the survivors may call shrink() to
// continue on a communicator of the ranks that are left, in a new world. run() rethrows the
// first failure of a rank's function.
#include <weft/comm/detail/deadline.hpp>
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/detail/scratch.hpp>
#include <weft/comm/failure.hpp>
#include <weft/comm/measured_prices.hpp>
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/check.hpp>
#include <weft/comm/plan/engine.hpp>
#include <weft/comm/progress.hpp>
#include <weft/comm/transport/detail/cpu_binding.hpp>
#include <weft/comm/transport/detail/host_plan_steps.hpp>
#include <weft/comm/transport/detail/local_state.hpp>
#include <weft/core/error.hpp>
#include <weft/core/types.hpp>
#include <weft/topology/topology.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace weft::local {

/// What algo::automatic picks by on one host (options::automatic).
enum class automatic_prices {
  measured, ///< times of every candidate, measured here at first use
  model,    ///< the cost model's nominal figures for the host
};

/// Where local::run's rank threads run (options::binding; comm/transport/detail/cpu_binding.hpp).
enum class thread_binding {
  none,      ///< wherever the scheduler puts them
  automatic, ///< bound as `cpu` where the ranks outnumber the CPUs the caller may run on
  cpu,       ///< each on its share of the caller's CPUs (comm/transport/detail/cpu_binding.hpp)
};

struct options {
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// The deadline on every wait; off, a stalled rank holds the others forever.
  bool watchdog = true;
  /// Compare every collective call across the ranks before it runs (as WEFT_CHECK_CALLS=1).
  bool check_calls = false;
  /// Pace every transfer at the figures of the cluster's links (latency, bandwidth, shared
  /// NICs), as cost_model::simulate prices them, so one machine shows what a fabric does.
  bool emulate_links = false;
  /// What a call that fails part-way does: throw (and leave the communicator failed), or print
  /// weft's error and end the process (weft/comm/failure.hpp).
  weft::on_failure on_failure = weft::on_failure::throw_error;
  /// How algo::automatic prices its candidates where the ranks share one node and links are
  /// not emulated (comm/measured_prices.hpp): measured on this machine at the first automatic
  /// call of each collective on a group shape (once per process and shape; about 0.21 s for
  /// all_reduce on 4 ranks of an idle 2-core machine), and at 16 and 64 MiB at the first call
  /// past 4 MiB (about 2 s more), or by the cost model's nominal figures
  /// for the host (topology::host), which measure nothing and pick worse (1.3-2.7x slower
  /// than the best algorithm on 4 ranks here; docs/benchmarks.md). Unset: the environment's
  /// WEFT_AUTOMATIC (`measured` or `model`; anything else is a weft::error), else measured.
  /// A value set here wins over the environment.
  std::optional<automatic_prices> automatic{};
  /// Where the rank threads run: free (the default, as threads and MPI processes that
  /// outnumber the cores are by default), or bound, each to its share of the CPUs the caller
  /// may run on (comm/transport/detail/cpu_binding.hpp), so that which ranks share a CPU stays
  /// as automatic measured it. On an idle machine binding is faster and steadier (4 ranks on
  /// 2 cores: all_reduce 1.3-1.9x faster from 4 KiB to 1 MiB, and automatic within 1.25x of
  /// the best fixed algorithm in 14 runs of 16; docs/benchmarks.md); beside a busy process a
  /// bound thread cannot move off its CPU (a compile on one core: 2.4 ms a 4 KiB call, against
  /// 7 us free). Threads a rank starts inherit its CPUs; rank 0 runs on the caller's thread,
  /// whose CPUs it gives back when the run ends. Linux only (`cpu` elsewhere is a weft::error).
  /// Unset: the environment's WEFT_BINDING (`none`, `automatic` or `cpu`; anything else is a
  /// weft::error), else none. A value set here wins over the environment.
  std::optional<thread_binding> binding{};
};

class communicator {
public:
  /// Messages a send may leave unreceived per peer before it waits for the receiver (the
  /// channel's slots); pipeline::executor checks its schedules against it.
  static constexpr std::size_t queued_messages_per_peer = detail::channel::capacity;
  /// Ranks of this transport can read each other's buffers (algo::direct needs this).
  static constexpr bool peer_access = true;
  static constexpr std::string_view transport_name = "local";

  communicator(std::shared_ptr<detail::local_group> group, int rank,
               std::chrono::milliseconds timeout)
      : group_(std::move(group)),
        rank_(rank),
        timeout_(timeout),
        synced_(static_cast<std::size_t>(group_->size)) {
    WEFT_EXPECTS(rank_ >= 0 && rank_ < group_->size, "local::communicator: rank outside the group");
    node_of_.reserve(static_cast<std::size_t>(group_->size));
    for (int w : group_->world_rank)
      node_of_.push_back(group_->world->cluster.node_of(w));
  }
  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return group_->size; }
  /// This rank's index in the world of its local::run (its device in the cluster).
  [[nodiscard]] int world_rank(int r) const {
    return group_->world_rank.at(static_cast<std::size_t>(r));
  }
  [[nodiscard]] const std::vector<int>& devices() const noexcept { return group_->world_rank; }
  [[nodiscard]] const std::vector<int>& node_of() const noexcept { return node_of_; }
  [[nodiscard]] const topology::cluster& cluster() const noexcept { return group_->world->cluster; }
  /// Whether automatic picks by prices measured on this machine (options::measured_automatic):
  /// on one node, without emulated links.
  [[nodiscard]] bool measures_automatic() const noexcept {
    return group_->world->measurer != nullptr &&
           std::all_of(node_of_.begin(), node_of_.end(),
                       [&](int n) { return n == node_of_.front(); });
  }
  /// Measures automatic's prices of collective c now, all ranks together (where
  /// measures_automatic()); base: its table to continue at the large sizes, or none.
  [[nodiscard]] std::shared_ptr<const measured_prices> measure_prices(
      collective c, bool peer_access, bool messages, const measured_prices* base = nullptr) {
    return group_->world->measurer(*this, c, peer_access, messages, base);
  }
  /// automatic's measured prices of collective c: empty until its first automatic call of c.
  [[nodiscard]] std::shared_ptr<const measured_prices>& measured_prices_of(collective c) {
    return measured_.at(static_cast<std::size_t>(c));
  }
  [[nodiscard]] const std::shared_ptr<const measured_prices>& measured_prices_of(
      collective c) const {
    return measured_.at(static_cast<std::size_t>(c));
  }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) {
    timeout_ = weft::detail::checked_timeout(t, "local::communicator::set_timeout");
  }
  /// The watchdog: off, waits have no deadline (a failed rank still fails its waiters).
  [[nodiscard]] bool watchdog() const noexcept { return watchdog_; }
  void set_watchdog(bool on) noexcept { watchdog_ = on; }
  /// Whether collectives on this communicator compare the call across ranks first (the
  /// dispatch also does so for all communicators when WEFT_CHECK_CALLS=1 or check_calls(true)).
  [[nodiscard]] bool check_calls() const noexcept { return check_calls_; }
  void set_check_calls(bool on) noexcept { check_calls_ = on; }
  /// What a call that fails part-way does (options::on_failure); splits and shrink() inherit it.
  [[nodiscard]] weft::on_failure failure_policy() const noexcept { return on_failure_; }
  void set_failure_policy(weft::on_failure p) noexcept { on_failure_ = p; }
  /// This communicator's number in its world, as the dumps name it.
  [[nodiscard]] int id() const noexcept { return group_->id; }
  /// How many collective operations (plans, barriers, splits) this rank has begun here.
  [[nodiscard]] std::uint64_t sequence() const noexcept { return seq_; }

  /// The flight recorder: every rank's position in the world of this communicator now.
  [[nodiscard]] std::vector<rank_progress> progress() const {
    return detail::world_progress(*group_->world);
  }
  /// The same as text, one line per rank (weft::to_string(progress())).
  [[nodiscard]] std::string pending_operations() const { return weft::to_string(progress()); }

  /// Fails every pending and later operation of this world, on every rank, with `why`.
  void abort(const std::string& why) { group_->world->abort(world_rank(rank_), why); }
  /// Whether this communicator's world failed or was aborted.
  [[nodiscard]] bool aborted() const noexcept {
    return group_->world->failed.load(std::memory_order_acquire);
  }

  /// After a failure: a communicator of the ranks that are left, in their order here.
  /// Collective over the ranks still running: it returns once every rank of this
  /// communicator has called it or has failed or returned, or at the deadline, after which
  /// ranks that had not called it are left out (a stalled rank that comes back later gets a
  /// weft::error). The new communicator lives in a new world, untouched by the old failure.
  /// Once per communicator.
  communicator shrink() {
    auto& sh = group_->shrinking;
    auto& old_world = *group_->world;
    {
      std::lock_guard lock(sh.mutex);
      if (sh.closed) {
        throw error("shrink", rank_, error::unknown,
                    "this communicator has already been shrunk (this rank came too late, or calls "
                    "it twice)");
      }
      if (sh.joined.empty()) sh.joined.assign(static_cast<std::size_t>(size()), 0);
      sh.joined[static_cast<std::size_t>(rank_)] = 1;
    }
    old_world.ring_all();
    const auto close = [&] { // under sh.mutex
      sh.closed = true;
      for (int r = 0; r < size(); ++r) {
        if (sh.joined[static_cast<std::size_t>(r)] != 0) sh.survivors.push_back(r);
      }
      auto world =
          std::make_shared<detail::local_world>(old_world.cluster, old_world.pacer != nullptr);
      std::vector<int> members;
      for (int r : sh.survivors)
        members.push_back(world_rank(r));
      for (int w = 0; w < world->size; ++w) {
        if (std::find(members.begin(), members.end(), w) == members.end()) {
          world->status[static_cast<std::size_t>(w)].store(
              static_cast<int>(detail::rank_status::left));
        }
      }
      old_world.add_successor(world);
      sh.result = detail::local_group::make(std::move(world), std::move(members));
    };
    const auto settled = [&] {
      std::lock_guard lock(sh.mutex);
      if (sh.closed) return true;
      for (int r = 0; r < size(); ++r) {
        if (sh.joined[static_cast<std::size_t>(r)] == 0 &&
            old_world.status_of(world_rank(r)) == detail::rank_status::running) {
          return false;
        }
      }
      close();
      return true;
    };
    const auto never = [] { return false; };
    const auto deadline = watchdog_ ? weft::detail::deadline_after(timeout_)
                                    : std::chrono::steady_clock::time_point::max();
    auto& bell = old_world.bells[static_cast<std::size_t>(world_rank(rank_))];
    if (!bell.wait(settled, never, deadline, 0)) {
      std::lock_guard lock(sh.mutex);
      if (!sh.closed) close(); // the deadline: whoever has not come is left out
    }
    old_world.ring_all(); // the others need not wait for their next slice to see it closed
    std::lock_guard lock(sh.mutex);
    const auto it = std::find(sh.survivors.begin(), sh.survivors.end(), rank_);
    communicator c(sh.result, static_cast<int>(it - sh.survivors.begin()), timeout_);
    c.watchdog_ = watchdog_;
    c.check_calls_ = check_calls_;
    c.on_failure_ = on_failure_;
    return c;
  }

  // --- point to point (eager: send copies and returns; recv blocks) ------------------------
  // One ordered channel per pair of ranks carries point-to-point and collective messages
  // alike, and the tag is checked, not matched: a rank receives in the order its peer sent.
  // MPI matches by tag, and keeps weft's collectives apart, so a program that receives tags
  // out of order, or runs a collective between a send and its receive on one communicator,
  // runs under weft::mpi and is a weft::error here (naming both messages). Split a
  // communicator for traffic that interleaves.
  template <element T>
  void send(std::span<const T> data, int peer, int tag = 0) {
    check_peer(peer, "send");
    const p2p_scope scope(*this, "send", peer);
    auto owned = std::make_unique<std::byte[]>(data.size_bytes() == 0 ? 1 : data.size_bytes());
    if (!data.empty()) std::memcpy(owned.get(), data.data(), data.size_bytes());
    const void* copy = owned.get(); // before the move below: argument order is unspecified
    try {
      post(peer, copy, data.size(), dtype_of<T>, tag, std::move(owned), "send");
    } catch (...) {
      fail_part_way([] {}); // the message owns a copy: nothing of the caller's to let go of
    }
  }
  template <element T>
  void send(std::span<T> data, int peer, int tag = 0) {
    send(std::span<const T>(data), peer, tag);
  }
  template <element T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    check_peer(peer, "recv");
    const p2p_scope scope(*this, "recv", peer);
    try {
      consume(peer, data.size(), dtype_of<T>, tag, "recv", [&](const void* src) {
        detail::copy_n(data.data(), static_cast<const T*>(src), data.size());
      });
    } catch (const disagreement&) {
      throw; // the message stays where it is and nothing moved: the communicator stays usable
    } catch (...) {
      fail_part_way([] {}); // only this rank writes into `data`, and it stopped
    }
  }
  template <element T>
  void sendrecv(std::span<const T> out, int to, std::span<T> in, int from, int tag = 0) {
    send(out, to, tag);
    recv(in, from, tag);
  }

  void barrier() {
    const op_scope scope(*this, "barrier");
    try {
      sync_with(all_ranks(), "barrier");
    } catch (...) {
      fail_part_way([] {});
    }
  }

  /// Splits into communicators of the ranks with the same color (>= 0), ordered by (key, rank).
  /// Collective over this communicator.
  communicator split(int color, int key) {
    WEFT_EXPECTS(color >= 0, "local::communicator::split: color must be >= 0");
    const op_scope scope(*this, "split");
    try {
      auto& me = group_->slots[static_cast<std::size_t>(rank_)];
      me.words[0] = static_cast<std::uint64_t>(color);
      me.words[1] = static_cast<std::uint64_t>(static_cast<std::int64_t>(key));
      sync_with(all_ranks(), "split");
      std::vector<std::pair<std::int64_t, int>> members; // (key, rank) of my color
      for (int r = 0; r < size(); ++r) {
        const auto& s = group_->slots[static_cast<std::size_t>(r)];
        if (s.words[0] == static_cast<std::uint64_t>(color))
          members.emplace_back(static_cast<std::int64_t>(s.words[1]), r);
      }
      std::sort(members.begin(), members.end());
      const bool leader = members.front().second == rank_;
      if (leader) {
        std::vector<int> world;
        for (auto [k, r] : members)
          world.push_back(group_->world_rank[static_cast<std::size_t>(r)]);
        me.child = detail::local_group::make(group_->world, std::move(world));
      }
      sync_with(all_ranks(), "split");
      std::shared_ptr<detail::local_group> child =
          group_->slots[static_cast<std::size_t>(members.front().second)].child;
      int new_rank = 0;
      while (members[static_cast<std::size_t>(new_rank)].second != rank_)
        ++new_rank;
      sync_with(all_ranks(), "split");
      if (leader) me.child.reset();
      communicator c(std::move(child), new_rank, timeout_);
      c.watchdog_ = watchdog_;
      c.check_calls_ = check_calls_;
      c.on_failure_ = on_failure_;
      return c;
    } catch (...) {
      fail_part_way([] {});
    }
  }

  /// Runs one rank's plan over its buffers. `in`/`out` hold in_count/out_count elements
  /// (in may equal out: in place).
  template <element T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
               const Op& op, std::string_view operation) {
    const op_scope scope(*this, operation, pl.steps().size());
    check_plan(pl, operation);
    const bool staged = pl.staged();
    if (staged) {
      if (pl.scratch_count() * sizeof(T) > max_staged_scratch_bytes) {
        throw error(operation, rank_, error::unknown,
                    "a staged plan needs " + std::to_string(pl.scratch_count() * sizeof(T)) +
                        " bytes of staging; the local transport has " +
                        std::to_string(max_staged_scratch_bytes));
      }
      ++staged_calls_; // the same count on every rank: they make the same calls
      group_->staging_of(rank_, staged_calls_).count = pl.count();
    }
    T* scratch = staged ? static_cast<T*>(group_->staging(rank_, staged_calls_))
                        : scratch_.get<T>(pl.scratch_count());
    // The input is only ever read.
    const plan_buffers<T> buffers{{const_cast<T*>(in), out, scratch},
                                  {in_count, out_count, pl.scratch_count()},
                                  operation,
                                  rank_};
    // A staged plan's peers find its staging area in the group: the buffers published here
    // may still be read by a slower peer's previous call.
    const bool publish = pl.peer_access() && !staged;
    if (publish) {
      auto& me = group_->slots[static_cast<std::size_t>(rank_)];
      for (int b = 0; b < 3; ++b) {
        me.buffers[b] = buffers.base[b];
        me.sizes[b] = buffers.size[b];
      }
      me.count = pl.count();
      me.published.store(true, std::memory_order_seq_cst);
    }
    pending_guard pending(*this);
    try {
      run_steps<T>(pl, buffers, op, operation, staged, pending);
    } catch (...) {
      // No peer may read this rank's buffers once the error leaves: its messages are taken
      // back, and its published buffers once the peers loading from them have let go.
      fail_part_way([&] {
        pending.withdraw();
        if (publish) withdraw_buffers();
      });
    }
  }

private:
  static constexpr int plan_tag = -1;

  // The local transport's hooks for run_plan: sends are posted as messages, receives
  // consume them, loads read the peers' published buffers (copy and reduce: host_plan_steps).
  template <class T, class Op, class Pending>
  struct plan_run : detail::host_plan_steps<T, Op> {
    using detail::host_plan_steps<T, Op>::buffers;
    using detail::host_plan_steps<T, Op>::op;
    communicator& c;
    const plan& pl;
    std::string_view operation;
    bool staged;
    Pending& pending;

    void begin_round(const plan_round&) {} // sends are posted as they come
    void sends_posted(const plan_round&) {}
    void at_step(const plan_round& r, std::size_t k, const step& s) {
      c.record().at_step(r.number, k, s.kind);
    }
    void send(std::size_t, const step& s) {
      pending.add(s.peer, c.post(s.peer, buffers.at(s.src, s.src_offset, s.count), s.count,
                                 dtype_of<T>, plan_tag, nullptr, operation));
    }
    void recv(std::size_t, const step& s) {
      T* dst = buffers.at(s.dst, s.dst_offset, s.count);
      c.consume(s.peer, s.count, dtype_of<T>, plan_tag, operation,
                [&](const void* src) { detail::copy_n(dst, static_cast<const T*>(src), s.count); });
    }
    void recv_reduce(std::size_t, const step& s) {
      const T* a = buffers.at(s.src, s.src_offset, s.count);
      T* dst = buffers.at(s.dst, s.dst_offset, s.count);
      c.consume(
          s.peer, s.count, dtype_of<T>, plan_tag, operation,
          [&](const void* src) {
            detail::reduce2(dst, a, static_cast<const T*>(src), s.count, op);
          },
          arrival::before_use);
    }
    void load(std::size_t, const step& s) {
      const std::int64_t arrived = c.pace_loads(std::span(&s.peer, 1), s.count * sizeof(T));
      peer_reads reading(c);
      if (!staged) reading.add(s.peer, operation);
      detail::copy_n(
          buffers.at(s.dst, s.dst_offset, s.count),
          c.peer_range<T>(s.peer, s.src, s.src_offset, s.count, pl.count(), operation, staged),
          s.count);
      detail::link_pacer::wait_until(arrived);
    }
    void load_reduce(std::size_t, const step& s) {
      const auto& g = pl.group(s.peer);
      peer_reads reading(c);
      c.srcs_.clear();
      for (int q : g) {
        if (!staged) reading.add(q, operation);
        c.srcs_.push_back(
            c.peer_range<T>(q, s.src, s.src_offset, s.count, pl.count(), operation, staged));
      }
      detail::link_pacer::wait_until(c.pace_loads(g, s.count * sizeof(T)));
      detail::reduce_many(buffers.at(s.dst, s.dst_offset, s.count),
                          reinterpret_cast<const T* const*>(c.srcs_.data()), c.srcs_.size(),
                          s.count, op);
    }
    void sync(std::size_t, const step& s) {
      const auto& g = pl.group(s.peer);
      c.sync_with(g, operation);
      if (auto* pacer = c.group_->world->pacer.get()) {
        c.devs_.clear();
        for (int q : g)
          c.devs_.push_back(c.world_rank(q));
        detail::link_pacer::wait_until(pacer->synced(c.devs_));
      }
    }
    void end_round(const plan_round&) { pending.wait_all(operation); }
  };

  template <class T, class Op, class Pending>
  void run_steps(const plan& pl, const plan_buffers<T>& buffers, const Op& op,
                 std::string_view operation, bool staged, Pending& pending) {
    plan_run<T, Op, Pending> hooks{{{}, buffers, op}, *this, pl, operation, staged, pending};
    run_plan(pl.steps(), hooks);
  }

  std::vector<int> all_ranks() const {
    std::vector<int> v(static_cast<std::size_t>(size()));
    for (int r = 0; r < size(); ++r)
      v[static_cast<std::size_t>(r)] = r;
    return v;
  }

  void check_peer(int peer, std::string_view operation) const {
    check_peer_rank(peer, rank_, size(), false, operation);
  }

  // A plan made for this rank of a communicator of this size, whose every peer is another
  // rank of it (before any step runs, so a foreign plan moves no data). The ranges of this
  // rank's buffers are checked as the steps run.
  void check_plan(const plan& pl, std::string_view operation) const {
    check_plan_rank(pl, rank_, size(), operation);
    plan_check_hooks none;
    check_plan_steps(pl, {.rank = rank_, .size = size(), .operation = operation}, none);
  }

  // Where elements [off, off + n) of the peer's buffer b are, for a call of `count`; a peer
  // whose call has another count (the ranks disagree) is a weft::error, not a prefix.
  template <class T>
  const T* peer_range(int peer, buffer b, std::size_t off, std::size_t n, std::size_t count,
                      std::string_view operation, bool staged) const {
    const auto same_count = [&](std::size_t theirs) {
      if (theirs != count) {
        throw error(operation, rank_, peer,
                    "this rank's call has count " + std::to_string(count) + ", the peer's " +
                        std::to_string(theirs) +
                        ": the ranks disagree on the call (set WEFT_CHECK_CALLS=1 to find where)");
      }
    };
    if (staged) { // the peer's staging area of this call, the only buffer a staged plan reads
      check_staged_load(
          b == buffer::scratch && step_range_fits(off, n, max_staged_scratch_bytes / sizeof(T)),
          operation, rank_, peer);
      auto& area = group_->staging_of(peer, staged_calls_);
      same_count(area.count);
      return reinterpret_cast<const T*>(area.bytes) + off;
    }
    const auto& s = group_->slots[static_cast<std::size_t>(peer)];
    same_count(s.count);
    const auto i = static_cast<std::size_t>(b);
    check_peer_range(off, n, s.sizes[i], "a peer buffer", operation, rank_, peer);
    return static_cast<const T*>(s.buffers[i]) + off;
  }

  // Waits until ready(); on a failed world, a peer that left or failed, or the deadline,
  // throws weft::error naming the operation and the peer (-1: any of the group).
  // `what` is a string literal that completes "waiting to ...".
  template <class Ready>
  void wait(Ready&& ready, std::string_view operation, int peer, const char* what) {
    if (!ready()) wait_slow(ready, operation, peer, what);
  }

  void wait_slow(detail::predicate_ref ready, std::string_view operation, int peer,
                 const char* what) {
    auto& world = *group_->world;
    struct waiting_scope {
      detail::progress_record& r;
      ~waiting_scope() { r.not_waiting(); }
    } const waiting{record()};
    record().waiting(peer, what);
    const auto peer_gone = [&] {
      return peer >= 0 && world.status_of(group_->world_rank[static_cast<std::size_t>(peer)]) !=
                              detail::rank_status::running;
    };
    const auto give_up = [&] {
      return world.failed.load(std::memory_order_acquire) || peer_gone();
    };
    const auto deadline = watchdog_ ? weft::detail::deadline_after(timeout_)
                                    : std::chrono::steady_clock::time_point::max();
    auto& bell =
        world.bells[static_cast<std::size_t>(group_->world_rank[static_cast<std::size_t>(rank_)])];
    if (!bell.wait(ready, give_up, deadline, world.spins)) fail_wait(operation, peer, what);
  }

  [[noreturn]] WEFT_COLD void fail_wait(std::string_view operation, int peer,
                                        std::string_view what) {
    auto& world = *group_->world;
    const auto aborted = [&] {
      return error(operation, rank_, peer,
                   "aborted while waiting to " + std::string(what) + ": " + world.failure());
    };
    if (peer >= 0 && world.status_of(group_->world_rank[static_cast<std::size_t>(peer)]) !=
                         detail::rank_status::running) {
      const int w = group_->world_rank[static_cast<std::size_t>(peer)];
      // On a split communicator, peer is a rank of it: say which rank of the world that is.
      const std::string that =
          w == peer ? "that rank" : "that rank (world rank " + std::to_string(w) + ")";
      if (world.status_of(w) == detail::rank_status::failed) {
        throw error(operation, rank_, peer,
                    "waiting to " + std::string(what) + ", but " + that + " failed (" +
                        world.failure() + ")");
      }
      // A peer that returned after the world was aborted (the watchdog's verdict): the verdict.
      if (world.failed.load(std::memory_order_acquire)) throw aborted();
      throw error(operation, rank_, peer,
                  "waiting to " + std::string(what) + ", but " + that +
                      " returned without joining the operation");
    }
    if (world.failed.load(std::memory_order_acquire)) throw aborted();
    // The watchdog: find who holds everyone up, tell every rank, and give the dump. One rank
    // at a time; one that timed out while another gave the verdict reports that verdict.
    std::lock_guard one_verdict(world.watchdog);
    if (world.failed.load(std::memory_order_acquire)) throw aborted();
    const int me = world_rank(rank_);
    std::string why = "timed out after " + std::to_string(timeout_.count()) + " ms waiting to " +
                      std::string(what);
    if (peer >= 0) why += " (world rank " + std::to_string(world_rank(peer)) + ")";
    why += " in " + record().snapshot(me, "running").position() + " on comm " +
           std::to_string(group_->id);
    const std::string culprit = peer >= 0 ? detail::find_culprit(group_, peer) : std::string();
    const auto ranks = detail::world_progress(world);
    if (!culprit.empty()) why += "; " + culprit;
    why += "\npending operations (world ranks):\n" + weft::to_string(ranks);
    world.abort(me, why);
    throw error(operation, rank_, peer, why);
  }

  detail::progress_record& record() const {
    return group_->progress[static_cast<std::size_t>(rank_)];
  }

  // An operation fails at once on a failed or aborted world. The first such error of a rank
  // that had no failed call quotes the world's failure and becomes the rank's failure; every
  // later one quotes the rank's failure whole.
  void check_alive(std::string_view operation, int peer = error::unknown) {
    auto& world = *group_->world;
    if (!world.failed.load(std::memory_order_acquire)) return;
    auto& mine = world.failure_of(world_rank(rank_));
    std::string first = mine.what();
    if (first.empty()) {
      const error e(operation, rank_, peer,
                    "the communicator was aborted: " + world.failure() +
                        " (the ranks left may continue on communicator::shrink())");
      first = mine.fail(e.what());
      if (first == e.what()) raise(e);
    }
    raise(error(operation, rank_, peer,
                "the communicator was aborted by an earlier failure, and every later call on it "
                "fails (the ranks "
                "left may continue on communicator::shrink()): " +
                    first));
  }

  // Throws e, or under on_failure::abort_job prints it and ends the process.
  [[noreturn]] void raise(const error& e) const {
    if (on_failure_ == weft::on_failure::abort_job) end_job(e.what());
    throw e;
  }

  // A call's error found where nothing moved: a receive whose message is not the one asked
  // for (the message stays, the communicator stays usable). Caught as weft::error.
  class disagreement : public error {
  public:
    using error::error;
  };

  // What the exception being handled says.
  static std::string current_what() {
    try {
      throw;
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "an exception not derived from std::exception";
    }
  }

  [[noreturn]] static void end_job(const std::string& what) noexcept {
    weft::detail::print_abort_message(what);
    std::abort();
  }

  // From the handler of a call that failed part-way (after data may have moved: a deadline,
  // a peer's failure, a check inside a plan, a reduction that threw): records the error as
  // this rank's failure, which its later calls quote, and aborts the world, so every peer's
  // call fails promptly and every later call on any communicator of the world fails at once.
  // Then `release()` lets go of the caller's buffers, and the error leaves (throw_error) or
  // the process ends (abort_job).
  template <class Release>
  [[noreturn]] void fail_part_way(Release&& release) {
    const std::string what = current_what();
    auto& world = *group_->world;
    const int me = world_rank(rank_);
    world.failure_of(me).fail(what);
    world.abort(me, what);
    release();
    if (on_failure_ == weft::on_failure::abort_job) end_job(what);
    throw;
  }

  // Takes back the buffers this rank published for a peer-access plan, and returns once no
  // peer is loading from them. A reader never waits on anyone while it copies, so the wait
  // lasts as long as a copy (or a user's reduction) of the peer's current step at most.
  void withdraw_buffers() {
    auto& me = group_->slots[static_cast<std::size_t>(rank_)];
    me.published.store(false, std::memory_order_seq_cst);
    const auto unread = [&] { return me.readers.load(std::memory_order_seq_cst) == 0; };
    const auto never = [] { return false; };
    auto& world = *group_->world;
    world.bells[static_cast<std::size_t>(world_rank(rank_))].wait(
        unread, never, std::chrono::steady_clock::time_point::max(), world.spins);
  }

  // The peers whose published buffers a load step reads, counted as their readers while it
  // does (see local_group::exchange). A peer whose call failed and took its buffers back is a
  // weft::error here, before anything is read.
  class peer_reads {
  public:
    explicit peer_reads(communicator& c) : c_(c) { c_.reading_.clear(); }
    peer_reads(const peer_reads&) = delete;
    peer_reads& operator=(const peer_reads&) = delete;
    ~peer_reads() {
      for (int q : c_.reading_) {
        c_.group_->slots[static_cast<std::size_t>(q)].readers.fetch_sub(1,
                                                                        std::memory_order_seq_cst);
        c_.group_->bell(q).ring();
      }
      c_.reading_.clear();
    }
    void add(int peer, std::string_view operation) {
      if (peer == c_.rank_) return;
      auto& s = c_.group_->slots[static_cast<std::size_t>(peer)];
      s.readers.fetch_add(1, std::memory_order_seq_cst);
      if (!s.published.load(std::memory_order_seq_cst)) {
        s.readers.fetch_sub(1, std::memory_order_seq_cst);
        c_.group_->bell(peer).ring();
        throw error(
            operation, c_.rank_, peer,
            "the peer's call failed and took back its buffers before this rank loaded from them (" +
                c_.group_->world->failure() + ")");
      }
      c_.reading_.push_back(peer);
    }

  private:
    communicator& c_;
  };

  // Records a collective operation in the progress counters while it runs; one that ends by
  // an exception is recorded as ended "(threw)" in the history, so that a rank that caught it
  // and went on is not taken for one stalled inside it.
  class op_scope {
  public:
    op_scope(communicator& c, std::string_view operation, std::size_t steps = 0)
        : c_(c), uncaught_(std::uncaught_exceptions()) {
      c.check_alive(operation);
      c.record().begin(operation, ++c.seq_, c.group_->id, c.rank_, c.size(), steps);
    }
    op_scope(const op_scope&) = delete;
    op_scope& operator=(const op_scope&) = delete;
    ~op_scope() {
      if (std::uncaught_exceptions() == uncaught_)
        c_.record().done();
      else
        c_.record().threw();
    }

  private:
    communicator& c_;
    int uncaught_;
  };
  // The same for point-to-point calls, numbered on their own (the call check sends
  // different numbers of messages on different ranks, collectives stay aligned).
  class p2p_scope {
  public:
    // A failed world fails point-to-point calls at once too, so that no message of a failed
    // call pairs with a later one. The call check (detail::check_same_call) runs on these
    // calls and still reaches every rank: a disagreement it finds moves no data and fails
    // nothing, and every rank holds the table before any throws.
    p2p_scope(communicator& c, std::string_view operation, int peer)
        : c_(c), uncaught_(std::uncaught_exceptions()) {
      c.check_alive(operation, peer);
      c.record().begin(operation, ++c.p2p_seq_, c.group_->id, c.rank_, c.size());
    }
    p2p_scope(const p2p_scope&) = delete;
    p2p_scope& operator=(const p2p_scope&) = delete;
    ~p2p_scope() {
      if (std::uncaught_exceptions() == uncaught_)
        c_.record().done();
      else
        c_.record().threw();
    }

  private:
    communicator& c_;
    int uncaught_;
  };

  // Emulated links: when loads of `bytes` from each of `peers` would have arrived (0: now).
  template <class Peers>
  std::int64_t pace_loads(const Peers& peers, std::size_t bytes) {
    auto* pacer = group_->world->pacer.get();
    if (pacer == nullptr) return 0;
    devs_.clear();
    for (int q : peers)
      devs_.push_back(world_rank(q));
    return pacer->loads(world_rank(rank_), devs_, static_cast<double>(bytes));
  }

  // Appends a message to the channel to `peer`; returns its sequence number.
  std::uint64_t post(int peer, const void* data, std::size_t count, dtype type, int tag,
                     std::unique_ptr<std::byte[]> owned, std::string_view operation) {
    detail::channel& ch = group_->chan(rank_, peer);
    const std::uint64_t seq = ch.tail.load(std::memory_order_relaxed);
    if (seq - ch.head.load(std::memory_order_acquire) >= detail::channel::capacity) {
      wait(
          [&] { return seq - ch.head.load(std::memory_order_acquire) < detail::channel::capacity; },
          operation, peer, "post a message (the channel is full)");
    }
    detail::message_slot& m = ch.slots[seq % detail::channel::capacity];
    m.data = data;
    m.count = count;
    m.type = type;
    m.tag = tag;
    m.owned = std::move(owned);
    if (auto* pacer = group_->world->pacer.get()) {
      m.ready = pacer->post(world_rank(rank_), world_rank(peer),
                            static_cast<double>(count * size_of(type)));
    }
    m.state.store(static_cast<std::uint32_t>(detail::slot_state::posted),
                  std::memory_order_relaxed);
    ch.tail.store(seq + 1, std::memory_order_release);
    group_->bell(peer).ring();
    return seq;
  }

  // With emulated links, a copy overlaps the message's transfer, a reduction waits for it.
  enum class arrival { overlaps_use, before_use };

  // Waits for the next message from `peer`, checks it, hands its data to f, marks it consumed.
  void consume(int peer, std::size_t count, dtype type, int tag, std::string_view operation,
               detail::callable_ref<void(const void*)> f, arrival pacing = arrival::overlaps_use) {
    detail::channel& ch = group_->chan(peer, rank_);
    const std::uint64_t seq = ch.head.load(std::memory_order_relaxed);
    wait([&] { return ch.tail.load(std::memory_order_acquire) > seq; }, operation, peer,
         "receive from it");
    detail::message_slot& m = ch.slots[seq % detail::channel::capacity];
    auto expected = static_cast<std::uint32_t>(detail::slot_state::posted);
    if (!m.state.compare_exchange_strong(expected,
                                         static_cast<std::uint32_t>(detail::slot_state::reading),
                                         std::memory_order_acquire)) {
      // The sender's operation ended by an exception; where that was the world's failure, say
      // whose (a sender withdraws only after the failure is recorded, so the text is there).
      auto& world = *group_->world;
      std::string why = "the sender withdrew its message: its operation failed";
      if (world.failed.load(std::memory_order_acquire)) why += " (" + world.failure() + ")";
      throw error(operation, rank_, peer, why);
    }
    if (m.tag != tag || m.type != type || m.count != count) {
      const auto describe = [](int t, dtype d, std::size_t n) {
        return std::to_string(n) + " x " + std::string(name_of(d)) +
               (t == plan_tag ? std::string(" (collective)") : " tag " + std::to_string(t));
      };
      m.state.store(static_cast<std::uint32_t>(detail::slot_state::posted),
                    std::memory_order_release);
      throw disagreement(
          operation, rank_, peer,
          "expected " + describe(tag, type, count) + " but the peer sent " +
              describe(m.tag, m.type, m.count) +
              ": the ranks disagree on the call (set WEFT_CHECK_CALLS=1 to find where)");
    }
    // If f throws (a user's reduction), the message goes back to posted, so that its sender,
    // unwinding on the failure, can withdraw it rather than wait on it forever.
    struct give_back {
      detail::message_slot& m;
      bool done = false;
      ~give_back() {
        if (!done)
          m.state.store(static_cast<std::uint32_t>(detail::slot_state::posted),
                        std::memory_order_release);
      }
    } reading{m};
    if (auto* pacer = group_->world->pacer.get()) {
      const std::int64_t arrived = pacer->arrival(
          world_rank(peer), world_rank(rank_), static_cast<double>(count * size_of(type)), m.ready);
      if (pacing == arrival::before_use) detail::link_pacer::wait_until(arrived);
      f(m.data);
      detail::link_pacer::wait_until(arrived);
    } else {
      f(m.data);
    }
    reading.done = true;
    m.owned.reset();
    m.state.store(static_cast<std::uint32_t>(detail::slot_state::consumed),
                  std::memory_order_release);
    ch.head.store(seq + 1, std::memory_order_release);
    group_->bell(peer).ring();
  }

  // The sends of the current round. On the way out by exception it withdraws those not yet
  // consumed, so no peer reads a buffer that the unwinding is about to free.
  class pending_guard {
  public:
    explicit pending_guard(communicator& c) : c_(c) {}
    pending_guard(const pending_guard&) = delete;
    pending_guard& operator=(const pending_guard&) = delete;
    ~pending_guard() { withdraw(); }
    void withdraw() noexcept {
      for (auto [peer, seq] : sends_) {
        detail::message_slot& m =
            c_.group_->chan(c_.rank_, peer).slots[seq % detail::channel::capacity];
        // Withdraw it unless it was consumed. A peer mid-copy finishes without waiting on
        // anyone, and hands the message back (posted) if its copy or reduction failed.
        for (;;) {
          auto expected = static_cast<std::uint32_t>(detail::slot_state::posted);
          if (m.state.compare_exchange_strong(
                  expected, static_cast<std::uint32_t>(detail::slot_state::retracted),
                  std::memory_order_acq_rel) ||
              expected != static_cast<std::uint32_t>(detail::slot_state::reading)) {
            break;
          }
          std::this_thread::yield();
        }
      }
      sends_.clear();
    }
    void add(int peer, std::uint64_t seq) { sends_.emplace_back(peer, seq); }
    void wait_all(std::string_view operation) {
      for (const auto& sent : sends_) {
        const int peer = sent.first;
        const std::uint64_t seq = sent.second;
        detail::channel& ch = c_.group_->chan(c_.rank_, peer);
        c_.wait([&] { return ch.head.load(std::memory_order_acquire) > seq; }, operation, peer,
                "have its message consumed");
      }
      sends_.clear();
    }

  private:
    communicator& c_;
    std::vector<std::pair<int, std::uint64_t>> sends_;
  };

  // Returns when every rank of `members` (ranks of this communicator, including this one)
  // has arrived; what they wrote before arriving is visible after.
  void sync_with(const std::vector<int>& members, std::string_view operation) {
    for (int q : members) {
      if (q == rank_) continue;
      group_->syncs(q, rank_).fetch_add(1, std::memory_order_acq_rel);
      group_->bell(q).ring();
    }
    for (int q : members) {
      if (q == rank_) continue;
      const std::uint64_t want = ++synced_[static_cast<std::size_t>(q)];
      auto& count = group_->syncs(rank_, q);
      if (count.load(std::memory_order_acquire) < want) {
        wait([&] { return count.load(std::memory_order_acquire) >= want; }, operation, q,
             "synchronise with it");
      }
    }
  }

  std::shared_ptr<detail::local_group> group_;
  int rank_;
  std::chrono::milliseconds timeout_;
  bool watchdog_ = true;
  bool check_calls_ = false;
  weft::on_failure on_failure_ = weft::on_failure::throw_error;
  std::uint64_t seq_ = 0;             // collective operations begun
  std::uint64_t p2p_seq_ = 0;         // point-to-point calls begun
  std::vector<std::uint64_t> synced_; // syncs completed with each peer
  std::uint64_t staged_calls_ = 0;    // staged plans run: its parity picks the staging area
  std::vector<int> node_of_;
  detail::scratch_buffer scratch_;
  std::vector<const void*> srcs_;
  std::vector<int> devs_;    // scratch for the pacer's device lists
  std::vector<int> reading_; // the peers the current load step reads (peer_reads)
  std::array<std::shared_ptr<const measured_prices>, 8> measured_; // by collective
};

} // namespace weft::local

namespace weft::detail {

/// A run's option: the value set, else the environment variable's (one of `names`, the first
/// when unset or empty), naming `what` the option decides when the variable holds another.
template <class E, std::size_t N>
E set_or_environment(const std::optional<E>& set, const char* variable,
                     const std::array<std::pair<std::string_view, E>, N>& names,
                     std::string_view what) {
  if (set) return *set;
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return names[0].second;
  std::string expected;
  for (const auto& [name, value] : names) {
    if (std::string_view(v) == name) return value;
    if (!expected.empty()) expected += ", ";
    expected += '"';
    expected += name;
    expected += '"';
  }
  throw error("weft: local::run: " + std::string(variable) + "=\"" + std::string(v) +
              "\": expected one of " + expected + " (" + std::string(what) + ")");
}

/// The prices automatic picks by for a run with options opt: opt.automatic, else the
/// environment's WEFT_AUTOMATIC, else measured.
inline local::automatic_prices automatic_prices_of(const local::options& opt) {
  using local::automatic_prices;
  return set_or_environment(
      opt.automatic, "WEFT_AUTOMATIC",
      std::array{std::pair{std::string_view("measured"), automatic_prices::measured},
                 std::pair{std::string_view("model"), automatic_prices::model}},
      "how algo::automatic prices its candidates");
}

/// The bindings by name, as WEFT_BINDING (and weft-perf's -B) spell them; the first is the
/// default.
inline constexpr std::array thread_binding_names{
    std::pair{std::string_view("none"), local::thread_binding::none},
    std::pair{std::string_view("automatic"), local::thread_binding::automatic},
    std::pair{std::string_view("cpu"), local::thread_binding::cpu}};

/// A run's binding with options opt: opt.binding, else the environment's WEFT_BINDING, else
/// none.
inline local::thread_binding thread_binding_of(const local::options& opt) {
  return set_or_environment(opt.binding, "WEFT_BINDING", thread_binding_names,
                            "where local::run's rank threads run");
}

/// Where a run binds its rank threads: the CPUs of each rank (see cpus_of_rank), none where
/// it leaves them free; `required` where a thread that cannot be bound fails the run.
struct rank_cpus {
  std::vector<std::vector<int>> of_rank;
  bool required = false;
};

/// Where a run of `ranks` ranks with options opt binds its threads; `cpus`: those the caller
/// may run on.
inline rank_cpus bound_cpus(const local::options& opt, int ranks, std::span<const int> cpus) {
  using local::thread_binding;
  const thread_binding b = thread_binding_of(opt);
  const bool bind = b == thread_binding::cpu || (b == thread_binding::automatic && !cpus.empty() &&
                                                 static_cast<std::size_t>(ranks) > cpus.size());
  if (!bind) return {};
  if (cpus.empty()) // binding cpu where the platform cannot say
    throw error(
        "weft: local::run: binding cpu: the CPUs this thread may run on are unknown here; "
        "run with local::options::binding none (or WEFT_BINDING=none)");
  rank_cpus out{.of_rank = {}, .required = b == thread_binding::cpu};
  for (int r = 0; r < ranks; ++r)
    out.of_rank.push_back(cpus_of_rank(r, ranks, cpus));
  return out;
}

template <class F>
void run_ranks(topology::cluster cluster, F&& f, local::options opt) {
  (void)weft::detail::checked_timeout(opt.timeout, "local::options::timeout");
  auto world = std::make_shared<local_world>(std::move(cluster), opt.emulate_links);
  world->measurer =
      !opt.emulate_links && automatic_prices_of(opt) == local::automatic_prices::measured
          ? &measure_collective<local::communicator>
          : nullptr;
  const int n = world->size;
  std::vector<int> everyone(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    everyone[static_cast<std::size_t>(r)] = r;
  auto group = local_group::make(world, everyone);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  const rank_cpus cpus = bound_cpus(opt, n, allowed_cpus());
  const auto body = [&](int r) {
    try {
      std::optional<cpu_binding> bound;
      if (!cpus.of_rank.empty())
        bound.emplace(cpus.of_rank[static_cast<std::size_t>(r)], cpus.required, r);
      if (opt.emulate_links) link_pacer::precise_sleeps();
      local::communicator c(group, r, opt.timeout);
      c.set_watchdog(opt.watchdog);
      c.set_check_calls(opt.check_calls);
      c.set_failure_policy(opt.on_failure);
      f(c);
      world->finish(r);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      world->fail(r, e.what());
    } catch (...) {
      errors[static_cast<std::size_t>(r)] = std::current_exception();
      world->fail(r, "unknown exception");
    }
  };
  {
    std::vector<std::jthread> threads;
    threads.reserve(static_cast<std::size_t>(n));
    std::string not_started; // why a rank's thread could not start
    int r = 1;
    try {
      for (; r < n; ++r)
        threads.emplace_back(body, r);
    } catch (const std::exception& e) {
      not_started =
          "could not start a thread for rank " + std::to_string(r) + " of " + std::to_string(n) +
          " (" + e.what() +
          "): local::run runs each rank as a thread; run fewer ranks or raise the thread limit";
    }
    if (!not_started.empty()) {
      // The ranks that did start would wait for these forever (or until the watchdog): they
      // are failed at once, and the run reports why once they have returned.
      for (int q = r; q < n; ++q)
        world->fail(q, not_started);
      world->fail(0, not_started);
      threads.clear(); // joins
      throw error("local::run: " + not_started);
    }
    body(0);
  }
  // A rank that caught its error (and went on, on a shrunk communicator) rethrows nothing.
  if (world->first_failed >= 0 && errors[static_cast<std::size_t>(world->first_failed)]) {
    std::rethrow_exception(errors[static_cast<std::size_t>(world->first_failed)]);
  }
}

} // namespace weft::detail

namespace weft::local {

/// Runs f(communicator&) on n ranks, each a thread, all on one node. Returns when all have
/// returned; rethrows the first failure.
template <class F>
void run(int n, F&& f, options opt = {}) {
  WEFT_EXPECTS(n >= 1, "local::run: the number of ranks must be at least 1");
  detail::run_ranks(topology::host(n), std::forward<F>(f), opt);
}

/// Runs f on one rank per device of the cluster; ranks are grouped into its nodes, and the
/// cluster's links price plans for algo::automatic.
template <class F>
void run(const topology::cluster& cluster, F&& f, options opt = {}) {
  detail::run_ranks(cluster, std::forward<F>(f), opt);
}

} // namespace weft::local
