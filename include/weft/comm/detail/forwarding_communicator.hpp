#pragma once
// detail::forwarding_communicator<Derived, Comm>: the members a communicator wrapper
// (weft::traced, weft::checked_calls) passes to the communicator it owns. Each member that not
// every communicator has exists only where Comm has it (a requires-clause on Comm), so the
// wrapper models the concepts Comm models, and the dispatch's detection (execute_whole,
// vendor<C>, divide, ...) finds on the wrapper what it finds on Comm, no more: a wrapped
// communicator takes the path the bare one takes.
//
// Every call that moves data or waits (barrier, send, recv, post, sendrecv, execute,
// execute_whole, vendor) goes through Derived::around(call, run): `call` says what it is and
// `run()` makes it on Comm and returns whether it ran, false only where execute_whole declines
// a plan (having queued nothing; the caller then runs it by execute). The default around()
// runs it; traced records and times there. Derived writes split() itself (its child is a
// Derived) and hides what it answers differently (checked_calls' check_calls()).
#include <weft/comm/communicator.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

namespace weft::detail {

/// A call a forwarding wrapper passes on, as Derived::around sees it.
struct forwarded_call {
  std::string_view what;          // "barrier", "send", "recv", "sendrecv", or the collective's name
  std::size_t bytes = 0;          // what the call's API takes per rank, not the bytes on the wire
  std::optional<collective> kind; // a collective's (execute, execute_whole, vendor), with:
  std::size_t count = 0;          // its elements per rank, as the call's API sees it
  dtype type = dtype::float32;
};

/// Comm's bound on the messages a peer may hold unreceived (weft::local's channels: the
/// pipeline executor refuses a schedule that would overfill them), where Comm declares one.
template <class Comm>
struct forwarded_message_bound {};
template <class Comm>
requires requires { Comm::queued_messages_per_peer; }
struct forwarded_message_bound<Comm> {
  static constexpr std::size_t queued_messages_per_peer = Comm::queued_messages_per_peer;
};

template <class Derived, communicator Comm>
class forwarding_communicator : public forwarded_message_bound<Comm> {
public:
  static constexpr bool peer_access = declared_peer_access<Comm>();
  static constexpr bool messages = declared_messages<Comm>();
  /// Whether the wrapped communicator's measure_prices times its own collective too (weft::mpi).
  static constexpr bool measure_prices_with_vendor = requires {
    requires Comm::measure_prices_with_vendor;
  };

  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int size() const { return comm_.size(); }
  void barrier() {
    pass(message_call("barrier", 0), [&] {
      comm_.barrier();
      return true;
    });
  }
  [[nodiscard]] decltype(auto) node_of() const { return comm_.node_of(); }
  [[nodiscard]] decltype(auto) cluster() const requires requires(const Comm& c) { c.cluster(); }
  { return comm_.cluster(); }
  [[nodiscard]] decltype(auto) devices() const requires requires(const Comm& c) { c.devices(); }
  { return comm_.devices(); }
  /// The call check the wrapped communicator asks for (detail::check_calls_enabled).
  [[nodiscard]] bool check_calls() const requires requires(const Comm& c) { c.check_calls(); }
  { return static_cast<bool>(comm_.check_calls()); }
  /// A device communicator's stream (what a device layer checks its GEMM policy against).
  [[nodiscard]] decltype(auto) stream() const requires requires(const Comm& c) { c.stream(); }
  { return comm_.stream(); }

