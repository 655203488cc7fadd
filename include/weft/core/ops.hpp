#pragma once
// Reduction operators. An operator is any callable a(acc, acc) -> acc on the element type's
// accumulation type (float for half and bfloat16). Like NCCL and MPI, weft assumes operators
// are commutative and associative; it fixes the order of every reduction, so all ranks get
// bitwise identical results even where rounding makes the order matter.
#include <weft/core/config.hpp>
#include <weft/core/types.hpp>

#include <concepts>
#include <string_view>
#include <type_traits>

namespace weft::detail {

// Signed integers wrap modulo 2^bits on overflow, as they do in NCCL and MPI libraries,
// instead of being undefined behaviour: computed in the unsigned type.
template <class A>
using wrap_t = typename std::conditional_t<std::is_integral_v<A> && std::is_signed_v<A>,
                                           std::make_unsigned<A>, std::type_identity<A>>::type;

} // namespace weft::detail

namespace weft::op {

struct sum {
  static constexpr std::string_view name = "sum";
  template <class A>
  WEFT_HOST_DEVICE constexpr A operator()(A a, A b) const {
    using W = detail::wrap_t<A>;
    return static_cast<A>(static_cast<W>(a) + static_cast<W>(b));
  }
};
struct prod {
  static constexpr std::string_view name = "prod";
  template <class A>
  WEFT_HOST_DEVICE constexpr A operator()(A a, A b) const {
    using W = detail::wrap_t<A>;
    return static_cast<A>(static_cast<W>(a) * static_cast<W>(b));
  }
};
struct min {
  static constexpr std::string_view name = "min";
  template <class A>
  WEFT_HOST_DEVICE constexpr A operator()(A a, A b) const {
    return b < a ? b : a;
  }
};
struct max {
  static constexpr std::string_view name = "max";
  template <class A>
  WEFT_HOST_DEVICE constexpr A operator()(A a, A b) const {
    return a < b ? b : a;
  }
};
/// Sum, then divide by the number of ranks (integer division for integer types), like ncclAvg.
/// half scales each input by 1/ranks first and sums, as ncclAvg does for floating types, so that
/// a mean half holds does not overflow on the way: on every transport and two_level, host or
/// device, to the same bits (comm/detail/elementwise.hpp's scale_elements).
struct avg : sum {
  static constexpr std::string_view name = "avg";
};

} // namespace weft::op

namespace weft {

/// Op reduces elements of T: callable on T's accumulation type.
template <class Op, class T>
concept reduction_for = element<T> && std::copy_constructible<Op> &&
    requires(const Op& op, accumulate_t<T> a) {
  { op(a, a) } -> std::convertible_to<accumulate_t<T>>;
};

template <class Op>
inline constexpr bool is_average_v = std::is_base_of_v<op::avg, Op>;

/// The printable name of an operator: its `name` member, or "user" for a user functor.
template <class Op>
constexpr std::string_view op_name() {
  if constexpr (requires { Op::name; }) {
    return Op::name;
  } else {
    return "user";
  }
}

} // namespace weft
