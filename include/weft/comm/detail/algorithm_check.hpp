#pragma once
// The compile-time check of an explicit algorithm against the collective and the communicator
// of a call, read from the algorithm's capabilities (capabilities.hpp). Where the algorithm
// does not plan the collective, the error's note lists the algorithms that do, taken from the
// same declarations:
//
//   In instantiation of 'void weft::detail::check_plans() [with weft::collective C =
//   weft::collective::all_to_all; Algo = weft::algo::tree; PlannedBy = weft::algo::algorithms<
//   weft::algo::direct, weft::algo::pairwise, weft::algo::automatic, weft::algo::vendor>]'
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/capabilities.hpp>
#include <weft/comm/algorithm/vendor.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/plan.hpp>

#include <type_traits>

namespace weft::detail {

template <class... A>
constexpr algo::algorithms<A...> concat(algo::algorithms<A...>) {
  return {};
}
template <class... A, class... B, class... Rest>
constexpr auto concat(algo::algorithms<A...>, algo::algorithms<B...>, Rest... rest) {
  return concat(algo::algorithms<A..., B...>{}, rest...);
}

/// Every algorithm a call may name: automatic's candidates, automatic and vendor.
using named_algorithms =
    decltype(concat(candidate_algorithms{}, algo::algorithms<algo::automatic, algo::vendor>{}));

/// The algorithms of List that plan C.
template <collective C, class... A>
constexpr auto planning(algo::algorithms<A...>) {
  return concat(algo::algorithms<>{},
                std::conditional_t<A::serves(C), algo::algorithms<A>, algo::algorithms<>>{}...);
}

template <collective C, class Algo, class PlannedBy>
constexpr void check_plans() {
  static_assert(
      Algo::serves(C),
      "weft: this algorithm does not plan this collective (Algo and C in the instantiation note); "
      "PlannedBy there lists the algorithms that do, as their tags' caps declare");
}

/// Fails to compile, with a message that says what to change, where Algo cannot run C on Comm.
template <collective C, class Algo, class Comm>
constexpr void check_algorithm() {
  static_assert(
      algo::plan_generator<Algo> || std::is_same_v<Algo, algo::automatic>,
      "weft: the algorithm policy must be a weft::algo tag (ring, tree, halving_doubling, "
      "recursive_doubling, direct, pairwise, hierarchical<Intra, Inter>, automatic, vendor)");
  static_assert(plan_executor<Comm>,
                "weft: this communicator cannot run collectives (no execute())");
  if constexpr (!std::is_same_v<Algo, algo::automatic>) {
    check_plans<C, Algo, decltype(planning<C>(named_algorithms{}))>();
    static_assert(
        lends_peer_access_for<Comm, Algo>,
        "weft: this algorithm loads from peers' buffers (algo::direct) and needs a "
        "communicator with the peer_access capability, such as weft::local; use algo::ring "
        "or algo::automatic here");
    static_assert(sends_messages_for<Comm, Algo>,
                  "weft: this algorithm sends messages, and this communicator only loads from its "
                  "peers (weft::cuda::p2p): use algo::direct or algo::automatic here");
  }
}

} // namespace weft::detail
