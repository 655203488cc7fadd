#pragma once
// algo::levels<IntraAlgo, InterAlgo>: the algorithm tag of weft::two_level, naming the
// algorithm of each level (comm/two_level/communicator.hpp).
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/algorithm/capabilities.hpp>
#include <weft/comm/plan.hpp>

#include <string_view>

namespace weft {

namespace algo {

/// two_level's algorithm, one per level: IntraAlgo for the reduce and broadcast inside each node,
/// InterAlgo for the all-reduce (broadcast, reduce) across nodes; reduce_scatter and all_gather run
/// on their reduces and broadcasts (and Intra's all-gather where IntraAlgo plans one), or on
/// uniform nodes, where both plan them, on one reduce_scatter (all_gather) per level.
template <class IntraAlgo = automatic, class InterAlgo = automatic>
struct levels {
  using intra = IntraAlgo;
  using inter = InterAlgo;
  static constexpr std::string_view name = "levels";
  /// What it needs is what each level's algorithm needs of that level's communicator.
  static constexpr capabilities caps{.serves = every_collective.without(collective::all_to_all),
                                     .messages = false};
  static constexpr bool serves(collective c) { return caps.serves.contains(c); }
};

template <class A>
inline constexpr bool is_levels_v = false;
template <class I, class O>
inline constexpr bool is_levels_v<levels<I, O>> = true;

template <class IntraAlgo = automatic, class InterAlgo = automatic>
using stages [[deprecated("use weft::algo::levels")]] = levels<IntraAlgo, InterAlgo>;
template <class A>
[[deprecated("use weft::algo::is_levels_v")]] inline constexpr bool is_stages_v = is_levels_v<A>;

} // namespace algo

} // namespace weft
