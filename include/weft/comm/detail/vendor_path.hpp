#pragma once
// The path of algo::vendor: the call goes to the communicator's own collective library.
#include <weft/comm/algorithm/vendor.hpp>
#include <weft/comm/detail/argument_checks.hpp>
#include <weft/comm/detail/call_check.hpp>
#include <weft/comm/detail/call_check_switch.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <cstddef>

namespace weft::detail {

/// A communicator with a collective of its own for C (what algo::vendor calls): the member
/// template comm.vendor<C>(in, in_n, out, out_n, count, root, op), which also finishes avg.
template <class Comm, collective C, class T, class Op>
concept vendor_collective = requires(Comm& comm, const T* in, T* out, std::size_t n, int root,
                                     const Op& op) {
  comm.template vendor<C>(in, n, out, n, n, root, op);
};

template <collective C, class Comm, class T, class Op>
void run_vendor(Comm& comm, const T* in, std::size_t in_n, T* out, std::size_t out_n,
                std::size_t count, int root, const Op& op) {
  static_assert(vendor_collective<Comm, C, T, Op>,
                "weft: algo::vendor forwards to the transport's own collective library, and this "
                "communicator has none for this element type and operator (weft::local has "
                "none; weft::mpi has MPI's for float, double, int32 and int64 with op::sum, "
                "prod, min, max and avg, not half, bfloat16 or user functors): use "
                "algo::automatic or an explicit algorithm such as algo::ring");
  if constexpr (vendor_collective<Comm, C, T, Op>) {
    check_root(comm, root, name_of(C));
    if (check_calls_enabled(comm))
      check_same_call(comm, {C, algo::vendor::name, count, dtype_of<T>, call_op_name<Op>(), root});
    // avg included: nothing to divide here.
    comm.template vendor<C>(in, in_n, out, out_n, count, root, op);
  }
}

} // namespace weft::detail
