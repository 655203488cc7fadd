#pragma once
// What one rank of a p2p communicator holds on the device (weft/cuda/p2p.cuh): its registered
// memory, its peers' workspace addresses, its stream, and the syncs (detail/p2p_sync.cuh).
// Nothing here knows how the addresses were traded; the communicator does that over its host
// communicator.
#include <weft/comm/failure.hpp>
#include <weft/core/error.hpp>
#include <weft/cuda/detail/comm_state.hpp>
#include <weft/cuda/detail/p2p_epoch.hpp>
#include <weft/cuda/detail/p2p_plan.hpp>
#include <weft/cuda/detail/p2p_sync.cuh>
#include <weft/cuda/detail/p2p_teardown.hpp>
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/error.cuh>
#include <weft/cuda/memory.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::cuda::detail {

/// "weft: x" -> "x", for an error quoted inside another.
inline std::string_view p2p_without_prefix(std::string_view what) noexcept {
  constexpr std::string_view prefix = "weft: ";
  return what.substr(0, prefix.size()) == prefix ? what.substr(prefix.size()) : what;
}

/// One rank's registered memory: its workspace on `device`, and the host-mapped word its syncs
/// report a timeout in. Freed on destruction, unless leak() said a peer may still use it.
class p2p_rank_memory {
public:
  p2p_rank_memory(int device, std::size_t workspace_bytes, std::string_view operation, int rank)
      : device_(device) {
    const device_scope on(device);
    cuda_check(cudaMalloc(reinterpret_cast<void**>(&workspace_), workspace_bytes),
               "cudaMalloc of the workspace", operation, rank);
    void* word = nullptr;
    const cudaError_t e =
        cudaHostAlloc(&word, sizeof(std::uint64_t), cudaHostAllocMapped | cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaFree(workspace_);
      cuda_fail(e, "cudaHostAlloc of the error word", operation, rank);
    }
    error_host_ = static_cast<std::uint64_t*>(word);
    *error_host_ = 0;
    const cudaError_t m =
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_device_), word, 0);
    if (m != cudaSuccess) {
      release();
      cuda_fail(m, "cudaHostGetDevicePointer of the error word", operation, rank);
    }
  }
  p2p_rank_memory(const p2p_rank_memory&) = delete;
  p2p_rank_memory& operator=(const p2p_rank_memory&) = delete;
  ~p2p_rank_memory() { release(); }

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] std::byte* workspace() const noexcept { return workspace_; }
  [[nodiscard]] std::uint64_t* error_device() const noexcept { return error_device_; }
  /// The error word as the host reads it (the device writes it behind the compiler's back).
  [[nodiscard]] std::uint64_t error_word() const noexcept {
    return *static_cast<volatile std::uint64_t*>(error_host_);
  }
  /// Writes `w` into the error word unless a failure is there already: the host failing the
  /// rank, so that its queued syncs give up.
  void set_error_word(std::uint64_t w) noexcept {
    std::uint64_t clear = 0;
    std::atomic_ref<std::uint64_t>(*error_host_).compare_exchange_strong(clear, w);
  }
  /// Never frees: for when a peer may still read or write this memory.
  void leak() noexcept {
    workspace_ = nullptr;
    error_host_ = nullptr;
  }

private:
  void release() noexcept {
    if (workspace_ == nullptr && error_host_ == nullptr) return;
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    if (workspace_ != nullptr) (void)cudaFree(workspace_);
    if (error_host_ != nullptr) (void)cudaFreeHost(error_host_);
    if (switched) (void)cudaSetDevice(previous);
    workspace_ = nullptr;
    error_host_ = nullptr;
  }

  int device_;
  std::byte* workspace_ = nullptr;
  std::uint64_t* error_host_ = nullptr;
  std::uint64_t* error_device_ = nullptr;
};

/// The memory of every communicator of one p2p::run, freed when the run ends: after a rank
/// has moved on, returned or failed, its peers' queued kernels may still read its workspace
/// and store flags into it, so no rank frees its own.
class p2p_world {
public:
  p2p_world() = default;
  p2p_world(const p2p_world&) = delete;
  p2p_world& operator=(const p2p_world&) = delete;
  ~p2p_world() {
    // The queued work ends by itself: a sync waits at most its timeout.
    int previous = -1;
    (void)cudaGetDevice(&previous);
    std::vector<int> synced;
    for (const auto& m : memory_) {
      if (std::find(synced.begin(), synced.end(), m->device()) != synced.end()) continue;
      synced.push_back(m->device());
      if (cudaSetDevice(m->device()) == cudaSuccess) (void)cudaDeviceSynchronize();
    }
    memory_.clear();
    if (previous >= 0) (void)cudaSetDevice(previous);
  }

