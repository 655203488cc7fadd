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
// peer_access), so any algorithm runs through it unchanged. Records are per rank (each rank has
// its own traced object); split() gives a child traced under the same axis name with its own
// records. Point-to-point send/recv and barrier pass through unrecorded there.
//
// Timings: every call (collectives, send, recv, barrier) also leaves a traced_span (what, axis,
// bytes handed to it, begin and end, the calling thread) in a log that a traced communicator
// shares with every communicator split from it, so the spans of one rank's whole tree, its
// axes and the optimizer's progress thread, are in one place (spans(); thread-safe). Name a
// child's axis with set_axis. Message bytes are what the call's API takes per rank (the
// buffer of an all-reduce, the output of an all-gather), not the bytes on the wire.
#include <weft/comm/communicator.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
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
class traced {
public:
  static constexpr bool peer_access = detail::declared_peer_access<Comm>();
  static constexpr bool messages = detail::declared_messages<Comm>();
  /// Whether the wrapped communicator's measure_prices times its own collective too (weft::mpi).
  static constexpr bool measure_prices_with_vendor = requires {
    requires Comm::measure_prices_with_vendor;
  };

  explicit traced(Comm comm, std::string axis = {})
      : comm_(std::move(comm)),
        axis_(std::move(axis)),
        log_(std::make_shared<detail::span_log>()) {}

  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int size() const { return comm_.size(); }
  void barrier() {
    const timer t(*this, "barrier", 0);
    comm_.barrier();
  }
  /// A child under the same axis name, with its own records and this one's span log.
  [[nodiscard]] traced split(int color, int key) {
    return traced(comm_.split(color, key), axis_, log_);
  }
  [[nodiscard]] decltype(auto) node_of() const { return comm_.node_of(); }
  [[nodiscard]] decltype(auto) cluster() const requires requires(const Comm& c) { c.cluster(); }
  { return comm_.cluster(); }
  [[nodiscard]] decltype(auto) devices() const requires requires(const Comm& c) { c.devices(); }
  { return comm_.devices(); }
  /// The call check the wrapped communicator asks for (detail::check_calls_enabled), kept.
  [[nodiscard]] bool check_calls() const requires requires(const Comm& c) { c.check_calls(); }
  { return static_cast<bool>(comm_.check_calls()); }
  /// A device communicator's stream (what a device layer checks its GEMM policy against).
  [[nodiscard]] decltype(auto) stream() const requires requires(const Comm& c) { c.stream(); }
  { return comm_.stream(); }

