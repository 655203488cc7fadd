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
// records. Point-to-point send/recv and barrier pass through unrecorded.
#include <weft/comm/communicator.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/types.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft {

struct traced_op {
  collective kind = collective::all_reduce;
  std::size_t count = 0;  // elements per rank, as the call's API sees it (plan.hpp's table)
  dtype type = dtype::float32;
  std::string axis;
  friend bool operator==(const traced_op&, const traced_op&) = default;
};

namespace detail {

template <class C>
constexpr bool traced_peer_access() {
  if constexpr (requires { C::peer_access; }) {
    return static_cast<bool>(C::peer_access);
  } else {
    return false;
  }
}
template <class C>
constexpr bool traced_messages() {
  if constexpr (requires { C::messages; }) {
    return static_cast<bool>(C::messages);
  } else {
    return true;
  }
}

} // namespace detail

template <communicator Comm>
class traced {
public:
  static constexpr bool peer_access = detail::traced_peer_access<Comm>();
  static constexpr bool messages = detail::traced_messages<Comm>();

  explicit traced(Comm comm, std::string axis = {}) : comm_(std::move(comm)), axis_(std::move(axis)) {}

  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int size() const { return comm_.size(); }
  void barrier() { comm_.barrier(); }
  [[nodiscard]] traced split(int color, int key) { return traced(comm_.split(color, key), axis_); }
  [[nodiscard]] decltype(auto) node_of() const { return comm_.node_of(); }
  [[nodiscard]] decltype(auto) cluster() const
    requires requires(const Comm& c) { c.cluster(); }
  {
    return comm_.cluster();
  }
  [[nodiscard]] decltype(auto) devices() const
    requires requires(const Comm& c) { c.devices(); }
  {
    return comm_.devices();
  }

  template <class T>
  void send(std::span<T> data, int peer, int tag = 0) {
    comm_.send(data, peer, tag);
  }
  template <class T>
  void recv(std::span<T> data, int peer, int tag = 0) {
    comm_.recv(data, peer, tag);
  }
  template <class T>
  void sendrecv(std::span<const T> out, int to, std::span<T> in, int from, int tag = 0) {
    comm_.sendrecv(out, to, in, from, tag);
  }

  /// Every planned collective reaches its communicator here (detail::run_planned).
  template <class T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count, const Op& op,
               std::string_view opname) {
    ops_.push_back({pl.coll(), pl.count(), dtype_of<T>, axis_});
    comm_.execute(pl, in, in_count, out, out_count, op, opname);
  }

  /// algo::vendor: the wrapped communicator's own collective, where it has one.
  template <collective C, class T, class Op>
  void vendor(const T* in, std::size_t in_n, T* out, std::size_t out_n, std::size_t count, int root, const Op& op)
    requires requires(Comm& c) { c.template vendor<C>(in, in_n, out, out_n, count, root, op); }
  {
    ops_.push_back({C, count, dtype_of<T>, axis_});
    comm_.template vendor<C>(in, in_n, out, out_n, count, root, op);
  }

  template <class T>
  void divide(T* out, std::size_t n)
    requires requires(Comm& c) { c.divide(out, n); }
  {
    comm_.divide(out, n);
  }

  /// The records, in call order, and how many of one kind.
  [[nodiscard]] const std::vector<traced_op>& ops() const noexcept { return ops_; }
  [[nodiscard]] std::size_t count(collective kind) const noexcept {
    std::size_t n = 0;
    for (const auto& o : ops_) n += o.kind == kind ? 1 : 0;
    return n;
  }
  void clear() noexcept { ops_.clear(); }

  [[nodiscard]] const std::string& axis() const noexcept { return axis_; }
  [[nodiscard]] Comm& inner() noexcept { return comm_; }
  [[nodiscard]] const Comm& inner() const noexcept { return comm_; }

private:
  Comm comm_;
  std::string axis_;
  std::vector<traced_op> ops_;
};

} // namespace weft
