#pragma once
// recursive_doubling: the latency-optimal all-reduce for small vectors (Thakur, Rabenseifner
// and Gropp, IJHPCA 19(1), 2005, section 4.4). In round k every rank swaps its whole partial
// result with the rank 2^k away and reduces: log2(p) rounds, the fewest possible, at the
// price of sending the whole vector each round (halving_doubling sends 2(p-1)/p of it in
// twice as many rounds, so this one wins only where per-message latency dominates).
//
//   p = 4, x_r = input of rank r:
//     d=1  0<->1 2<->3   0,1 hold x0+x1;          2,3 hold x2+x3
//     d=2  0<->2 1<->3   everyone holds (x0+x1)+(x2+x3)
//
// Both partners compute the same partial, so to stay bitwise identical they must compute it
// with the same operand order (min(+0, -0) and NaN payloads depend on it; so would a user's
// non-commutative functor): the lower virtual rank's partial is always the left operand.
// The lower rank reduces its own partial with the message (recv_reduce); the upper rank
// receives first and then reduces its own partial into the message.
//
// A send's source must not change within its round, so the partial moves between buffers:
// round k reads slot S_k and writes S_{k+1}. S_0 is the input, the last slot is the output,
// and the ones between alternate two scratch slots. Where the only round would read the
// input and write the output (p = 2 or 3; in place they alias), the result lands in scratch
// and a final copy moves it.
//
// p not a power of two: the fold of halving_doubling (hd_fold): rank 2i gives its input to
// 2i+1 first and receives the result last, 2 more rounds for those pairs.
#include <weft/comm/algorithm/detail/hd_layout.hpp>
#include <weft/comm/algorithm/generator.hpp>

#include <cstddef>
#include <string>
#include <string_view>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::algo {

struct recursive_doubling {
  static constexpr std::string_view name = "recursive_doubling";

  static constexpr capabilities caps{.serves = collectives_of(collective::all_reduce)};
  static constexpr bool serves(collective c) { return caps.serves.contains(c); }

  WEFT_COLD static plan make_plan(const plan_request& q) {
    detail::check_request(q, name);
    if (!serves(q.coll)) {
      throw error(name_of(q.coll), q.rank, error::unknown,
                  std::string(name) + " plans only all_reduce");
    }
    plan pl(q);
    const std::size_t n = q.count;
    if (q.size == 1) {
      pl.copy(buffer::input, 0, buffer::output, 0, n);
      return pl;
    }
    const detail::hd_fold fold(q.size);
    const int r = q.rank;
    if (fold.folded_out(r)) {
      pl.send(r + 1, buffer::input, 0, n);
      pl.next_round();
      pl.recv(r + 1, buffer::output, 0, n);
      return pl;
    }
    // Scratch slots: odd rounds' results at 0, even rounds' (and the fold's) at n, moved up to
    // the input's phase mod 16 bytes, so that every reduce runs in packs on a device.
    const std::size_t second = detail::scratch_offset_like(n, 0, q.element_size);
    const auto slot = [&](int k) {
      const std::size_t off = k % 2 == 1 ? 0 : second;
      pl.need_scratch(off + n);
      return off;
    };
    buffer cur = buffer::input;
    std::size_t cur_off = 0;
    if (fold.absorbs(r)) {
      // The fold's partial is the pair's: input of 2i (the message) first, then 2i+1's.
      cur = buffer::scratch;
      cur_off = slot(0);
      pl.recv(r - 1, cur, cur_off, n);
      pl.reduce(buffer::input, 0, cur, cur_off, n);
      pl.next_round();
    }
    const int v = fold.virtual_rank(r);
    int k = 0;
    for (int d = 1; d < fold.pow2; d *= 2, ++k) {
      const bool last = 2 * d == fold.pow2;
      buffer to = buffer::scratch;
      std::size_t to_off = 0;
      if (last && cur != buffer::input) {
        to = buffer::output;
      } else {
        to_off = slot(k + 1);
      }
      const int peer = fold.real_rank(v ^ d);
      pl.send(peer, cur, cur_off, n);
      if ((v & d) == 0) {
        pl.recv_reduce(peer, cur, cur_off, to, to_off, n); // mine (op) theirs
      } else {
        pl.recv(peer, to, to_off, n);
        pl.reduce(cur, cur_off, to, to_off, n); // theirs (op) mine
      }
      pl.next_round();
      cur = to;
      cur_off = to_off;
    }
    if (cur != buffer::output) {
      pl.copy(cur, cur_off, buffer::output, 0, n);
      pl.next_round();
    }
    if (fold.absorbs(r)) pl.send(r - 1, buffer::output, 0, n);
    return pl;
  }
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
