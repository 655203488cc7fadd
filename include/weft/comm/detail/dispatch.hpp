#pragma once
// The path every collective call takes: algo::vendor hands it to the communicator's own
// collective (vendor_path.hpp); every other policy runs a plan (planned_path.hpp), except
// that algo::automatic on a communicator that prices its own collective (vendor_price, or a
// measurement: see automatic_choice.hpp) takes that collective unless a plan of weft's is
// priced lower.
#include <weft/comm/automatic_choice.hpp>
#include <weft/comm/detail/argument_checks.hpp>
#include <weft/comm/detail/planned_path.hpp>
#include <weft/comm/detail/vendor_path.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <cstddef>
#include <type_traits>

namespace weft::detail {

/// Runs collective C with algorithm Algo on comm. `in`/`out` are the rank's buffers as the
/// table in plan.hpp describes them; `count` is the per-rank count in that table's sense.
/// algo::vendor hands the call to the communicator's own collective; every other policy
/// runs a plan; automatic picks between the two where the communicator prices its own.
template <collective C, class Algo, class Comm, class T, class Op>
void run_collective(Comm& comm, const T* in, std::size_t in_n, T* out, std::size_t out_n,
                    std::size_t count, int root, const Op& op) {
  if constexpr (std::is_same_v<Algo, algo::vendor>) {
    run_vendor<C>(comm, in, in_n, out, out_n, count, root, op);
  } else if constexpr (std::is_same_v<Algo, algo::automatic> &&
                       (prices_vendor<Comm, C, std::remove_cv_t<T>, Op> ||
                        measures_prices<Comm>)&&vendor_collective<Comm, C, T, Op>) {
    check_root(comm, root, name_of(C));
    const plan_request q = request_of<C, T>(comm, count, root);
    check_before_measuring<C, std::remove_cv_t<T>, Op>(comm, q);
    const algo::choice chosen = automatic_choice_for<C, std::remove_cv_t<T>, Op>(comm, q);
    if (chosen.vendor) {
      run_vendor<C>(comm, in, in_n, out, out_n, count, root, op);
    } else {
      run_planned<C, Algo>(comm, in, in_n, out, out_n, count, root, op, chosen.plan);
    }
  } else {
    run_planned<C, Algo>(comm, in, in_n, out, out_n, count, root, op);
  }
}

} // namespace weft::detail
