#pragma once
// automatic_choice: what the default algorithm (algo::automatic) takes for a call, without
// making it: weft's cheapest plan or the communicator's own collective (algo::vendor), with
// both modelled prices. The collectives ask it on every call, so what it answers is what runs.
//
//   const auto c = weft::automatic_choice<weft::collective::all_reduce, float, weft::op::avg>(
//       comm, n);
//   std::printf("%s\n", std::string(c.name()).c_str());   // "vendor", "ring", ...
//
// A communicator offers its own collective library to automatic with the member
//   std::optional<double> comm.vendor_price<C, T, Op>(const plan_request&)
// the modelled seconds of its collective C for the call (weft::cuda::nccl: NCCL's tuning
// model, comm/plan/nccl_model.hpp), or none
// where it has none for this call (an operator the library lacks). One without the member
// (weft::local) runs weft's plans only. A communicator whose plans pay a fixed cost per round
// beyond its links (an NCCL group and kernels per round on a GPU) says so with
//   double comm.plan_round_seconds()
// and automatic adds it to every plan's price, once per round. A communicator that picks by
// prices measured on its machine (weft::local on one host by default; weft::mpi on real
// nodes, opted in) says so with measures_automatic(), measures them with
// measure_prices(c, peer_access, messages) and keeps them in measured_prices_of(c)
// (measured_prices.hpp); one that also takes measure_prices(c, peer_access, messages, base)
// continues its table base at the sizes past the first ones, at the first call that needs
// them (without it, those sizes are extrapolated from the first). Where it has a vendor
// collective (a member vendor<C> for float sums, constrained to the types and operators it
// runs) and no vendor_price, that collective is measured beside weft's plans (by
// measure_prices itself where the communicator declares measure_prices_with_vendor, as
// weft::mpi does) and weighed by the measurement.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/detail/call_check.hpp>
#include <weft/comm/detail/call_check_switch.hpp>
#include <weft/comm/detail/vendor_path.hpp>
#include <weft/comm/measured_prices.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/ops.hpp>

#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>

