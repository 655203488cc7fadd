#pragma once
// The path of every algorithm with plans: check the algorithm against the collective and the
// communicator, pick it (automatic: the cost model's choice), fetch the rank's plan from the
// cache, optionally check that all ranks make the same call, run the plan, finish avg.
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/automatic_choice.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/detail/algorithm_check.hpp>
#include <weft/comm/detail/argument_checks.hpp>
#include <weft/comm/detail/call_check.hpp>
#include <weft/comm/detail/call_check_switch.hpp>
#include <weft/comm/detail/elementwise.hpp>
#include <weft/comm/detail/kernels.hpp>
#include <weft/comm/detail/plan_cache.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <cstddef>
#include <string_view>
#include <type_traits>
#include <vector>

namespace weft::detail {

/// A copy of the n elements of `in`, each scaled by 1/ranks (scale_elements): half averages on
/// the host.
template <class T>
std::vector<std::remove_cv_t<T>> scaled_by_ranks(const T* in, std::size_t n, int ranks) {
  using U = std::remove_cv_t<T>;
  std::vector<U> scaled(n);
  const scale_elements<U> f{scaled.data(), in, average_scale<U>(ranks)};
  for (std::size_t i = 0; i < n; ++i)
    f(i);
  return scaled;
}

/// `chosen`: automatic's pick where the caller has made it already (dispatch.hpp, beside a
/// vendor collective); null: automatic picks here.
template <collective C, class Algo, class Comm, class T, class Op>
void run_planned(Comm& comm, const T* in, std::size_t in_n, T* out, std::size_t out_n,
                 std::size_t count, int root, const Op& op,
                 const algo::candidate* chosen = nullptr) {
  check_algorithm<C, Algo, Comm>();
  const std::string_view opname = name_of(C);
  check_root(comm, root, opname);
  plan_request q{C, comm.size(), comm.rank(), count, root, comm.node_of(), sizeof(T)};
  std::string_view algorithm;
  const plan* pl = nullptr;
  if constexpr (std::is_same_v<Algo, algo::automatic>) {
    if (chosen == nullptr) {
      check_before_measuring<C, std::remove_cv_t<T>, Op>(comm, q);
      chosen = automatic_choice_for<C, std::remove_cv_t<T>, Op, false>(comm, q).plan;
    }
    algorithm = chosen->name;
    pl = &plan_cache::mine().get(chosen->name, q, chosen->make_plan);
  } else {
    algorithm = Algo::name;
    pl = &plan_cache::mine().get(Algo::name, q,
                                 [](const plan_request& r) { return Algo::make_plan(r); });
  }
  if (check_calls_enabled(comm))
    check_same_call(comm, {C, algorithm, count, dtype_of<T>, call_op_name<Op>(), root});
  if constexpr (requires { comm.execute_whole(*pl, in, in_n, out, out_n, op, opname); }) {
    // A transport that runs some plans whole, avg's scaling or division included (the p2p
    // transport's fused all-reduce kernels); the others go on below.
    if (comm.execute_whole(*pl, in, in_n, out, out_n, op, opname)) return;
  }
  if constexpr (is_average_v<Op> && std::is_same_v<std::remove_cv_t<T>, half>) {
    if (C == collective::all_reduce || C == collective::reduce_scatter || C == collective::reduce) {
      // half ends at 65504: the sum of the inputs overflows where their mean need not. Each input
      // is scaled by 1/ranks first (as ncclAvg does for floating types), and the plan sums.
      // The scale is a pass of its own, not folded into the plan's first reduce as ncclAvg's
      // kernels fold it: a plan's sends and loads move the input's bytes as they are (ncclSend,
      // a peer's load), so which operand of which later step still holds unscaled input depends
      // on the peer's plan and on what the rank's own steps stored where (recursive doubling's
      // fold receives a peer's input into scratch and reduces it there with its own).
      if constexpr (requires { comm.scaled_by_ranks(in, in_n, opname); }) {
        // Buffers the host cannot touch (device memory): the transport's kernel, into memory
        // that lives until the plan's work on the communicator's stream is done.
        const auto scaled = comm.scaled_by_ranks(in, in_n, opname);
        comm.execute(*pl, static_cast<const T*>(scaled.data()), in_n, out, out_n, op, opname);
      } else {
        static_assert(
            !requires { comm.divide(out, out_n); },
            "weft: a communicator with divide() (device buffers) must offer "
            "scaled_by_ranks(in, n, operation) too, for op::avg on half");
        const auto scaled = scaled_by_ranks(in, in_n, comm.size());
        comm.execute(*pl, scaled.data(), in_n, out, out_n, op, opname);
      }
      return;
    }
  }
  comm.execute(*pl, in, in_n, out, out_n, op, opname);
  if constexpr (is_average_v<Op>) {
    if (C != collective::reduce || comm.rank() == root) {
      const std::size_t n = C == collective::reduce ? count : out_n;
      if constexpr (requires { comm.divide(out, n); }) {
        // Buffers the host cannot touch (device memory): the transport's kernel.
        comm.divide(out, n);
      } else {
        divide(out, n, comm.size());
      }
    }
  }
}

} // namespace weft::detail
