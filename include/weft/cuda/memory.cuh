#pragma once
// Owning handles for device resources (buffers, streams, events), weft's stream-ordered memory
// pools, and device discovery. Streams and events can also be borrowed: a handle made from the
// user's cudaStream_t never destroys it.
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/error.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace weft::cuda {

/// How many devices this process sees; 0 (not an error) where there is no driver or device.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError(); // clear the sticky "no device" status
    return 0;
  }
  return n;
}

/// Why device code cannot run here ("" when it can): what a GPU test prints when it skips.
inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
           ")";
  }
  return n == 0 ? "no CUDA device" : "";
}

/// n elements of T in device memory, uninitialised.
template <class T>
class device_buffer {
public:
  device_buffer() = default;
  explicit device_buffer(std::size_t n) : n_(n) {
    if (n != 0) WEFT_CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
  }
  device_buffer(device_buffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~device_buffer() { release(); }

  [[nodiscard]] T* data() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return n_ * sizeof(T); }

private:
  void release() noexcept {
    if (p_ != nullptr) (void)cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// How much memory weft's pools keep once freed, rather than return to the system at the next
/// synchronization (cudaMemPoolAttrReleaseThreshold), unless set_pool_release_threshold says
/// otherwise: all of it. A training step frees and allocates the same transient buffers each
/// time; CUDA's default of 0 gives them back at every synchronize and maps them afresh in the
/// next step. The pools then hold the peak of weft's transient memory: trim_pools gives it back.
inline constexpr std::uint64_t default_pool_release_threshold =
    std::numeric_limits<std::uint64_t>::max();

namespace detail {

/// weft's pools, one per device (null until made), and the release threshold they take.
struct pool_registry {
  std::mutex m;
  std::vector<cudaMemPool_t> pools;
  std::uint64_t release_threshold = default_pool_release_threshold;
};

inline pool_registry& pools() {
  static pool_registry r;
  return r;
}

/// Lets every device that can reach `device`'s memory read and write `pool`'s allocations
/// (cudaMemPoolSetAccess; a pool's memory is otherwise reachable from its own device only,
/// peer access or not).
inline void grant_peer_access(cudaMemPool_t pool, int device) {
  int count = 0;
  WEFT_CUDA_TRY(cudaGetDeviceCount(&count));
  std::vector<cudaMemAccessDesc> access;
  for (int peer = 0; peer < count; ++peer) {
    int can = 0;
    if (peer != device) WEFT_CUDA_TRY(cudaDeviceCanAccessPeer(&can, peer, device));
    if (can != 0) {
      cudaMemAccessDesc a{};
      a.location.type = cudaMemLocationTypeDevice;
      a.location.id = peer;
      a.flags = cudaMemAccessFlagsProtReadWrite;
      access.push_back(a);
    }
  }
  if (!access.empty()) WEFT_CUDA_TRY(cudaMemPoolSetAccess(pool, access.data(), access.size()));
}

} // namespace detail

/// Opt-in, for an application that runs NCCL over several GPUs of one process
/// (nccl::init_all) on buffers from cudaMallocAsync: grants every device that can reach
/// `device` access to `device`'s default memory pool, which weft otherwise leaves alone. NCCL
/// between the GPUs of one process loads and stores peers' buffers directly, which cudaMalloc
/// memory allows once peer access is on, but default-pool memory only where its pool grants it;
/// without this (or NCCL_P2P_DIRECT_DISABLE=1) such buffers fault. Every later cudaMallocAsync
/// on `device` is then peer-mapped. Once per device and process; later calls do nothing.
inline void share_default_pool(int device) {
  static std::mutex m;
  static std::vector<char> shared;
  const std::lock_guard lock(m);
  const auto d = static_cast<std::size_t>(device);
  if (d < shared.size() && shared[d] != 0) return;
  cudaMemPool_t pool{};
  WEFT_CUDA_TRY(cudaDeviceGetDefaultMemPool(&pool, device));
  detail::grant_peer_access(pool, device);
  if (shared.size() <= d) shared.resize(d + 1, 0);
  shared[d] = 1;
}

/// weft's stream-ordered memory pool on `device`, made at its first use (once per device and
/// process; CUDA frees it with the context): stream_buffer and the communicators' scratch come
/// from it, never from the application's default pool, whose settings weft leaves alone. Every
/// device with peer access to `device` may read and write it (NCCL between the GPUs of one
/// process, nccl::init_all, stores straight into a peer's buffers, and memory from a pool is
/// reachable from other devices only where the pool grants them access), and it keeps freed
/// memory up to pool_release_threshold() for reuse.
inline cudaMemPool_t memory_pool(int device) {
  detail::pool_registry& r = detail::pools();
  const std::lock_guard lock(r.m);
  const auto d = static_cast<std::size_t>(device);
  if (d < r.pools.size() && r.pools[d] != nullptr) return r.pools[d];
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool{};
  WEFT_CUDA_TRY(cudaMemPoolCreate(&pool, &props));
  try {
    std::uint64_t keep = r.release_threshold;
    WEFT_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    detail::grant_peer_access(pool, device);
    if (r.pools.size() <= d) r.pools.resize(d + 1, nullptr);
  } catch (...) {
    (void)cudaMemPoolDestroy(pool);
    throw;
  }
  r.pools[d] = pool;
  return pool;
}

/// The release threshold of weft's pools (default_pool_release_threshold unless set).
inline std::uint64_t pool_release_threshold() {
  detail::pool_registry& r = detail::pools();
  const std::lock_guard lock(r.m);
  return r.release_threshold;
}

/// Sets how many bytes of freed memory each of weft's pools keeps rather than return to the
/// system at the next synchronization (cudaMemPoolAttrReleaseThreshold), on the pools made so
/// far and on those made later. 0 gives freed memory back at every synchronization (and maps
/// it again at the next allocation); default_pool_release_threshold keeps everything.
inline void set_pool_release_threshold(std::uint64_t bytes) {
  detail::pool_registry& r = detail::pools();
  const std::lock_guard lock(r.m);
  for (cudaMemPool_t pool : r.pools) {
    if (pool == nullptr) continue;
    std::uint64_t keep = bytes;
    WEFT_CUDA_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  r.release_threshold = bytes;
}

/// Gives the memory that weft's pools hold unused back to the system, down to keep_bytes per
/// pool (cudaMemPoolTrimTo). Call it where the transient peak is over (after a training loop,
/// between phases of a program), once the streams that freed weft's memory are synchronized:
/// memory freed on a stream whose work has not finished is not unused yet and stays. The
/// communicators' scratch is in use while they live. Does nothing where weft made no pool.
inline void trim_pools(std::size_t keep_bytes = 0) {
  detail::pool_registry& r = detail::pools();
  const std::lock_guard lock(r.m);
  for (cudaMemPool_t pool : r.pools) {
    if (pool != nullptr) WEFT_CUDA_TRY(cudaMemPoolTrimTo(pool, keep_bytes));
  }
}

namespace detail {

/// `bytes` from weft's pool on the device of stream `s` (memory_pool), in the order of s: what
/// every stream-ordered allocation of weft calls.
inline cudaError_t allocate_async(void** p, std::size_t bytes, cudaStream_t s) {
  return cudaMallocFromPoolAsync(p, bytes, memory_pool(stream_device(s)), s);
}

} // namespace detail

/// n elements of T in stream-ordered device memory (cudaMallocFromPoolAsync / cudaFreeAsync),
/// uninitialised: allocated after the work queued on a stream so far, freed after the work
/// queued on a stream when it goes. Unlike cudaMalloc and cudaFree, neither waits for the
/// device: a thread may allocate and free while another stream's kernel waits for it (ranks
/// sharing a device, p2p's flag syncs), where cudaFree would wait for that kernel for ever.
/// The memory comes from weft's pool on the stream's device (memory_pool), which the devices
/// that can reach that device may access too. The stream must outlive the buffer.
template <class T>
class stream_buffer {
public:
  stream_buffer() = default;
  stream_buffer(std::size_t n, cudaStream_t s) { allocate(n, s); }
  stream_buffer(stream_buffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)),
        n_(std::exchange(o.n_, 0)),
        s_(std::exchange(o.s_, nullptr)) {}
  stream_buffer& operator=(stream_buffer&& o) noexcept {
    if (this != &o) {
      drop();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  stream_buffer(const stream_buffer&) = delete;
  stream_buffer& operator=(const stream_buffer&) = delete;
  ~stream_buffer() { drop(); }

  [[nodiscard]] T* data() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return n_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }

  /// n elements, queued on s (the old block is freed on s first). The destructor frees the
  /// block on s too.
  void allocate(std::size_t n, cudaStream_t s) {
    release(s);
    if (n == 0) return;
    WEFT_CUDA_TRY(detail::allocate_async(reinterpret_cast<void**>(&p_), n * sizeof(T), s));
    n_ = n;
    s_ = s;
  }
  /// Frees the block after the work queued on s so far.
  void release(cudaStream_t s) {
    if (p_ != nullptr) WEFT_CUDA_TRY(cudaFreeAsync(p_, s));
    p_ = nullptr;
    n_ = 0;
  }

private:
  void drop() noexcept {
    if (p_ != nullptr) (void)cudaFreeAsync(p_, s_); // a destructor's failure has nowhere to go
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
  cudaStream_t s_ = nullptr;
};

/// A stream, owned (created non-blocking, destroyed with the handle) or borrowed.
class stream {
public:
  /// A new non-blocking stream on the current device.
  stream() { WEFT_CUDA_TRY(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  /// The caller's stream; never destroyed here.
  static stream borrow(cudaStream_t s) noexcept { return stream(s, false); }

  stream(stream&& o) noexcept
      : s_(std::exchange(o.s_, nullptr)), owned_(std::exchange(o.owned_, false)) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      release();
      s_ = std::exchange(o.s_, nullptr);
      owned_ = std::exchange(o.owned_, false);
    }
    return *this;
  }
  ~stream() { release(); }

  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  [[nodiscard]] bool owned() const noexcept { return owned_; }
  void synchronize() const { WEFT_CUDA_TRY(cudaStreamSynchronize(s_)); }

private:
  stream(cudaStream_t s, bool owned) noexcept : s_(s), owned_(owned) {}
  void release() noexcept {
    if (owned_ && s_ != nullptr) (void)cudaStreamDestroy(s_);
    s_ = nullptr;
    owned_ = false;
  }
  cudaStream_t s_ = nullptr;
  bool owned_ = false;
};

/// An event, owned. Without timing by default (cheaper to record and wait on); with
/// `timing`, two of them measure the time between their records (elapsed_ms).
class event {
public:
  explicit event(bool timing = false) {
    WEFT_CUDA_TRY(
        cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      if (e_ != nullptr) (void)cudaEventDestroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  ~event() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) const { WEFT_CUDA_TRY(cudaEventRecord(e_, s)); }
  /// Milliseconds from `start`'s record to this one's, once this one has completed (both
  /// made with timing).
  [[nodiscard]] float elapsed_ms(const event& start) const {
    WEFT_CUDA_TRY(cudaEventSynchronize(e_));
    float ms = 0;
    WEFT_CUDA_TRY(cudaEventElapsedTime(&ms, start.e_, e_));
    return ms;
  }

private:
  cudaEvent_t e_ = nullptr;
};

} // namespace weft::cuda
