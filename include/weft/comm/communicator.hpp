#pragma once
// What a communicator is. Transports (weft::local, weft::mpi, the CUDA ones) model these
// concepts; operations and layers are written against them.
#include <weft/comm/algorithm/capabilities.hpp>
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
  { cc.node_of() } -> std::convertible_to<const std::vector<int>&>; // node of each rank
};

/// A communicator that can run a plan over typed buffers.
template <class C>
concept plan_executor = communicator<C> &&
    requires(C& c, const plan& p, const float* in, float* out) {
  c.execute(p, in, std::size_t{}, out, std::size_t{}, op::sum{}, std::string_view{});
};

/// A communicator whose ranks can load from and store to each other's buffers (shared
/// memory, NVLink peer access): what algo::direct needs.
template <class C>
concept peer_access = plan_executor<C> && requires {
  requires C::peer_access;
};

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

/// Whether C has what algorithm A's plans need of it, as A's capabilities declare: peer
/// access where every plan loads from peers (direct), messages where its plans send.
template <class C, class A>
inline constexpr bool lends_peer_access_for = algo::capabilities_of<A>.loads !=
                                                  algo::peer_loads::always ||
                                              declared_peer_access<C>();
template <class C, class A>
inline constexpr bool sends_messages_for =
    !algo::capabilities_of<A>.messages || declared_messages<C>();

} // namespace detail

/// A communicator that can run the plans of algorithm A, a tag that makes plans
/// (A::make_plan; not vendor, which calls the transport's own collectives, nor two_level's
/// levels<>): plans that load from every peer need peer_access (capabilities.hpp), plans that
/// send need a communicator that sends.
template <class C, class A>
concept runs_algorithm = requires(const plan_request& q) {
  { A::make_plan(q) } -> std::same_as<plan>;
}
&&plan_executor<C>&& detail::lends_peer_access_for<C, A>&& detail::sends_messages_for<C, A>;

} // namespace weft
