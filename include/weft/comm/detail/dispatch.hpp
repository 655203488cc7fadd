#pragma once
// The path every collective call takes: algo::vendor hands it to the communicator's own
// collective (vendor_path.hpp); every other policy runs a plan (planned_path.hpp).
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
/// runs a plan.
template <collective C, class Algo, class Comm, class T, class Op>
void run_collective(Comm& comm, const T* in, std::size_t in_n, T* out, std::size_t out_n,
                    std::size_t count, int root, const Op& op) {
  if constexpr (std::is_same_v<Algo, algo::vendor>) {
    run_vendor<C>(comm, in, in_n, out, out_n, count, root, op);
  } else {
    run_planned<C, Algo>(comm, in, in_n, out, out_n, count, root, op);
  }
}

} // namespace weft::detail
