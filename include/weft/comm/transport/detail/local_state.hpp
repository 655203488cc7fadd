#pragma once
// Shared state of the in-process transport: the world (one per local::run), and one group
// per communicator. Message passing between two ranks goes through a single-producer
// single-consumer ring of descriptors; a plan's message points at the sender's own buffer
// (single copy: the receiver copies or reduces straight from it), and the sender's round
// waits until the receiver has consumed it.
#include <weft/comm/failure.hpp>
#include <weft/comm/plan.hpp>
#include <weft/comm/progress.hpp>
#include <weft/comm/transport/detail/cpu_binding.hpp>
#include <weft/comm/transport/detail/doorbell.hpp>
#include <weft/comm/transport/detail/link_pacer.hpp>
#include <weft/core/error.hpp>
#include <weft/core/types.hpp>
#include <weft/topology/topology.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace weft {
struct measured_prices; // comm/measured_prices.hpp
namespace local {
class communicator;
} // namespace local
} // namespace weft

namespace weft::detail {

/// Measures automatic's prices of a collective on a local communicator, all its ranks together
/// (comm/measured_prices.hpp).
/// base: the communicator's table to continue at the large sizes, or none.
using local_measurer = std::shared_ptr<const measured_prices> (*)(local::communicator&, collective,
                                                                  bool peer_access, bool messages,
                                                                  const measured_prices* base);

/// The measurement local_measurer points at (defined in comm/measured_prices.hpp).
template <class Comm>
std::shared_ptr<const measured_prices> measure_collective(Comm& comm, collective c,
                                                          bool peer_access, bool messages,
                                                          const measured_prices* base);

// left: a rank of the world that a shrink() did not take into the new one.
struct local_group;

enum class rank_status : int { running = 0, finished = 1, failed = 2, left = 3 };

inline const char* name_of(rank_status s) noexcept {
  switch (s) {
    case rank_status::running: return "running";
    case rank_status::finished: return "finished";
    case rank_status::failed: return "failed";
    case rank_status::left: return "left";
  }
  return "?";
}

struct local_world {
  explicit local_world(topology::cluster c, bool emulate_links = false)
      : cluster(std::move(c)),
        size(cluster.size()),
        bells(std::make_unique<doorbell[]>(static_cast<std::size_t>(size))),
        status(std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(size))),
        failures(std::make_unique<failure_state[]>(static_cast<std::size_t>(size))),
        pacer(emulate_links ? std::make_unique<link_pacer>(cluster) : nullptr),
        spins(static_cast<std::size_t>(size) > usable_cpus() ? 0 : 64) {
    for (int r = 0; r < size; ++r)
      status[static_cast<std::size_t>(r)].store(0);
  }