  void keep(std::shared_ptr<p2p_rank_memory> m) {
    const std::lock_guard lock(mutex_);
    memory_.push_back(std::move(m));
  }

private:
  std::mutex mutex_;
  std::vector<std::shared_ptr<p2p_rank_memory>> memory_;
};

/// One rank of a p2p communicator on its device. Made in two steps: the constructor allocates
/// and zeroes the workspace (before any peer learns its address), connect() takes the peers'
/// addresses. With `closing_sync` (processes, where no run outlives the ranks) close() frees its
/// memory once no peer will touch or map it again (detail/p2p_teardown.hpp); otherwise
/// (threads) the run's p2p_world frees it.
///
/// Failure. The first failure (a sync's, from the error word, or a host deadline) is recorded
/// in `family`, shared with the communicators split from this one, and written into the error
/// word if the device has not written one: from then on every check() throws it at once, so
/// the host queues nothing more, and the syncs already queued give up (detail/p2p_epoch.hpp).
/// Under on_failure::abort_job the failure ends the job instead of throwing (end_job(), with
/// `end_job` where given).
class p2p_endpoint {
public:
  p2p_endpoint(int device, int rank, int size, std::size_t data_bytes,
               std::chrono::milliseconds sync_timeout, std::chrono::milliseconds timeout,
               bool closing_sync, cudaStream_t after, std::string_view operation,
               std::shared_ptr<weft::detail::failure_state> family, on_failure policy,
               void (*end_job)() noexcept)
      : family_(family ? std::move(family) : std::make_shared<weft::detail::failure_state>()),
        policy_(policy),
        end_job_(end_job),
        device_(device),
        rank_(rank),
        size_(size),
        layout_(p2p_lay_out_workspace(size, data_bytes)),
        sync_timeout_(sync_timeout),
        timeout_(timeout),
        closing_sync_(closing_sync),
        stream_(new_stream(device)) {
    const device_scope on(device);
    memory_ = std::make_shared<p2p_rank_memory>(device, layout_.total, operation, rank);
    // Flags and counters start at zero, on the device before any peer can store a flag.
    cuda_check(cudaMemsetAsync(memory_->workspace(), 0, layout_.staging, stream_.get()),
               "cudaMemsetAsync", operation, rank);
    cuda_check(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize", operation, rank);
    if (after != nullptr) order_after(stream_.get(), after);
    for (int q = 0; q < size; ++q)
      everyone_.push_back(q);
  }
  p2p_endpoint(const p2p_endpoint&) = delete;
  p2p_endpoint& operator=(const p2p_endpoint&) = delete;
  /// Without close() (the communicator failed to be made, or was dropped unwinding), a rank
  /// between processes cannot know that its peers are done with its memory: it stays allocated.
  ~p2p_endpoint() {
    if (closing_sync_ && !closed_) memory_->leak();
  }

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }
  [[nodiscard]] const p2p_workspace_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const std::shared_ptr<p2p_rank_memory>& memory() const noexcept { return memory_; }
  [[nodiscard]] std::byte* workspace() const noexcept { return memory_->workspace(); }
  [[nodiscard]] const std::vector<int>& everyone() const noexcept { return everyone_; }
  [[nodiscard]] std::chrono::milliseconds sync_timeout() const noexcept { return sync_timeout_; }
  void set_sync_timeout(std::chrono::milliseconds t) noexcept { sync_timeout_ = t; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ = t; }
  /// The failure state this rank shares with the communicators split from it.
  [[nodiscard]] const std::shared_ptr<weft::detail::failure_state>& family() const noexcept {
    return family_;
  }
  [[nodiscard]] on_failure policy() const noexcept { return policy_; }
  [[nodiscard]] auto end_job() const noexcept { return end_job_; }
  /// The gate of this rank's data kernels: closed once a sync of the rank gave up.
  [[nodiscard]] p2p_data_gate data_gate() const noexcept {
    return {reinterpret_cast<const std::uint64_t*>(workspace() + layout_.counters) + rank_};
  }

  /// The peers' workspaces, bases[q] in this rank's address space (its own included), and the
  /// IPC mappings among them that the destructor closes.
  void connect(std::vector<std::byte*> bases, std::vector<void*> imported) {
    bases_ = std::move(bases);
    imported_ = std::move(imported);
  }

