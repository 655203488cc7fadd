#pragma once
// What a communicator is. Transports (weft::local, weft::mpi, the CUDA ones) model these
// concepts; operations and layers are written against them.
#include <weft/comm/plan.hpp>
#include <weft/core/ops.hpp>

#include <concepts>
#include <cstddef>
#include <string_view>
#include <vector>

namespace weft {

/// Ranks that can talk: rank/size, split, barrier, and the placement of each rank.
template <class C>
concept communicator = std::movable<C> && requires(C& c, const C& cc) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.barrier();
  { c.split(0, 0) } -> std::same_as<C>;
  { cc.node_of() } -> std::convertible_to<const std::vector<int>&>;  // node of each rank
};

/// A communicator that can run a plan over typed buffers.
template <class C>
concept plan_executor = communicator<C> && requires(C& c, const plan& p, const float* in, float* out) {
  c.execute(p, in, std::size_t{}, out, std::size_t{}, op::sum{}, std::string_view{});
};

/// A communicator whose ranks can load from and store to each other's buffers (shared
/// memory, NVLink peer access): what algo::direct needs.
template <class C>
concept peer_access = plan_executor<C> && requires { requires C::peer_access; };

namespace detail {

/// What C declares of itself, for a wrapper (traced, checked_calls) to declare the same:
/// C::peer_access where it has one, else false; C::messages where it has one, else true.
template <class C>
constexpr bool declared_peer_access() {
  if constexpr (requires { C::peer_access; }) {
    return static_cast<bool>(C::peer_access);
  } else {
    return false;
  }
}
template <class C>
constexpr bool declared_messages() {
  if constexpr (requires { C::messages; }) {
    return static_cast<bool>(C::messages);
  } else {
    return true;
  }
}

} // namespace detail

} // namespace weft
