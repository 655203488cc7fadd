#pragma once
// weft::checked_calls<Comm>: a communicator whose every collective is first compared across
// its ranks (operation, algorithm, count, element type, operator, root), as
// WEFT_CHECK_CALLS=1 does for the whole process, but chosen in code and for one communicator.
// A mismatch is a weft::error on every rank, before any of the call's data moves, naming
// which ranks disagree and how:
//
//   weft::local::run(4, [](weft::local::communicator& c) {
//     weft::checked_calls checked(std::move(c));
//     weft::all_reduce(checked, std::span(grad));   // "rank 2 differs from rank 0 in count: ..."
//   });
//
// The check costs one small gather and scatter through rank 0 per call: for debugging, or for
// the few calls whose arguments come from data. It owns the communicator it wraps and models
// the concepts that one does; split() gives a checked child.
#include <weft/comm/communicator.hpp>
#include <weft/comm/plan.hpp>

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

namespace weft {

template <communicator Comm>
class checked_calls {
public:
  static constexpr bool peer_access = detail::declared_peer_access<Comm>();
  static constexpr bool messages = detail::declared_messages<Comm>();
  /// Whether the wrapped communicator's measure_prices times its own collective too (weft::mpi).
  static constexpr bool measure_prices_with_vendor = requires {
    requires Comm::measure_prices_with_vendor;
  };

  explicit checked_calls(Comm comm) : comm_(std::move(comm)) {}

  /// What the dispatch asks before every collective (detail::check_calls_enabled).
  [[nodiscard]] static constexpr bool check_calls() noexcept { return true; }

  [[nodiscard]] int rank() const { return comm_.rank(); }
  [[nodiscard]] int size() const { return comm_.size(); }
  void barrier() { comm_.barrier(); }
  [[nodiscard]] checked_calls split(int color, int key) {
    return checked_calls(comm_.split(color, key));
  }
  [[nodiscard]] decltype(auto) node_of() const { return comm_.node_of(); }
  [[nodiscard]] decltype(auto) cluster() const requires requires(const Comm& c) { c.cluster(); }
  { return comm_.cluster(); }
  [[nodiscard]] decltype(auto) devices() const requires requires(const Comm& c) { c.devices(); }
  { return comm_.devices(); }

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

  template <class T, class Op>
  void execute(const plan& pl, const T* in, std::size_t in_count, T* out, std::size_t out_count,
               const Op& op, std::string_view opname) {
    comm_.execute(pl, in, in_count, out, out_count, op, opname);
  }

  template <collective C, class T, class Op>
  void vendor(const T* in, std::size_t in_n, T* out, std::size_t out_n, std::size_t count, int root,
              const Op& op) requires requires(Comm& c) {
    c.template vendor<C>(in, in_n, out, out_n, count, root, op);
  }
  { comm_.template vendor<C>(in, in_n, out, out_n, count, root, op); }

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

  [[nodiscard]] Comm& inner() noexcept { return comm_; }
  [[nodiscard]] const Comm& inner() const noexcept { return comm_; }

private:
  Comm comm_;
};

} // namespace weft