  template <class T>
  void send(std::span<T> data, int peer, int tag = 0) {
    const timer t(*this, "send", data.size_bytes());
    comm_.send(data, peer, tag);
  }
  template <class T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    const timer t(*this, "recv", data.size_bytes());
    comm_.recv(data, peer, tag);
  }
  /// A buffered send (weft::mpi's post()), where the wrapped communicator has one: the pipeline
  /// executor posts its sends so that neighbours that both send first do not deadlock.
  template <class T>
  void post(std::span<const T> data, int peer, int tag = 0) requires requires(Comm& c) {
    c.post(data, peer, tag);
  }
  {
    const timer t(*this, "send", data.size_bytes());
    comm_.post(data, peer, tag);
  }
  template <class T>
  void post(std::span<T> data, int peer, int tag = 0) requires
      requires(Comm& c, std::span<const T> d) {
    c.post(d, peer, tag);
  }
  { post(std::span<const T>(data), peer, tag); }
  void flush() requires requires(Comm& c) { c.flush(); }
  { comm_.flush(); }
  template <class T>
  void sendrecv(std::span<const T> out, int to, std::span<T> in, int from, int tag = 0) {
    const timer t(*this, "sendrecv", out.size_bytes() + in.size_bytes());
    comm_.sendrecv(out, to, in, from, tag);
  }

  /// Every planned collective reaches its communicator here (detail::run_planned).
  template <class T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
               const Op& op, std::string_view opname) {
    ops_.push_back({pl.coll(), pl.count(), dtype_of<T>, axis_});
    const timer t(*this, name_of(pl.coll()), std::max(in_count, out_count) * sizeof(T));
    comm_.execute(pl, in, in_count, out, out_count, op, opname);
  }

  /// algo::vendor: the wrapped communicator's own collective, where it has one.
  template <collective C, class T, class Op>
  void vendor(const T* in, std::size_t in_n, T* out, std::size_t out_n, std::size_t count, int root,
              const Op& op) requires requires(Comm& c) {
    c.template vendor<C>(in, in_n, out, out_n, count, root, op);
  }
  {
    ops_.push_back({C, count, dtype_of<T>, axis_});
    const timer t(*this, name_of(C), std::max(in_n, out_n) * sizeof(T));
    comm_.template vendor<C>(in, in_n, out, out_n, count, root, op);
  }

  /// The wrapped communicator's fixed cost per plan round, where it declares one.
  [[nodiscard]] double plan_round_seconds() const requires requires(const Comm& c) {
    c.plan_round_seconds();
  }
  { return comm_.plan_round_seconds(); }

  /// automatic's measured prices (comm/measured_prices.hpp), where the wrapped communicator
  /// picks by them: the wrapper takes the same pick, measured on the wrapped communicator.
  [[nodiscard]] bool measures_automatic() const requires requires(const Comm& c) {
    c.measures_automatic();
  }
  { return comm_.measures_automatic(); }
  [[nodiscard]] decltype(auto) measured_prices_of(collective c) requires requires(Comm& w) {
    w.measured_prices_of(c);
  }
  { return comm_.measured_prices_of(c); }
  [[nodiscard]] decltype(auto) measure_prices(collective c, bool peer_access,
                                              bool messages) requires requires(Comm& w) {
    w.measure_prices(c, peer_access, messages);
  }
  { return comm_.measure_prices(c, peer_access, messages); }

  /// What automatic reads to weigh the wrapped communicator's own collective, where it has one.
  template <collective C, class T, class Op>
  std::optional<double> vendor_price(const plan_request& q) requires requires(Comm& c) {
    c.template vendor_price<C, T, Op>(q);
  }
  { return comm_.template vendor_price<C, T, Op>(q); }

  template <class T>
  void divide(T* out, std::size_t n) requires requires(Comm& c) {
    c.divide(out, n);
  }
  { comm_.divide(out, n); }
  template <class T>
  auto scaled_by_ranks(const T* in, std::size_t n, std::string_view operation) requires
      requires(Comm& c) {
    c.scaled_by_ranks(in, n, operation);
  }
  { return comm_.scaled_by_ranks(in, n, operation); }

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
  [[nodiscard]] Comm& inner() noexcept { return comm_; }
  [[nodiscard]] const Comm& inner() const noexcept { return comm_; }

private:
  traced(Comm comm, std::string axis, std::shared_ptr<detail::span_log> log)
      : comm_(std::move(comm)), axis_(std::move(axis)), log_(std::move(log)) {}

  class timer {
  public:
    timer(traced& c, std::string_view what, std::size_t bytes)
        : c_(c), what_(what), bytes_(bytes), begin_(std::chrono::steady_clock::now()) {}
    timer(const timer&) = delete;
    timer& operator=(const timer&) = delete;
    ~timer() {
      c_.log_->add({what_, c_.axis_, bytes_, begin_, std::chrono::steady_clock::now(),
                    std::this_thread::get_id()});
    }

  private:
    traced& c_;
    std::string_view what_;
    std::size_t bytes_;
    std::chrono::steady_clock::time_point begin_;
  };

  Comm comm_;
  std::string axis_;
  std::vector<traced_op> ops_;
  std::shared_ptr<detail::span_log> log_;
};

} // namespace weft
