#pragma once
// What an algorithm serves and needs, declared once on its tag:
//
//   struct ring {
//     static constexpr capabilities caps{
//         .serves = every_collective.without(collective::all_to_all)};
//     static constexpr bool serves(collective c) { return caps.serves.contains(c); }
//     ...
//   };
//
// Everything else reads it: dispatch refuses at compile time a collective the tag does not
// plan, or a communicator that lacks what its plans need, and lists in that error the
// algorithms that do plan the collective; automatic's candidate table skips by it; the
// concept runs_algorithm<Comm, A> (communicator.hpp) tests a communicator against it.
#include <weft/comm/plan.hpp>

#include <cstdint>

namespace weft::algo {

/// A set of collectives.
struct collectives {
  std::uint8_t bits = 0;

  [[nodiscard]] constexpr bool contains(collective c) const noexcept {
    return (bits & bit(c)) != 0;
  }
  [[nodiscard]] constexpr collectives with(collective c) const noexcept {
    return {static_cast<std::uint8_t>(bits | bit(c))};
  }
  [[nodiscard]] constexpr collectives without(collective c) const noexcept {
    return {static_cast<std::uint8_t>(bits & ~bit(c))};
  }
  friend constexpr bool operator==(collectives, collectives) = default;

private:
  static constexpr std::uint8_t bit(collective c) noexcept {
    return static_cast<std::uint8_t>(1u << static_cast<unsigned>(c));
  }
};

/// The set of the collectives named.
template <class... C>
constexpr collectives collectives_of(C... c) noexcept {
  collectives s;
  ((s = s.with(c)), ...);
  return s;
}

inline constexpr collectives every_collective =
    collectives_of(collective::all_reduce, collective::reduce_scatter, collective::all_gather,
                   collective::broadcast, collective::reduce, collective::all_to_all);

/// Whose buffers an algorithm's plans load (plan steps load and load_reduce).
enum class peer_loads : std::uint8_t {
  none,      // never: its plans send and receive only
  by_layout, // where the ranks' nodes make one of its levels load (hierarchical<direct, ...>):
             // a transport without peer access refuses such a plan when it runs
  always,    // from every rank of the group (direct): only a peer_access communicator runs
             // it, and only within one node
};

/// An algorithm's capabilities: what it serves and what it needs of a communicator.
struct capabilities {
  collectives serves;                  // the collectives it plans
  peer_loads loads = peer_loads::none; // its plans' loads from peers' buffers
  bool messages = true;                // its plans may send and receive: a load-only
                                       // communicator (weft::cuda::p2p) cannot run them
  bool nodes = false;                  // it only helps across nodes (a group on one node
                                       // gains nothing from it)
  friend constexpr bool operator==(const capabilities&, const capabilities&) = default;
};

/// A's capabilities: A::caps, or for a tag that declares none, the collectives its serves()
/// accepts, with plans that send and receive and never load, unless the tag says otherwise
/// with the members `needs_peer_access` (its plans always load from peers) or
/// `needs_messages` (false: they never send), which user tags may still declare instead.
template <class A>
inline constexpr capabilities capabilities_of = [] {
  if constexpr (requires { A::caps; }) {
    return capabilities{A::caps};
  } else {
    collectives s;
    for (unsigned i = 0; i < 8; ++i) {
      const auto c = static_cast<collective>(i);
      if (every_collective.contains(c) && A::serves(c)) s = s.with(c);
    }
    capabilities caps{.serves = s};
    if constexpr (requires { A::needs_peer_access; }) {
      if (static_cast<bool>(A::needs_peer_access)) caps.loads = peer_loads::always;
    }
    if constexpr (requires { A::needs_messages; }) {
      caps.messages = static_cast<bool>(A::needs_messages);
    }
    return caps;
  }
}();

/// A list of algorithm tags.
template <class... A>
struct algorithms {};

} // namespace weft::algo