  rank_status status_of(int world_rank) const {
    return static_cast<rank_status>(
        status[static_cast<std::size_t>(world_rank)].load(std::memory_order_acquire));
  }
  void ring_all() {
    for (int r = 0; r < size; ++r)
      bells[static_cast<std::size_t>(r)].ring();
  }
  void finish(int world_rank) {
    status[static_cast<std::size_t>(world_rank)].store(static_cast<int>(rank_status::finished),
                                                       std::memory_order_release);
    ring_all();
    for (auto& w : successors_of(world_rank))
      w->finish(world_rank);
  }
  /// Records a rank's failure; the first one recorded is what local::run rethrows.
  void fail(int world_rank, const std::string& what) {
    {
      std::lock_guard lock(mutex);
      if (first_failed < 0) {
        first_failed = world_rank;
        first_error = what;
      }
    }
    status[static_cast<std::size_t>(world_rank)].store(static_cast<int>(rank_status::failed),
                                                       std::memory_order_release);
    failed.store(true, std::memory_order_release);
    ring_all();
    for (auto& w : successors_of(world_rank))
      w->fail(world_rank, what);
  }
  /// A world that shrink() made from this one: a rank's end (local::run's thread returning or
  /// throwing) is recorded here and passed on to every successor it is a member of, so its
  /// peers there learn of it at once too.
  void add_successor(std::shared_ptr<local_world> w) {
    std::lock_guard lock(mutex);
    successors.push_back(std::move(w));
  }
  std::vector<std::shared_ptr<local_world>> successors_of(int world_rank) {
    std::lock_guard lock(mutex);
    std::vector<std::shared_ptr<local_world>> v;
    for (const auto& w : successors) {
      if (w->status_of(world_rank) != rank_status::left) v.push_back(w);
    }
    return v;
  }
  /// Fails every pending and later operation of this world without failing a rank (the
  /// watchdog, or communicator::abort): the first reason recorded is what the others report.
  void abort(int world_rank, const std::string& why) {
    {
      std::lock_guard lock(mutex);
      if (abort_reason.empty() && first_failed < 0)
        abort_reason = "rank " + std::to_string(world_rank) + " aborted: " + why;
    }
    failed.store(true, std::memory_order_release);
    ring_all();
  }
  failure_state& failure_of(int world_rank) {
    return failures[static_cast<std::size_t>(world_rank)];
  }
  std::string failure() {
    std::lock_guard lock(mutex);
    if (first_failed < 0) return abort_reason;
    return "rank " + std::to_string(first_failed) + " failed: " + first_error;
  }
  /// The communicators of this world still in use (for the dumps).
  void add_group(const std::shared_ptr<local_group>& g) {
    std::lock_guard lock(mutex);
    std::erase_if(groups, [](const std::weak_ptr<local_group>& w) { return w.expired(); });
    groups.push_back(g);
  }
  std::vector<std::shared_ptr<local_group>> live_groups() {
    std::lock_guard lock(mutex);
    std::vector<std::shared_ptr<local_group>> v;
    for (const auto& w : groups) {
      if (auto g = w.lock()) v.push_back(std::move(g));
    }
    return v;
  }

  topology::cluster cluster;
  int size;
  std::unique_ptr<doorbell[]> bells;
  std::unique_ptr<std::atomic<int>[]> status;
  // Per world rank: the error its first failed call threw (or, for a rank that was in no
  // call, the world's failure as it first saw it), which its later calls quote. Shared by a
  // rank's communicators of this world and its progress threads.
  std::unique_ptr<failure_state[]> failures;
  std::unique_ptr<link_pacer> pacer; // set when the links are emulated
  int spins;                         // polls before a wait yields: none when ranks outnumber cores
  local_measurer measurer = nullptr; // set: automatic picks by measured prices
  std::atomic<bool> failed{false};
  std::mutex mutex;
  // Held by a rank whose deadline passed while it finds the culprit and aborts the world, so
  // that ranks timing out at the same moment give one verdict, read while every rank is still
  // where it waited (a rank that unwinds first would look as if it waited on nobody).
  std::mutex watchdog;
  int first_failed = -1;
  std::string first_error;
  std::string abort_reason;
  std::vector<std::shared_ptr<local_world>> successors; // worlds shrink() made from this one
  std::vector<std::weak_ptr<local_group>> groups;       // its communicators
  std::atomic<int> communicators{0};                    // numbers the groups, for the dumps
};

enum class slot_state : std::uint32_t { posted = 1, reading = 2, consumed = 3, retracted = 4 };

struct message_slot {
  const void* data = nullptr;
  std::size_t count = 0;
  dtype type = dtype::float32;
  int tag = 0;
  std::unique_ptr<std::byte[]> owned; // eager point-to-point sends own a copy
  std::int64_t ready = 0;             // emulated links: when the sender's link can start it
  std::atomic<std::uint32_t> state{0};
};

/// Messages from one rank to another, in order.
struct channel {
  static constexpr std::size_t capacity = 64;
  message_slot slots[capacity];
  alignas(64) std::atomic<std::uint64_t> tail{0}; // written by the sender
  alignas(64) std::atomic<std::uint64_t> head{0}; // written by the receiver
};