  template <class T>
  void send(std::span<T> data, int peer, int tag = 0) requires requires(Comm& c) {
    c.send(data, peer, tag);
  }
  {
    pass(message_call("send", data.size_bytes()), [&] {
      comm_.send(data, peer, tag);
      return true;
    });
  }
  template <class T>
  void recv(std::span<T> data, int peer, int tag = 0) requires requires(Comm& c) {
    c.recv(data, peer, tag);
  }
  {
    pass(message_call("recv", data.size_bytes()), [&] {
      comm_.recv(data, peer, tag);
      return true;
    });
  }
  /// A buffered send (weft::mpi's post()), where the wrapped communicator has one: the pipeline
  /// executor posts its sends so that neighbours that both send first do not deadlock.
  template <class T>
  void post(std::span<const T> data, int peer, int tag = 0) requires requires(Comm& c) {
    c.post(data, peer, tag);
  }
  {
    pass(message_call("send", data.size_bytes()), [&] {
      comm_.post(data, peer, tag);
      return true;
    });
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
  void sendrecv(std::span<const T> out, int to, std::span<T> in, int from, int tag = 0) requires
      requires(Comm& c) {
    c.sendrecv(out, to, in, from, tag);
  }
  {
    pass(message_call("sendrecv", out.size_bytes() + in.size_bytes()), [&] {
      comm_.sendrecv(out, to, in, from, tag);
      return true;
    });
  }

  /// Every planned collective reaches its communicator here (detail::run_planned).
  template <class T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
               const Op& op, std::string_view opname) requires requires(Comm& c) {
    c.execute(pl, in, in_count, out, out_count, op, opname);
  }
  {
    pass(collective_call<T>(pl.coll(), pl.count(), std::max(in_count, out_count)), [&] {
      comm_.execute(pl, in, in_count, out, out_count, op, opname);
      return true;
    });
  }
  /// The whole call, where the wrapped communicator runs some plans whole (weft::cuda::p2p's
  /// fused all-reduce): true where it ran it, false where it declined, having queued nothing.
  template <class T, class Op>
  bool execute_whole(const plan& pl, const T* in, std::size_t in_count, T* out,
                     std::size_t out_count, const Op& op, std::string_view opname) requires
      requires(Comm& c) {
    { c.execute_whole(pl, in, in_count, out, out_count, op, opname) } -> std::convertible_to<bool>;
  }
  {
    return pass(collective_call<T>(pl.coll(), pl.count(), std::max(in_count, out_count)), [&] {
      return static_cast<bool>(comm_.execute_whole(pl, in, in_count, out, out_count, op, opname));
    });
  }

  /// algo::vendor: the wrapped communicator's own collective, where it has one.
  template <collective C, class T, class Op>
  void vendor(const T* in, std::size_t in_n, T* out, std::size_t out_n, std::size_t count, int root,
              const Op& op) requires requires(Comm& c) {
    c.template vendor<C>(in, in_n, out, out_n, count, root, op);
  }
  {
    pass(collective_call<T>(C, count, std::max(in_n, out_n)), [&] {
      comm_.template vendor<C>(in, in_n, out, out_n, count, root, op);
      return true;
    });
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
  template <class Table>
  [[nodiscard]] decltype(auto) measure_prices(collective c, bool peer_access, bool messages,
                                              const Table* base) requires requires(Comm& w) {
    w.measure_prices(c, peer_access, messages, base);
  }
  { return comm_.measure_prices(c, peer_access, messages, base); }

  /// What automatic reads to weigh the wrapped communicator's own collective, where it has one.
  template <collective C, class T, class Op>
  std::optional<double> vendor_price(const plan_request& q) requires requires(Comm& c) {
    c.template vendor_price<C, T, Op>(q);
  }
  { return comm_.template vendor_price<C, T, Op>(q); }

  /// avg's steps on buffers the host cannot touch, where the wrapped communicator has them.
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

  [[nodiscard]] Comm& inner() noexcept { return comm_; }
  [[nodiscard]] const Comm& inner() const noexcept { return comm_; }

protected:
  explicit forwarding_communicator(Comm comm) : comm_(std::move(comm)) {}

  /// Runs the call; a Derived that observes calls declares its own around().
  template <class Run>
  bool around(const forwarded_call& /*call*/, Run&& run) {
    return std::forward<Run>(run)();
  }

private:
  template <class Run>
  bool pass(const forwarded_call& call, Run&& run) {
    return static_cast<Derived&>(*this).around(call, std::forward<Run>(run));
  }

  static forwarded_call message_call(std::string_view what, std::size_t bytes) {
    return {what, bytes, std::nullopt, 0, dtype::float32};
  }
  template <class T>
  static forwarded_call collective_call(collective c, std::size_t count, std::size_t elements) {
    return {name_of(c), elements * sizeof(T), c, count, dtype_of<T>};
  }

  Comm comm_;
};

} // namespace weft::detail
