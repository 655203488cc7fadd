#pragma once
// weft::cuda::async_communicator: collectives on a side stream, so that a bucket's gradient
// reduction runs while the backward goes on queuing kernels on the main stream (the device
// counterpart of weft::async_communicator's progress thread, comm/async.hpp).
//
//   weft::cuda::async_communicator ac(comm);                // collective: splits comm, side stream
//   ... backward kernels for the last layers on comm.stream() ...
//   auto w = weft::cuda::all_reduce_async(ac, std::span(d_bucket, n));   // after them, on the side
//   ... more backward on comm.stream() ...
//   w.wait(comm.stream());                                  // later work on the main stream waits
//   w.wait();                                               // or the host waits (with a deadline)
//
// A call records an event on the main stream (the parent's stream, ac.stream()), makes the
// side stream wait for it, so the collective reads the buffer as the main stream left it, and
// queues the collective on the side communicator (a split of the parent with a stream of its
// own: nccl's split_with_stream; p2p's and emulated's splits have one already). Its work
// records the event that ends it. Nothing waits on the host unless wait() is called; every
// rank must make the same calls in the same order, as with the blocking ones. The buffers must
// stay alive, and the main stream must not write them, until the work is waited for. The
// events are made on the device current at construction, which must be the communicator's.
//
// A wait() past its deadline throws, and over a transport that can abort (NCCL) it first
// aborts the side communicator with that error (abort(): its stream drained, see nccl.cuh),
// which fails its family: every later call on the side or the parent communicator throws that
// first failure at once. NCCL's asynchronous errors, polled while waiting, fail it the same way.
//
// Over NCCL two communicators then run at once on one device, which NCCL allows only while no
// rank blocks its device between queuing its parts: a call that synchronises the whole device
// (cudaFree, cudaDeviceSynchronize, a pageable cudaMemcpy) while side work is in flight can wait
// for a collective whose peer is itself blocked the same way. Use stream-ordered memory
// (cudaMallocAsync, weft::cuda::stream_buffer) in the loop that overlaps.
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/core/error.hpp>
#include <weft/cuda/detail/runtime.cuh>
#include <weft/cuda/error.cuh>
#include <weft/cuda/memory.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace weft::cuda {

namespace detail {

/// Work queued on a side stream in a main stream's order: submit(f) makes the side stream wait
/// for what the main stream holds so far, lets f queue on the side stream, and returns the
/// event that ends f's work. With side == main it only records that event.
class fork_join {
public:
  fork_join(cudaStream_t main, cudaStream_t side) : main_(main), side_(side) {}
  template <class F>
  std::shared_ptr<const event> submit(F&& f) {
    if (side_ != main_) {
      fork_.record(main_);
      WEFT_CUDA_TRY(cudaStreamWaitEvent(side_, fork_.get(), 0));
    }
    std::forward<F>(f)();
    auto done = std::make_shared<const event>();
    done->record(side_);
    return done;
  }
  [[nodiscard]] cudaStream_t main() const noexcept { return main_; }
  [[nodiscard]] cudaStream_t side() const noexcept { return side_; }

private:
  cudaStream_t main_, side_;
  event fork_;
};

} // namespace detail

/// A collective queued on a side stream. Copies share it; a default-made work is done.
class work {
public:
  /// Called by wait() on every poll with nullptr, and once with the timeout error when the
  /// deadline passes, before that error is thrown: a transport raises its asynchronous errors
  /// here, and fails itself with the timeout (async_communicator over NCCL does both).
  using watch = std::function<void(const error* timed_out)>;

  work() = default;
  work(std::shared_ptr<const event> done, std::chrono::milliseconds timeout, std::string what,
       int rank, watch w = {})
      : done_(std::move(done)),
        timeout_(timeout),
        what_(std::move(what)),
        rank_(rank),
        watch_(std::move(w)) {}