  /// Rank q's data area and staging area `area`.
  [[nodiscard]] std::byte* data(int q) const noexcept {
    return bases_[static_cast<std::size_t>(q)] + layout_.data;
  }
  [[nodiscard]] std::byte* staging(int q, int area) const noexcept {
    return bases_[static_cast<std::size_t>(q)] + layout_.staging +
           static_cast<std::size_t>(area) * layout_.staging_stride;
  }

  /// Queues a sync over `members` (ranks, this one may be among them) on the stream.
  void sync(const std::vector<int>& members, std::string_view operation) {
    const p2p_sync_args a = sync_args(members, operation, 1);
    p2p_sync_kernel<<<1, p2p_sync_threads, 0, stream()>>>(a);
    cuda_check(cudaGetLastError(), "launching the sync kernel", operation, rank_);
  }

  /// The arguments of the next `syncs` syncs over `members`, numbered one after the other from
  /// the one returned (a fused kernel's barriers), each named `operation` in a timeout.
  p2p_sync_args sync_args(const std::vector<int>& members, std::string_view operation, int syncs) {
    p2p_sync_args a{};
    a.count = static_cast<int>(members.size());
    a.rank = rank_;
    for (std::size_t j = 0; j < members.size(); ++j) {
      const int q = members[j];
      a.members[j] = q;
      a.peer_flags[j] =
          reinterpret_cast<std::uint64_t*>(bases_[static_cast<std::size_t>(q)] + layout_.flags);
    }
    std::byte* const mine = workspace();
    a.flags = reinterpret_cast<std::uint64_t*>(mine + layout_.flags);
    a.counters = reinterpret_cast<std::uint64_t*>(mine + layout_.counters);
    a.error = memory_->error_device();
    a.timeout_ns = static_cast<std::uint64_t>(std::chrono::nanoseconds(sync_timeout_).count());
    a.sync = syncs_ & 0x7fffffffu;
    for (int k = 0; k < syncs; ++k) {
      sync_names_[syncs_ % sync_names_.size()] = operation;
      ++syncs_;
    }
    return a;
  }

  /// This rank's grid-barrier words (detail/p2p_fused.cuh): the arrival counter, then the
  /// generation.
  [[nodiscard]] std::uint32_t* grid_words() const noexcept {
    return reinterpret_cast<std::uint32_t*>(workspace() + layout_.grid);
  }

  /// Throws weft::error if the communicator has failed: the family's first failure, or a
  /// sync of this rank that gave up (at any time before now, once the device has written it),
  /// naming that sync's operation, this rank and the peer. Reads host memory only.
  void check(std::string_view operation) {
    if (family_->failed()) {
      memory_->set_error_word(
          p2p_error_word(p2p_cause::host_failed, 0, rank_)); // a split's failure
      family_->rethrow(operation, rank_);
    }
    const std::uint64_t w = memory_->error_word();
    if (w != 0) fail(w, operation);
  }

  /// Fails the communicator with `e` (unless it failed before: then the first failure is what
  /// every later call quotes) and throws it, or ends the job under on_failure::abort_job. The
  /// rank's queued syncs give up.
  [[noreturn]] WEFT_COLD void fail_with(const error& e) {
    family_->fail(e.what());
    memory_->set_error_word(p2p_error_word(p2p_cause::host_failed, 0, rank_));
    if (policy_ == on_failure::abort_job) detail::end_job(e.what(), end_job_);
    throw e;
  }

  /// Waits until the stream is idle, at most timeout(), then reports a sync's timeout. After a
  /// timeout the stream still drains (the rank's later syncs give up at once), so the caller's
  /// buffers are no longer in use when this throws.
  void wait_idle(std::string_view operation, std::string_view what) {
    if (capturing(stream())) {
      throw error(
          operation, rank_, error::unknown,
          "a blocking call cannot run while the stream is being captured into a CUDA graph");
    }
    const cudaError_t e = poll_stream(stream(), std::chrono::steady_clock::now() + timeout_);
    if (e == cudaErrorNotReady) {
      check(operation);
      fail_with(error(operation, rank_, error::unknown,
                      "timed out after " + std::to_string(timeout_.count()) + " ms waiting to " +
                          std::string(what) +
                          " (the stream's work did not finish; a kernel of the program's own may "
                          "be stuck). The "
                          "communicator cannot be used any more"));
    }
    if (e != cudaSuccess) {
      fail_with(
          error(operation, rank_, error::unknown, "cudaStreamQuery failed: " + cuda_error_text(e)));
    }
    check(operation);
  }

