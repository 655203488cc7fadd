#pragma once
// weft::traced<Comm>: a communicator that records every collective that reaches it (kind, element
// count per rank, element type, and the name of its axis), then runs it on the communicator it
// wraps. For tests that assert a layer's communication ("2 all-reduces in the forward") and for
// statistics.
//
//   weft::local::run(2, [](weft::local::communicator& c) {
//     weft::traced tp(std::move(c), "tp");
//     weft::all_reduce(tp, std::span(grad));
//     assert(tp.ops().size() == 1 && tp.ops()[0].kind == weft::collective::all_reduce);
//   });
//
// It owns the communicator it wraps and models every concept that one does (plan_executor,
// peer_access), so any algorithm runs through it unchanged, by the same path
// (detail/forwarding_communicator.hpp: a call the wrapped communicator runs whole, execute_whole,
// is recorded as one). Records are per rank (each rank has its own traced object); split() gives
// a child traced under the same axis name with its own records. Point-to-point send/recv and
// barrier pass through unrecorded there.
//
// Timings: every call (collectives, send, recv, barrier) also leaves a traced_span (what, axis,
// bytes handed to it, begin and end, the calling thread) in a log that a traced communicator
// shares with every communicator split from it, so the spans of one rank's whole tree, its
// axes and the optimizer's progress thread, are in one place (spans(); thread-safe). Name a
// child's axis with set_axis. Message bytes are what the call's API takes per rank (the
// buffer of an all-reduce, the output of an all-gather), not the bytes on the wire.
#include <weft/comm/communicator.hpp>
#include <weft/comm/detail/forwarding_communicator.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/types.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace weft {

struct traced_op {
  collective kind = collective::all_reduce;
  std::size_t count = 0; // elements per rank, as the call's API sees it (plan.hpp's table)
  dtype type = dtype::float32;
  std::string axis;
  friend bool operator==(const traced_op&, const traced_op&) = default;
};

/// One call on a traced communicator, timed.
struct traced_span {
  std::string_view what; // "all_reduce", "send", "barrier", ... (static strings)
  std::string axis;
  std::size_t bytes = 0;
  std::chrono::steady_clock::time_point begin, end;
  std::thread::id thread;
  [[nodiscard]] double seconds() const noexcept {
    return std::chrono::duration<double>(end - begin).count();
  }
};

namespace detail {

// The spans of a traced communicator and everything split from it.
class span_log {
public:
  void add(traced_span s) {
    const std::lock_guard lock(mutex_);
    spans_.push_back(std::move(s));
  }
  [[nodiscard]] std::vector<traced_span> copy() const {
    const std::lock_guard lock(mutex_);
    return spans_;
  }
  void clear() {
    const std::lock_guard lock(mutex_);
    spans_.clear();
  }

private:
  mutable std::mutex mutex_;
  std::vector<traced_span> spans_;
};

} // namespace detail

template <communicator Comm>
class traced : public detail::forwarding_communicator<traced<Comm>, Comm> {
  using base = detail::forwarding_communicator<traced<Comm>, Comm>;
  friend base;

public:
  explicit traced(Comm comm, std::string axis = {})
      : base(std::move(comm)), axis_(std::move(axis)), log_(std::make_shared<detail::span_log>()) {}

  /// A child under the same axis name, with its own records and this one's span log.
  [[nodiscard]] traced split(int color, int key) {
    return traced(this->inner().split(color, key), axis_, log_);
  }

  /// The records, in call order, and how many of one kind.
  [[nodiscard]] const std::vector<traced_op>& ops() const noexcept { return ops_; }
  [[nodiscard]] std::size_t count(collective kind) const noexcept {
    std::size_t n = 0;
    for (const auto& o : ops_)
      n += o.kind == kind ? 1 : 0;
    return n;
  }
  void clear() noexcept { ops_.clear(); }

  /// The timed calls of this communicator and of every one split from it (or it from), in the
  /// order they ended; clear_spans() empties the shared log.
  [[nodiscard]] std::vector<traced_span> spans() const { return log_->copy(); }
  void clear_spans() { log_->clear(); }

  [[nodiscard]] const std::string& axis() const noexcept { return axis_; }
  void set_axis(std::string axis) { axis_ = std::move(axis); }

private:
  traced(Comm comm, std::string axis, std::shared_ptr<detail::span_log> log)
      : base(std::move(comm)), axis_(std::move(axis)), log_(std::move(log)) {}

  // Every call the base passes on, once it has ended (thrown included): a collective in ops_,
  // every call in the span log. An execute_whole that declines leaves neither: the execute that
  // its caller runs instead records the call.
  template <class Run>
  bool around(const detail::forwarded_call& call, Run&& run) {
    const auto begin = std::chrono::steady_clock::now();
    bool ran = true;
    try {
      ran = std::forward<Run>(run)();
    } catch (...) {
      record(call, begin);
      throw;
    }
    if (ran) record(call, begin);
    return ran;
  }

  void record(const detail::forwarded_call& call, std::chrono::steady_clock::time_point begin) {
    if (call.kind) ops_.push_back({*call.kind, call.count, call.type, axis_});
    log_->add({call.what, axis_, call.bytes, begin, std::chrono::steady_clock::now(),
               std::this_thread::get_id()});
  }

  std::string axis_;
  std::vector<traced_op> ops_;
  std::shared_ptr<detail::span_log> log_;
};

} // namespace weft