  /// Whether the device has finished it.
  [[nodiscard]] bool done() const {
    if (!done_) return true;
    const cudaError_t e = cudaEventQuery(done_->get());
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError(); // not an error: cleared, or the next launch's check would report it
      return false;
    }
    WEFT_CUDA_TRY(e);
    return true;
  }
  /// Work queued on `s` from now on runs after it. Returns at once.
  void wait(cudaStream_t s) const {
    if (done_) WEFT_CUDA_TRY(cudaStreamWaitEvent(s, done_->get(), 0));
  }
  /// Blocks the host until it is done; a weft::error naming it after the deadline.
  void wait() const {
    if (!done_) return;
    const cudaError_t e = detail::poll_until([this] { return cudaEventQuery(done_->get()); },
                                             std::chrono::steady_clock::now() + timeout_,
                                             [this] {
                                               if (watch_) watch_(nullptr);
                                             });
    if (e == cudaErrorNotReady) {
      const error late(
          what_, rank_, error::unknown,
          "not done after " + std::to_string(timeout_.count()) +
              " ms on the side stream (a peer that never made the same call, or a stalled device)");
      if (watch_) watch_(&late);
      throw late;
    }
    WEFT_CUDA_TRY(e);
  }

private:
  std::shared_ptr<const event> done_;
  std::chrono::milliseconds timeout_{0};
  std::string what_;
  int rank_ = error::unknown;
  watch watch_;
};

template <communicator Comm>
class async_communicator {
public:
  /// Collective over `parent`: splits a side communicator from it. `timeout`: work::wait()'s
  /// deadline.
  explicit async_communicator(Comm& parent,
                              std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : side_(split_side(parent)), order_(parent.stream(), side_.stream()), timeout_(timeout) {
    if (side_.stream() == parent.stream()) {
      throw error("async_communicator", parent.rank(), error::unknown,
                  "the side communicator queues on the parent's stream, so nothing would overlap");
    }
  }
  async_communicator(const async_communicator&) = delete;
  async_communicator& operator=(const async_communicator&) = delete;

  [[nodiscard]] int rank() const { return side_.rank(); }
  [[nodiscard]] int size() const { return side_.size(); }
  /// The main stream: the parent's, whose work a call starts after.
  [[nodiscard]] cudaStream_t stream() const noexcept { return order_.main(); }
  [[nodiscard]] cudaStream_t side_stream() const { return side_.stream(); }
  [[nodiscard]] Comm& side() noexcept { return side_; }

  /// Queues f(side) on the side stream after the main stream's work so far. Wait for the
  /// work before this async_communicator goes (its wait() consults the side communicator).
  template <class F>
  work submit(std::string what, F&& f) {
    auto done = order_.submit([&] { std::forward<F>(f)(side_); });
    work::watch w;
    if constexpr (requires {
                    side_.check_async_error(what);
                    side_.abort(what);
                  }) {
      w = [side = &side_, op = what](const error* timed_out) {
        // A peer may never come: the family fails with the timeout, which later calls throw.
        if (timed_out != nullptr)
          side->abort(timed_out->what());
        else
          side->check_async_error(op);
      };
    }
    return work(std::move(done), timeout_, std::move(what), side_.rank(), std::move(w));
  }

private:
  static Comm split_side(Comm& parent) {
    if constexpr (requires { parent.split_with_stream(0, 0); }) {
      return parent.split_with_stream(0, parent.rank());
    } else {
      return parent.split(0, parent.rank());
    }
  }

  Comm side_;
  detail::fork_join order_;
  std::chrono::milliseconds timeout_;
};

template <class Algo = algo::automatic, class Comm, element T, class Op = op::sum>
requires reduction_for<Op, T>
[[nodiscard]] work all_reduce_async(async_communicator<Comm>& c, std::span<T> inout, Op op = {}) {
  return c.submit("all_reduce_async", [&](Comm& comm) { weft::all_reduce<Algo>(comm, inout, op); });
}

template <class Algo = algo::automatic, class Comm, class In, element T, class Op = op::sum>
requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
[[nodiscard]] work reduce_scatter_async(async_communicator<Comm>& c, std::span<In> in,
                                        std::span<T> out, Op op = {}) {
  return c.submit("reduce_scatter_async",
                  [&](Comm& comm) { weft::reduce_scatter<Algo>(comm, in, out, op); });
}

template <class Algo = algo::automatic, class Comm, class In, element T>
requires std::same_as<std::remove_const_t<In>, T>
[[nodiscard]] work all_gather_async(async_communicator<Comm>& c, std::span<In> in,
                                    std::span<T> out) {
  return c.submit("all_gather_async", [&](Comm& comm) { weft::all_gather<Algo>(comm, in, out); });
}

} // namespace weft::cuda
