#pragma once
// algo::stages<IntraAlgo, InterAlgo>: the algorithm tag of weft::two_level, naming the
// algorithm of each level (comm/two_level/communicator.hpp).
#include <weft/comm/algorithm/automatic.hpp>
#include <weft/comm/plan.hpp>

#include <string_view>

namespace weft {

namespace algo {

/// two_level's algorithm: IntraAlgo for the reduce and broadcast inside each node, InterAlgo
/// for the all-reduce (broadcast, reduce) across nodes; reduce_scatter and all_gather run on
/// their reduces and broadcasts (and Intra's all-gather where IntraAlgo plans one), or on even
/// nodes, where both plan them, on one reduce_scatter (all_gather) per level.
template <class IntraAlgo = automatic, class InterAlgo = automatic>
struct stages {
  using intra = IntraAlgo;
  using inter = InterAlgo;
  static constexpr std::string_view name = "stages";
  static constexpr bool serves(collective c) {
    return c != collective::all_to_all;
  }
};

template <class A>
inline constexpr bool is_stages_v = false;
template <class I, class O>
inline constexpr bool is_stages_v<stages<I, O>> = true;

} // namespace algo

} // namespace weft