  /// Lets go of this rank's memory, once (ranks between processes; threads leave it to their
  /// run's p2p_world): sync with every rank on the device, close the imports, `barrier()` (the
  /// host communicator's), free the workspace, in p2p_tear_down's order; where the communicator
  /// has failed, the process is unwinding or a step fails, the memory stays allocated. Never
  /// throws.
  template <class Barrier>
  void close(Barrier&& barrier) noexcept {
    if (!closing_sync_ || closed_) return;
    closed_ = true;
    struct steps {
      p2p_endpoint& ep;
      Barrier& barrier;
      int uncaught;
      [[nodiscard]] bool healthy() const {
        return uncaught == 0 && ep.bases_.size() == static_cast<std::size_t>(ep.size_) &&
               ep.memory_->error_word() == 0 && !ep.family_->failed() && !capturing(ep.stream());
      }
      void sync_on_device() {
        ep.sync(ep.everyone_, "close");
        ep.wait_idle("close", "sync with every rank before freeing the workspace");
      }
      void close_imports() noexcept {
        for (void* p : ep.imported_)
          (void)cudaIpcCloseMemHandle(p);
        ep.imported_.clear();
      }
      void host_barrier() { barrier(); }
      void free_memory() noexcept { ep.memory_.reset(); }
      void leak_memory() noexcept {
        if (ep.memory_) ep.memory_->leak();
      }
    };
    try {
      const device_scope on(device_);
      p2p_tear_down(steps{*this, barrier, std::uncaught_exceptions()});
    } catch (...) { // device_scope could not switch devices
      if (memory_) memory_->leak();
    }
  }

  /// Queues later work on `s` instead, after what the current stream holds; `s` is borrowed.
  void set_stream(cudaStream_t s) {
    order_after(s, stream());
    stream_ = cuda::stream::borrow(s);
  }

private:
  static cuda::stream new_stream(int device) {
    const device_scope on(device);
    return cuda::stream();
  }

  static void order_after(cudaStream_t later, cudaStream_t earlier) {
    if (later == earlier) return;
    const cuda::event e;
    e.record(earlier);
    WEFT_CUDA_TRY(cudaStreamWaitEvent(later, e.get(), 0));
  }

  [[noreturn]] WEFT_COLD void fail(std::uint64_t w, std::string_view operation) {
    const p2p_error t = p2p_read_error_word(w);
    if (t.cause == p2p_cause::host_failed) family_->rethrow(operation, rank_);
    // The sync's name, if it is among the last few this rank queued (a graph's replay keeps
    // the number the sync had when it was captured).
    const std::uint32_t age = (static_cast<std::uint32_t>(syncs_) - t.sync) & 0x7fffffffu;
    const bool known = age >= 1 && age <= sync_names_.size();
    const std::string name =
        known ? sync_names_[t.sync % sync_names_.size()] : std::string(operation);
    std::string what =
        t.cause == p2p_cause::peer_abandoned
            ? std::string(
                  "that rank gave up on a sync with this one (it had failed: a sync of its own "
                  "timed out, "
                  "or its host stopped it), so this rank's sync failed rather than pass on a stale "
                  "flag")
            : "timed out after " + std::to_string(sync_timeout_.count()) +
                  " ms at a sync, waiting for that rank to arrive (every rank must make the same "
                  "calls in the "
                  "same order: one that failed, returned or called something else never arrives)";
    if (name != operation) what += "; found by " + std::string(operation);
    fail_with(error(name, rank_, t.peer, what + ". The communicator cannot be used any more"));
  }

  std::shared_ptr<weft::detail::failure_state> family_;
  on_failure policy_;
  void (*end_job_)() noexcept;
  int device_;
  int rank_;
  int size_;
  p2p_workspace_layout layout_;
  std::chrono::milliseconds sync_timeout_;
  std::chrono::milliseconds timeout_;
  bool closing_sync_;
  bool closed_ = false;
  cuda::stream stream_;
  std::shared_ptr<p2p_rank_memory> memory_;
  std::vector<std::byte*> bases_;
  std::vector<void*> imported_;
  std::vector<int> everyone_;
  std::uint64_t syncs_ = 0;
  std::array<std::string, 256> sync_names_; // the operation of each of the last syncs
};

} // namespace weft::cuda::detail
