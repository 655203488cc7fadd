#pragma once
// What the CUDA transports (nccl, p2p, emulated) do alike with the runtime: a failed call as a
// weft::error naming the collective, the rank and the peer; whether a stream is being captured
// into a graph; a device made current for a scope; and waiting for a stream or an event with a
// deadline, polling, never in an unbounded cudaStreamSynchronize.
#include <weft/core/error.hpp>
#include <weft/cuda/error.cuh>

#include <cuda_runtime.h>

#include <chrono>
#include <string>
#include <string_view>
#include <thread>

namespace weft::cuda::detail {

[[noreturn]] WEFT_COLD inline void cuda_fail(cudaError_t e, std::string_view call,
                                             std::string_view operation, int rank,
                                             int peer = error::unknown) {
  throw error(operation, rank, peer, std::string(call) + " failed: " + cuda_error_text(e));
}

inline void cuda_check(cudaError_t e, std::string_view call, std::string_view operation, int rank,
                       int peer = error::unknown) {
  if (e != cudaSuccess) cuda_fail(e, call, operation, rank, peer);
}

inline bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  WEFT_CUDA_TRY(cudaStreamIsCapturing(s, &status));
  return status != cudaStreamCaptureStatusNone;
}

/// The device a stream's work runs on (the current one for the legacy default stream).
inline int stream_device(cudaStream_t s) {
  int device = 0;
  WEFT_CUDA_TRY(cudaStreamGetDevice(s, &device));
  return device;
}

/// Makes `device` current for its lifetime, then restores the previous one.
class device_scope {
public:
  explicit device_scope(int device) {
    WEFT_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ == device) {
      previous_ = -1;
    } else {
      WEFT_CUDA_TRY(cudaSetDevice(device));
    }
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }

private:
  int previous_ = -1;
};

/// Asks `query()` (a cudaStreamQuery or cudaEventQuery) until it answers other than
/// cudaErrorNotReady or `deadline` passes, and returns the last answer: cudaSuccess when the work
/// is done, cudaErrorNotReady when the deadline came first, else the error. After every "not
/// ready" it clears the runtime's last error (a query records it; it is none) and calls
/// `on_poll()`, where a transport raises its asynchronous errors. It spins for the first polls (a
/// hand-off in flight), yields for the first 10 ms, then sleeps 100 us between polls, so that
/// waiting ranks stop competing with their peers for the cores.
template <class Query, class OnPoll>
cudaError_t poll_until(const Query& query, std::chrono::steady_clock::time_point deadline,
                       const OnPoll& on_poll) {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    const cudaError_t e = query();
    if (e != cudaErrorNotReady) return e;
    (void)cudaGetLastError();
    on_poll();
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return cudaErrorNotReady;
    if (polls < 64) continue;
    if (now - start < std::chrono::milliseconds(10)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

/// poll_until for a stream's queued work, with nothing to do between polls.
inline cudaError_t poll_stream(cudaStream_t s, std::chrono::steady_clock::time_point deadline) {
  return poll_until([s] { return cudaStreamQuery(s); }, deadline, [] {});
}

} // namespace weft::cuda::detail