struct local_group {
  local_group(std::shared_ptr<local_world> w, std::vector<int> members)
      : world(std::move(w)),
        size(static_cast<int>(members.size())),
        world_rank(std::move(members)),
        id(world->communicators.fetch_add(1, std::memory_order_relaxed)),
        channels(std::make_unique<std::atomic<channel*>[]>(static_cast<std::size_t>(size) *
                                                           static_cast<std::size_t>(size))),
        sync_counts(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(size) *
                                                                   static_cast<std::size_t>(size))),
        slots(static_cast<std::size_t>(size)),
        progress(std::make_unique<progress_record[]>(static_cast<std::size_t>(size))),
        staging_area(std::make_unique<staging_block[]>(static_cast<std::size_t>(size) * 2)) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(size) * static_cast<std::size_t>(size);
         ++i) {
      sync_counts[i].store(0);
    }
  }

  ~local_group() {
    for (std::size_t i = 0; i < static_cast<std::size_t>(size) * static_cast<std::size_t>(size);
         ++i)
      delete channels[i].load(std::memory_order_relaxed);
  }
  local_group(const local_group&) = delete;
  local_group& operator=(const local_group&) = delete;

  /// The channel from src to dst, made by whichever of the two ends first needs it: a group
  /// holds channels for the pairs that talk (2p for a ring), not for all p^2 pairs.
  channel& chan(int src, int dst) {
    std::atomic<channel*>& slot =
        channels[static_cast<std::size_t>(src) * static_cast<std::size_t>(size) +
                 static_cast<std::size_t>(dst)];
    channel* c = slot.load(std::memory_order_acquire);
    if (c != nullptr) return *c;
    auto fresh = std::make_unique<channel>();
    if (slot.compare_exchange_strong(c, fresh.get(), std::memory_order_acq_rel,
                                     std::memory_order_acquire))
      return *fresh.release();
    return *c; // the other end made it first
  }
  /// How many syncs rank `from` has arrived at together with rank `to`.
  std::atomic<std::uint64_t>& syncs(int to, int from) {
    return sync_counts[static_cast<std::size_t>(to) * static_cast<std::size_t>(size) +
                       static_cast<std::size_t>(from)];
  }
  doorbell& bell(int r) {
    return world->bells[static_cast<std::size_t>(world_rank[static_cast<std::size_t>(r)])];
  }

  /// Per-rank exchange area: buffers a peer-access plan reads, a call fingerprint, split
  /// arguments. Written before a sync, read after it.
  ///
  /// A peer loads from the buffers only while it is counted in `readers` and `published`
  /// holds; the owner's call, failing, clears `published` and waits for `readers` to drop to
  /// zero before its error leaves, so no peer touches the user's buffers after the call.
  /// Both sides use sequentially consistent operations: either the reader sees the buffers
  /// withdrawn, or the owner sees the reader.
  struct exchange {
    const void* buffers[3] = {nullptr, nullptr, nullptr};
    std::size_t sizes[3] = {0, 0, 0};
    std::size_t count = 0; // the published call's count (plan::count), which its loads check
    std::atomic<bool> published{false};
    std::atomic<int> readers{0};
    std::uint64_t words[8] = {};
    std::shared_ptr<local_group> child;
  };

  std::shared_ptr<local_world> world;
  int size;
  std::vector<int> world_rank;
  int id;                                            // this communicator's number in its world
  std::unique_ptr<std::atomic<channel*>[]> channels; // src * size + dst; null until chan() makes it
  std::unique_ptr<std::atomic<std::uint64_t>[]> sync_counts;
  std::vector<exchange> slots;
  std::unique_ptr<progress_record[]> progress; // per rank of the group, written by that rank

  /// Makes a group and registers it with its world, where the dumps find it.
  static std::shared_ptr<local_group> make(std::shared_ptr<local_world> w,
                                           std::vector<int> members) {
    auto g = std::make_shared<local_group>(std::move(w), std::move(members));
    g->world->add_group(g);
    return g;
  }

  /// Rank r's staging area of parity 0 or 1 (plan::stage): owned by the group, so that a peer
  /// still reading it never reads freed memory, whatever the owner does meanwhile.
  struct alignas(64) staging_block {
    std::byte bytes[max_staged_scratch_bytes];
    std::size_t count = 0; // the staged call's count (plan::count), which its loads check
  };
  staging_block& staging_of(int r, std::uint64_t parity) {
    return staging_area[static_cast<std::size_t>(r) * 2 + static_cast<std::size_t>(parity & 1)];
  }
  void* staging(int r, std::uint64_t parity) { return staging_of(r, parity).bytes; }
  std::unique_ptr<staging_block[]> staging_area;

  /// communicator::shrink's rendezvous: who joined, and once closed, the new group.
  struct shrink_state {
    std::mutex mutex;
    std::vector<char> joined;
    bool closed = false;
    std::vector<int> survivors; // ranks of this group, in order
    std::shared_ptr<local_group> result;
  };
  shrink_state shrinking;
};

