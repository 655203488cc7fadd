#pragma once
// Collectives that return at once: all_reduce_async, reduce_scatter_async, all_gather_async
// queue the call and hand back a weft::work whose wait() returns when it is done (and
// rethrows what it threw).
//
//   weft::async_communicator ac(comm);              // collective: splits a private copy of comm
//   weft::work w = weft::all_reduce_async(ac, std::span(bucket));
//   ... more backward ...
//   w.wait();
//
// One progress thread per async_communicator runs the queued collectives in the order they
// were queued, on a communicator of its own (a split of the one it was made from), so the
// calling thread may keep using the original communicator meanwhile. Every rank must queue
// the same collectives in the same order, as with the blocking calls. The buffers must stay
// alive and untouched until wait() returns. With `inline_execution` the calls run at once
// on the caller's thread (for MPI without MPI_THREAD_SERIALIZED use from a second thread,
// or to compare with the overlapped schedule).
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/core/error.hpp>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>

namespace weft {

/// The handle of a queued operation. Copies share the same operation; a default-made
/// work is already done.
class work {
public:
  work() = default;

  /// Blocks until the operation finished; rethrows its exception (on every wait()).
  void wait() const {
    if (!state_) return;
    std::unique_lock lock(state_->mutex);
    state_->cv.wait(lock, [&] { return state_->done; });
    if (state_->failure) std::rethrow_exception(state_->failure);
  }
  [[nodiscard]] bool done() const {
    if (!state_) return true;
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }

private:
  struct state {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr failure;
  };
  friend class progress_queue;
  explicit work(std::shared_ptr<state> s) : state_(std::move(s)) {}
  std::shared_ptr<state> state_;
};

/// A thread that runs queued jobs one after another, in order. A job that throws completes
/// its work with the exception, and every later job fails without running: the jobs are
/// collectives, and one that failed on this rank only (a bad buffer, so it sent nothing)
/// would let the next pair with the peers' previous call and finish with its data.
class progress_queue {
public:
  explicit progress_queue(bool inline_execution = false) : inline_(inline_execution) {
    if (!inline_) thread_ = std::thread([this] { loop(); });
  }
  progress_queue(const progress_queue&) = delete;
  progress_queue& operator=(const progress_queue&) = delete;
  ~progress_queue() {
    if (!inline_) {
      {
        std::lock_guard lock(mutex_);
        stopping_ = true;
      }
      cv_.notify_one();
      thread_.join(); // runs what is still queued first: peers may be waiting for it
    }
  }

  [[nodiscard]] bool inline_execution() const noexcept { return inline_; }

  /// Queues f (run as f()); returns its handle.
  template <class F>
  work submit(F&& f) {
    auto s = std::make_shared<work::state>();
    if (inline_) {
      run(s, f);
      return work(std::move(s));
    }
    {
      std::lock_guard lock(mutex_);
      jobs_.emplace_back(s, std::function<void()>(std::forward<F>(f)));
    }
    cv_.notify_one();
    return work(std::move(s));
  }

private:
  template <class F>
  void run(const std::shared_ptr<work::state>& s, F& f) {
    std::exception_ptr failure;
    if (failed_) {
      failure = std::make_exception_ptr(
          error("progress queue: an earlier queued job failed on this rank (" + *failed_ +
                "); this one would pair with another call of the peers, so it does not run"));
    } else {
      try {
        f();
      } catch (const std::exception& e) {
        failed_ = e.what();
        failure = std::current_exception();
      } catch (...) {
        failed_ = "an exception not derived from std::exception";
        failure = std::current_exception();
      }
    }
    {
      std::lock_guard lock(s->mutex);
      s->done = true;
      s->failure = failure;
    }
    s->cv.notify_all();
  }

  void loop() {
    for (;;) {
      std::pair<std::shared_ptr<work::state>, std::function<void()>> job;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      run(job.first, job.second);
      job.second = nullptr; // buffers the job owns are freed before the next one starts
    }
  }

  bool inline_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<work::state>, std::function<void()>>> jobs_;
  bool stopping_ = false;
  std::optional<std::string>
      failed_; // what the first failed job said; read and written by the running job's thread
  std::thread thread_;
};

/// A communicator with a progress thread. Construction is collective over `parent` (it
/// splits a private communicator from it).
template <communicator Comm>
class async_communicator {
public:
  explicit async_communicator(Comm& parent, bool inline_execution = false)
      : comm_(parent.split(0, parent.rank())),
        queue_(std::make_unique<progress_queue>(inline_execution)) {}
  async_communicator(const async_communicator&) = delete; // queued jobs hold `this`
  async_communicator& operator=(const async_communicator&) = delete;

  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int size() const { return comm_.size(); }

  /// Queues f(comm) on the progress thread. f must make the same collective calls on every rank.
  /// Once a job has failed, every later one fails without communicating (see progress_queue).
  template <class F>
  work submit(F&& f) {
    return queue_->submit([this, g = std::forward<F>(f)]() mutable { g(comm_); });
  }

private:
  Comm comm_;
  std::unique_ptr<progress_queue> queue_; // declared last: its thread stops before comm_ goes
};

template <class Algo = algo::automatic, class Comm, element T, class Op = op::sum>
requires reduction_for<Op, T>
[[nodiscard]] work all_reduce_async(async_communicator<Comm>& c, std::span<T> inout, Op op = {}) {
  return c.submit([inout, op](Comm& comm) { all_reduce<Algo>(comm, inout, op); });
}

template <class Algo = algo::automatic, class Comm, class In, element T, class Op = op::sum>
requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
[[nodiscard]] work reduce_scatter_async(async_communicator<Comm>& c, std::span<In> in,
                                        std::span<T> out, Op op = {}) {
  return c.submit([in, out, op](Comm& comm) { reduce_scatter<Algo>(comm, in, out, op); });
}

template <class Algo = algo::automatic, class Comm, class In, element T>
requires std::same_as<std::remove_const_t<In>, T>
[[nodiscard]] work all_gather_async(async_communicator<Comm>& c, std::span<In> in,
                                    std::span<T> out) {
  return c.submit([in, out](Comm& comm) { all_gather<Algo>(comm, in, out); });
}

} // namespace weft