namespace weft {

namespace detail {

/// A communicator that prices its own collective C for automatic.
template <class Comm, collective C, class T, class Op>
concept prices_vendor = requires(Comm& comm, const plan_request& q) {
  { comm.template vendor_price<C, T, Op>(q) } -> std::convertible_to<std::optional<double>>;
};

/// What comm pays per round of a plan beyond its links (comm.plan_round_seconds(); 0 where
/// it declares nothing).
template <class Comm>
double plan_round_seconds_of(const Comm& comm) {
  if constexpr (requires {
                  { comm.plan_round_seconds() } -> std::convertible_to<double>;
                }) {
    return comm.plan_round_seconds();
  } else {
    return 0;
  }
}

/// The request a call of `count` elements of T (count in plan.hpp's sense) makes on comm.
template <collective C, class T, class Comm>
plan_request request_of(Comm& comm, std::size_t count, int root) {
  return plan_request{C, comm.size(), comm.rank(), count, root, comm.node_of(), sizeof(T)};
}

/// A communicator that may pick by prices measured on its machine (measured_prices.hpp).
template <class Comm>
concept measures_prices = requires(Comm& comm, collective c) {
  { comm.measures_automatic() } -> std::convertible_to<bool>;
  { comm.measured_prices_of(c) } -> std::same_as<std::shared_ptr<const measured_prices>&>;
};

/// A communicator whose measure_prices measures its own collective too (weft::mpi's, through
/// the measurer the program opted in with, so that no other program compiles it).
template <class Comm>
concept measures_vendor_itself = requires {
  requires Comm::measure_prices_with_vendor;
};

/// A communicator whose measure_prices continues a table at the large sizes (a fourth argument;
/// measured_prices.hpp); one without it extrapolates past the first sizes.
template <class Comm>
concept continues_prices = requires(Comm& comm, collective c, const measured_prices* base) {
  comm.measure_prices(c, true, true, base);
};

/// Whether automatic measures C on Comm past the first sizes: beside its own collective (its
/// vendor, measured by automatic itself), or by a measure_prices that continues a table.
template <class Comm, collective C, class T, class Op>
inline constexpr bool continues_measurement = (!prices_vendor<Comm, C, T, Op> &&
                                               vendor_collective<Comm, C, float, op::sum> &&
                                               !measures_vendor_itself<Comm>) ||
                                              continues_prices<Comm>;

/// automatic's choice for q on comm; WithVendor false: among weft's plans only.
template <collective C, class T, class Op, bool WithVendor = true, class Comm>
algo::choice automatic_choice_for(Comm& comm, const plan_request& q) {
  constexpr bool peer = declared_peer_access<Comm>();
  constexpr bool messages = declared_messages<Comm>();
  std::optional<double> vendor;
  if constexpr (WithVendor && prices_vendor<Comm, C, T, Op>)
    vendor = comm.template vendor_price<C, T, Op>(q);
  if constexpr (measures_prices<Comm>) {
    if (comm.measures_automatic()) {
      // Its own collective, where it has one and prices it by no model, is measured too.
      constexpr bool measure_vendor =
          !prices_vendor<Comm, C, T, Op> && vendor_collective<Comm, C, float, op::sum>;
      auto& prices = comm.measured_prices_of(C);
      // The first call measures 4 KiB .. 4 MiB; the first past them continues the table at
      // the large sizes, where the communicator can (the same on every rank: so are the call's
      // size and the table).
      constexpr bool continues = continues_measurement<Comm, C, T, Op>;
      const auto measure = [&](const measured_prices* base) {
        if constexpr (measure_vendor && !measures_vendor_itself<Comm>) {
          prices = measured_prices_for<C, true>(comm, peer, messages, base);
        } else if constexpr (continues_prices<Comm>) {
          prices = base == nullptr ? comm.measure_prices(C, peer, messages)
                                   : comm.measure_prices(C, peer, messages, base);
        } else {
          prices = comm.measure_prices(C, peer, messages); // base: never asked for
        }
      };
      if (!prices) measure(nullptr);
      if constexpr (continues) {
        if (!prices->large && static_cast<double>(q.count) * static_cast<double>(q.element_size) >
                                  measured_first_bytes) {
          const std::shared_ptr<const measured_prices> base = prices;
          measure(base.get());
          if (!prices->large) { // a communicator's own measure_prices did not say so
            auto marked = std::make_shared<measured_prices>(*prices);
            marked->large = true;
            prices = std::move(marked);
          }
        }
      }
      constexpr bool vendor_competes =
          WithVendor && measure_vendor && vendor_collective<Comm, C, T, Op>;
      check_request(q, "automatic");
      // Without a modelled vendor price the pick hangs on the table and the call's count alone
      // (the collective, the type and what the communicator lends are this function's
      // parameters; the table is the group shape's): each thread keeps its last, so that a run
      // of calls of one size picks once. It holds the table, whose address so stays its own.
      struct last_pick {
        const Comm* comm = nullptr;
        std::shared_ptr<const measured_prices> table;
        std::size_t count = 0;
        algo::choice out;
      };
      [[maybe_unused]] last_pick* last = nullptr;
      if constexpr (!prices_vendor<Comm, C, T, Op>) {
        thread_local last_pick kept;
        if (kept.comm == &comm && kept.table == prices && kept.count == q.count) return kept.out;
        last = &kept;
      }
      if constexpr (vendor_competes) {
        vendor = prices->vendor_estimate(static_cast<double>(q.count) *
                                         static_cast<double>(q.element_size));
      }
      algo::choice out;
      out.plan = prices->pick(q, peer, messages, &out.plan_seconds, vendor_competes);
      out.vendor_seconds = vendor;
      out.vendor = vendor && (out.plan == nullptr || *vendor <= out.plan_seconds);
      if (!out.vendor && out.plan == nullptr) no_candidate(q, peer, messages);
      if (last != nullptr) *last = last_pick{&comm, prices, q.count, out};
      return out;
    }
  }
  return algo::choose_path(q, comm.cluster(), comm.devices(), peer, messages, vendor,
                           plan_round_seconds_of(comm));
}

/// Before automatic picks for a call of collective C (dispatch.hpp, planned_path.hpp): where
/// the pick measures (the first call on a measuring communicator, or the first past its first
/// sizes, whose measurement hangs on the call's size) and calls are checked, the call is
/// checked against the other ranks' first, so that a call of another size on some rank is
/// reported before any rank measures (a rank that does not measure meets it with its own
/// call's check, and both report).
template <collective C, class T, class Op, class Comm>
void check_before_measuring(Comm& comm, const plan_request& q) {
  if constexpr (measures_prices<Comm> && declared_messages<Comm>()) {
    if (!comm.measures_automatic() || !check_calls_enabled(comm)) return;
    const auto& prices = comm.measured_prices_of(C);
    if (prices && (prices->large || !continues_measurement<Comm, C, T, Op> ||
                   static_cast<double>(q.count) * static_cast<double>(q.element_size) <=
                       measured_first_bytes))
      return;
    check_same_call(comm,
                    {C, algo::automatic::name, q.count, dtype_of<T>, call_op_name<Op>(), q.root});
  }
}

} // namespace detail

/// What weft::<C>(comm, ...) with algo::automatic takes for a call of `count` elements of T
/// (count in plan.hpp's sense: per rank) reduced by Op, rooted at `root` where C has a root.
/// Throws weft::error as the call would: a bad root, or nothing that serves the call. On a
/// communicator that measures its prices (measures_automatic()) it is collective where the
/// call would measure: at the first of C on the communicator, and at the first past 4 MiB per
/// rank where the communicator continues its table (measured_prices.hpp); every rank must ask
/// then, as every rank would call.
template <collective C, element T, class Op = op::sum, communicator Comm>
algo::choice automatic_choice(Comm& comm, std::size_t count, int root = 0) {
  return detail::automatic_choice_for<C, T, Op>(comm, detail::request_of<C, T>(comm, count, root));
}

} // namespace weft