/// The flight recorder: every operation in progress in the world, one line each (a rank may
/// have one per communicator, e.g. its progress thread's), and one line for each rank in
/// none, with the last operations it finished. Sorted by world rank.
inline std::vector<rank_progress> world_progress(local_world& world) {
  const auto groups = world.live_groups();
  std::vector<rank_progress> out;
  for (int w = 0; w < world.size; ++w) {
    const std::string status = name_of(world.status_of(w));
    std::size_t lines = 0;
    // The rank's idle line: the record that finished last. A record read as active may have
    // finished by the time its snapshot is taken, so the snapshot decides, not active().
    rank_progress idle;
    std::int64_t idle_done = -1;
    for (const auto& g : groups) {
      for (int r = 0; r < g->size; ++r) {
        if (g->world_rank[static_cast<std::size_t>(r)] != w) continue;
        const progress_record& rec = g->progress[static_cast<std::size_t>(r)];
        auto p = rec.snapshot(w, status, &g->world_rank);
        if (p.in_operation()) {
          out.push_back(std::move(p));
          ++lines;
        } else if (rec.last_done() > idle_done) {
          idle_done = rec.last_done();
          idle = std::move(p);
        }
      }
    }
    if (lines == 0) {
      idle.rank = w;
      idle.status = status;
      out.push_back(std::move(idle));
    }
  }
  return out;
}

/// The watchdog's verdict: starting from rank `peer` of group `g`, which a rank has waited on
/// past its deadline, follows "waits on" (within a communicator, and to a rank's operation on
/// another communicator when it is not in this one's) to the rank holding everyone up.
inline std::string find_culprit(const std::shared_ptr<local_group>& start, int peer) {
  local_world& world = *start->world;
  const auto groups = world.live_groups();
  std::vector<std::pair<int, int>> seen; // (communicator, rank) visited
  const local_group* g = start.get();
  int r = peer;
  std::string said;
  for (;;) {
    const int w = g->world_rank[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < seen.size(); ++i) {
      if (seen[i] == std::pair{g->id, r}) {
        return said +
               "ranks wait on each other in a cycle (they are in different calls, or in different "
               "orders; "
               "run with WEFT_CHECK_CALLS=1 to find the call)";
      }
    }
    seen.emplace_back(g->id, r);
    const rank_status st = world.status_of(w);
    if (st != rank_status::running) {
      return said + "rank " + std::to_string(w) + " " + name_of(st) + " and will not arrive";
    }
    rank_progress p =
        g->progress[static_cast<std::size_t>(r)].snapshot(w, "running", &g->world_rank);
    if (!p.in_operation()) { // not in this communicator's call: in another's?
      const local_group* other = nullptr;
      int other_rank = -1;
      for (const auto& h : groups) {
        for (int q = 0; q < h->size && other == nullptr; ++q) {
          if (h.get() != g && h->world_rank[static_cast<std::size_t>(q)] == w &&
              h->progress[static_cast<std::size_t>(q)].active()) {
            other = h.get();
            other_rank = q;
          }
        }
      }
      if (other == nullptr) {
        return said + "rank " + std::to_string(w) +
               " is outside any weft operation: it has not made the call" +
               (p.history.empty() ? std::string() : " (its last was " + p.history.back() + ")");
      }
      p = other->progress[static_cast<std::size_t>(other_rank)].snapshot(w, "running",
                                                                         &other->world_rank);
      if (p.in_operation()) { // else it finished that one meanwhile: look again from there
        said += "rank " + std::to_string(w) + " has not made the call on comm " +
                std::to_string(g->id) + ": it is in " + p.position() + " on comm " +
                std::to_string(other->id) + "; ";
      }
      g = other;
      r = other_rank;
      if (!p.in_operation()) continue;
    }
    if (p.waiting_on_comm_rank < 0) {
      return said + "rank " + std::to_string(w) + " is stalled inside " + p.position() + " for " +
             std::to_string(static_cast<long long>(p.busy_ms)) +
             " ms, waiting on no rank (its own code or reduction)";
    }
    r = p.waiting_on_comm_rank;
  }
}

} // namespace weft::detail
