#pragma once
// Shared state of the in-process transport: the world (one per local::run), and one group
// per communicator. Message passing between two ranks goes through a single-producer
// single-consumer ring of descriptors; a plan's message points at the sender's own buffer
// (single copy: the receiver copies or reduces straight from it), and the sender's round
// waits until the receiver has consumed it.
#include <weft/comm/transport/detail/doorbell.hpp>
#include <weft/comm/plan.hpp>
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

namespace weft::detail {

enum class rank_status : int { running = 0, finished = 1, failed = 2 };

struct local_world {
  explicit local_world(topology::cluster c, bool emulate_links = false)
      : cluster(std::move(c)),
        size(cluster.size()),
        bells(std::make_unique<doorbell[]>(static_cast<std::size_t>(size))),
        status(std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(size))),
        pacer(emulate_links ? std::make_unique<link_pacer>(cluster) : nullptr),
        spins(static_cast<unsigned>(size) > std::thread::hardware_concurrency() ? 0 : 64) {
    for (int r = 0; r < size; ++r) status[static_cast<std::size_t>(r)].store(0);
  }

  rank_status status_of(int world_rank) const {
    return static_cast<rank_status>(status[static_cast<std::size_t>(world_rank)].load(std::memory_order_acquire));
  }
  void ring_all() {
    for (int r = 0; r < size; ++r) bells[static_cast<std::size_t>(r)].ring();
  }
  void finish(int world_rank) {
    status[static_cast<std::size_t>(world_rank)].store(static_cast<int>(rank_status::finished), std::memory_order_release);
    ring_all();
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
    status[static_cast<std::size_t>(world_rank)].store(static_cast<int>(rank_status::failed), std::memory_order_release);
    failed.store(true, std::memory_order_release);
    ring_all();
  }
  std::string failure() {
    std::lock_guard lock(mutex);
    return "rank " + std::to_string(first_failed) + " failed: " + first_error;
  }

  topology::cluster cluster;
  int size;
  std::unique_ptr<doorbell[]> bells;
  std::unique_ptr<std::atomic<int>[]> status;
  std::unique_ptr<link_pacer> pacer;  // set when the links are emulated
  int spins;                          // polls before a wait yields: none when ranks outnumber cores
  std::atomic<bool> failed{false};
  std::mutex mutex;
  int first_failed = -1;
  std::string first_error;
};

enum class slot_state : std::uint32_t { posted = 1, reading = 2, consumed = 3, retracted = 4 };

struct message_slot {
  const void* data = nullptr;
  std::size_t count = 0;
  dtype type = dtype::float32;
  int tag = 0;
  std::unique_ptr<std::byte[]> owned;  // eager point-to-point sends own a copy
  std::int64_t ready = 0;              // emulated links: when the sender's link can start it
  std::atomic<std::uint32_t> state{0};
};

/// Messages from one rank to another, in order.
struct channel {
  static constexpr std::size_t capacity = 64;
  message_slot slots[capacity];
  alignas(64) std::atomic<std::uint64_t> tail{0};  // written by the sender
  alignas(64) std::atomic<std::uint64_t> head{0};  // written by the receiver
};

struct local_group {
  local_group(std::shared_ptr<local_world> w, std::vector<int> members)
      : world(std::move(w)),
        size(static_cast<int>(members.size())),
        world_rank(std::move(members)),
        channels(std::make_unique<channel[]>(static_cast<std::size_t>(size) * static_cast<std::size_t>(size))),
        sync_counts(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(size) *
                                                                     static_cast<std::size_t>(size))),
        slots(static_cast<std::size_t>(size)),
        staging_area(std::make_unique<staging_block[]>(static_cast<std::size_t>(size) * 2)) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(size) * static_cast<std::size_t>(size); ++i) {
      sync_counts[i].store(0);
    }
  }

  channel& chan(int src, int dst) {
    return channels[static_cast<std::size_t>(src) * static_cast<std::size_t>(size) + static_cast<std::size_t>(dst)];
  }
  /// How many syncs rank `from` has arrived at together with rank `to`.
  std::atomic<std::uint64_t>& syncs(int to, int from) {
    return sync_counts[static_cast<std::size_t>(to) * static_cast<std::size_t>(size) + static_cast<std::size_t>(from)];
  }
  doorbell& bell(int r) { return world->bells[static_cast<std::size_t>(world_rank[static_cast<std::size_t>(r)])]; }

  /// Per-rank exchange area: buffers a peer-access plan reads, a call fingerprint, split
  /// arguments. Written before a sync, read after it.
  struct exchange {
    const void* buffers[3] = {nullptr, nullptr, nullptr};
    std::size_t sizes[3] = {0, 0, 0};
    std::uint64_t words[8] = {};
    std::shared_ptr<local_group> child;
  };

  std::shared_ptr<local_world> world;
  int size;
  std::vector<int> world_rank;
  std::unique_ptr<channel[]> channels;
  std::unique_ptr<std::atomic<std::uint64_t>[]> sync_counts;
  std::vector<exchange> slots;

  /// Rank r's staging area of parity 0 or 1 (plan::stage): owned by the group, so that a peer
  /// still reading it never reads freed memory, whatever the owner does meanwhile.
  struct alignas(64) staging_block {
    std::byte bytes[max_staged_scratch_bytes];
  };
  void* staging(int r, std::uint64_t parity) {
    return staging_area[static_cast<std::size_t>(r) * 2 + static_cast<std::size_t>(parity & 1)].bytes;
  }
  std::unique_ptr<staging_block[]> staging_area;
};

} // namespace weft::detail
