#pragma once
// The compile-time check of an explicit algorithm against the collective and the communicator
// of a call: the algorithm must plan the collective, and the communicator must have what its
// plans need (peer access, messages).
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/plan.hpp>

#include <type_traits>

namespace weft::detail {

// Whether algorithm A's plans send messages: all but those that say otherwise (direct).
template <class A>
inline constexpr bool needs_messages_v = [] {
  if constexpr (requires { A::needs_messages; }) {
    return static_cast<bool>(A::needs_messages);
  } else {
    return true;
  }
}();

template <class A>
inline constexpr bool needs_peer_access_v = [] {
  if constexpr (requires { A::needs_peer_access; }) {
    return static_cast<bool>(A::needs_peer_access);
  } else {
    return false;
  }
}();

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
    static_assert(Algo::serves(C),
                  "weft: this algorithm cannot run this collective. all_reduce: ring, tree, "
                  "halving_doubling, recursive_doubling, direct, hierarchical, automatic; "
                  "reduce_scatter and all_gather: ring, halving_doubling, direct, hierarchical, "
                  "automatic; broadcast and reduce: ring, tree, direct, automatic; all_to_all: "
                  "direct, automatic");
    static_assert(
        !needs_peer_access_v<Algo> || declared_peer_access<Comm>(),
        "weft: this algorithm loads from peers' buffers (algo::direct) and needs a "
        "communicator with the peer_access capability, such as weft::local; use algo::ring "
        "or algo::automatic here");
    static_assert(!needs_messages_v<Algo> || declared_messages<Comm>(),
                  "weft: this algorithm sends messages, and this communicator only loads from its "
                  "peers (weft::cuda::p2p): use algo::direct or algo::automatic here");
  }
}

} // namespace weft::detail
