#pragma once
// The emulated transport's shared state (cuda/emulated.cuh): the host messages its ranks trade,
// the run's pools of events and device memory, a rank's growing device area, and where a
// round's receives land.
#include <weft/comm/plan.hpp>
#include <weft/comm/plan/check.hpp>
#include <weft/core/error.hpp>
#include <weft/core/types.hpp>
#include <weft/cuda/detail/receive_landing.hpp>
#include <weft/cuda/error.cuh>
#include <weft/cuda/memory.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft::cuda::detail {

inline std::int64_t word_of(const void* p) noexcept {
  return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p));
}

template <class P>
P pointer_from(std::int64_t w) noexcept {
  return reinterpret_cast<P>(static_cast<std::uintptr_t>(w));
}

/// The kinds of host message of the emulated transport.
enum class emulated_message : std::int64_t {
  staging = 0x7765667400000001, // {kind, 0, staging area, 0}: at construction
  buffers,                      // {kind, buffer, address, count} x 3: a peer-access plan starts
  ready,                        // {kind, event, source, count}: a send step
  consumed,                     // {kind, event, 0, 0}: the receiver has queued its copy
  sync,                         // {kind, event, 0, 0}: a sync step
};

/// One host message: every kind has the same four words, so any can be received first.
struct emulated_note {
  std::int64_t words[4] = {0, 0, 0, 0};
  [[nodiscard]] emulated_message kind() const noexcept {
    return static_cast<emulated_message>(words[0]);
  }
  [[nodiscard]] std::int64_t event() const noexcept { return words[1]; }
  [[nodiscard]] std::int64_t address() const noexcept { return words[2]; }
  [[nodiscard]] std::int64_t count() const noexcept { return words[3]; }
};

constexpr std::string_view name_of(emulated_message m) noexcept {
  switch (m) {
    case emulated_message::staging: return "staging-area";
    case emulated_message::buffers: return "buffer-address";
    case emulated_message::ready: return "ready";
    case emulated_message::consumed: return "consumed";
    case emulated_message::sync: return "sync";
  }
  return "unknown";
}

/// Events without timing, shared by the ranks of one run. take() hands out an event that no
/// one waits on; give_back() is called by its waiter once the wait is queued.
class event_pool {
public:
  event_pool() = default;
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;
  ~event_pool() {
    for (cudaEvent_t e : all_)
      (void)cudaEventDestroy(e);
  }

  cudaEvent_t take() {
    const std::lock_guard lock(mutex_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
    all_.reserve(all_.size() + 1);
    free_.reserve(all_.size() + 1); // so give_back never allocates
    cudaEvent_t e = nullptr;
    WEFT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    all_.push_back(e);
    return e;
  }
  void give_back(cudaEvent_t e) {
    const std::lock_guard lock(mutex_);
    free_.push_back(e);
  }

private:
  std::mutex mutex_;
  std::vector<cudaEvent_t> free_;
  std::vector<cudaEvent_t> all_;
};

/// What the ranks of one emulated run share: the device, the event pool, and every device
/// allocation of its communicators, freed only when the run ends (see the header comment).
class emulated_world {
public:
  explicit emulated_world(int device) : device_(device) {}
  emulated_world(const emulated_world&) = delete;
  emulated_world& operator=(const emulated_world&) = delete;
  ~emulated_world() {
    (void)cudaDeviceSynchronize(); // queued copies may still read any of this memory
    for (void* p : memory_)
      (void)cudaFree(p);
  }

  [[nodiscard]] int device() const noexcept { return device_; }
  event_pool& events() noexcept { return events_; }

  void* allocate(std::size_t bytes) {
    const std::lock_guard lock(mutex_);
    memory_.reserve(memory_.size() + 1); // so that a successful cudaMalloc is always recorded
    void* p = nullptr;
    WEFT_CUDA_TRY(cudaMalloc(&p, bytes));
    memory_.push_back(p);
    return p;
  }

private:
  int device_;
  std::mutex mutex_;
  std::vector<void*> memory_;
  event_pool events_;
};

/// A rank's device area that only grows; a replaced area stays with the world.
class device_area {
public:
  void* get(std::size_t bytes, emulated_world& world) {
    if (bytes > size_) {
      const std::size_t grown = std::max(bytes, 2 * size_);
      data_ = world.allocate(grown);
      size_ = grown;
    }
    return data_;
  }

private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Where the messages of one round land (detail/receive_landing.hpp's rule), for the rank's
/// input, output and scratch at the addresses `base` (input == output in place): offsets[k]
/// becomes round[k]'s byte offset in the round's temporary area (at its destination's
/// address mod 16, the area itself on a boundary of device_alignment), or lands_in_place.
/// Returns the bytes of temporaries the round needs.
inline std::size_t place_receives(std::span<const step> round, const std::uintptr_t (&base)[3],
                                  std::size_t element_size, std::vector<std::size_t>& offsets) {
  offsets.resize(round.size());
  const std::size_t phase[3] = {base[0] % pack_bytes, base[1] % pack_bytes, base[2] % pack_bytes};
  return place_round_receives(round, base[0] == base[1], element_size, phase, offsets);
}

/// Checks a plan against this rank's buffers and communicator before anything is queued:
/// every range of this rank's own buffers within it, every peer and group member a rank,
/// every group index valid. Peers' ranges are checked when their addresses arrive.
inline void check_plan(const plan& pl, const std::size_t (&sizes)[3], int rank, int size,
                       std::string_view operation) {
  plan_check_hooks none;
  check_plan_steps(pl, {.rank = rank, .size = size, .operation = operation, .sizes = sizes}, none);
}

/// "weft: x" -> "x", for an error quoted inside another.
inline std::string_view without_prefix(std::string_view what) noexcept {
  constexpr std::string_view prefix = "weft: ";
  return what.substr(0, prefix.size()) == prefix ? what.substr(prefix.size()) : what;
}

/// The current device; a weft::error saying why where there is none.
inline int current_device(std::string_view who) {
  if (const std::string why = no_device_reason(); !why.empty()) {
    throw error("weft: " + std::string(who) + ": " + why);
  }
  int d = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&d));
  return d;
}

} // namespace weft::cuda::detail
