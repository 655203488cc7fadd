#pragma once
// pairwise: all-to-all by p-1 exchanges. In round k every rank r sends its block for rank
// r+k and receives rank r-k's block for it, so each round is a permutation and no rank
// is the target of two senders at once:
//
//   round 0:  r keeps its own block          (copy in[r] -> out[r])
//   round k:  r --in[r+k]--> r+k ,  r-k --in[r]--> r   (into out[r-k])     k = 1 .. p-1
//
// It needs only send and receive, so it runs on every transport (algo::direct does the
// same by loading from peers where they can be read directly).
#include <weft/comm/algorithm/generator.hpp>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::algo {

struct pairwise {
  static constexpr std::string_view name = "pairwise";

  static constexpr capabilities caps{.serves = collectives_of(collective::all_to_all)};
  static constexpr bool serves(collective c) { return caps.serves.contains(c); }

  WEFT_COLD static plan make_plan(const plan_request& q) {
    detail::check_request(q, name);
    if (!serves(q.coll)) {
      throw error(name_of(q.coll), q.rank, error::unknown, "pairwise plans all_to_all only");
    }
    plan pl(q);
    const int p = q.size;
    const int r = q.rank;
    const std::size_t n = q.count;
    const auto block = [n](int b) { return static_cast<std::size_t>(b) * n; };
    pl.copy(buffer::input, block(r), buffer::output, block(r), n);
    for (int k = 1; k < p; ++k) {
      pl.next_round();
      const int to = (r + k) % p;
      const int from = (r - k + p) % p;
      pl.send(to, buffer::input, block(to), n);
      pl.recv(from, buffer::output, block(from), n);
    }
    return pl;
  }
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
