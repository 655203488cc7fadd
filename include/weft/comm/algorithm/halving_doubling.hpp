#pragma once
// halving_doubling: Rabenseifner's all-reduce, as described by Thakur, Rabenseifner and Gropp,
// "Optimization of collective communication operations in MPICH" (IJHPCA 19(1), 2005): a
// reduce-scatter by recursive halving, then an all-gather by recursive doubling. Each rank
// sends 2(p-1)/p of the vector, as in a ring, but in 2 log2(p) rounds instead of 2(p-1), so
// it wins when latency matters (medium sizes, many ranks).
//
//   all_reduce, p = 4, vector split in shares A B C D (share v ends reduced on rank v):
//     halving  d=2  0<->2 1<->3   0,1 send C D and reduce A B;  2,3 send A B and reduce C D
//              d=1  0<->1 2<->3   0 reduces A, 1 B, 2 C, 3 D (now over all four ranks)
//     doubling d=1  0<->1 2<->3   swap what each holds: 0,1 hold A B; 2,3 hold C D
//              d=2  0<->2 1<->3   swap halves: every rank holds A B C D
//   Halving starts at the largest distance, so the share a rank keeps at the end is its own
//   index (halving from distance 1 up ends with share bit_reverse(v) instead); reduce_scatter
//   relies on that. Each element is reduced on one rank only and then copied, so every rank
//   ends bitwise identical.
//
//   p not a power of two (the fold): p2 = largest power of two <= p, rem = p - p2.
//     fold    i < rem: rank 2i -> 2i+1 its whole input; 2i+1 reduces it into its own
//     core    the p2 ranks 1, 3, .., 2rem-1, 2rem, .., p-1 (virtual ranks 0 .. p2-1, in rank
//             order) run the power-of-two algorithm
//     unfold  2i+1 -> 2i the result                         2 log2(p2) + 2 rounds in all
//
//   reduce_scatter (input p blocks of count): the same halving, but virtual rank v keeps the
//     blocks of the ranks it stands for (2i and 2i+1, or its own), which are contiguous, so
//     rank r ends with block r; unfold: 2i+1 -> 2i block 2i.       log2(p2) (+2) rounds
//   all_gather: fold 2i -> 2i+1 block 2i; doubling over those same block ranges; unfold:
//     2i+1 -> 2i every block but 2i (two messages).                log2(p2) (+2) rounds
//
// Scratch: none for all_reduce and all_gather; reduce_scatter needs the first kept range
// (half the input for a power of two; none for p2 = 2), or all of it on a rank that absorbs
// a fold.
#include <weft/comm/algorithm/detail/hd_layout.hpp>
#include <weft/comm/algorithm/generator.hpp>

#include <cstddef>
#include <string>
#include <string_view>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::algo {

struct halving_doubling {
  static constexpr std::string_view name = "halving_doubling";

  static constexpr capabilities caps{.serves = collectives_of(collective::all_reduce,
                                                              collective::reduce_scatter,
                                                              collective::all_gather)};
  static constexpr bool serves(collective c) { return caps.serves.contains(c); }

  WEFT_COLD static plan make_plan(const plan_request& q) {
    detail::check_request(q, name);
    if (!serves(q.coll)) {
      throw error(name_of(q.coll), q.rank, error::unknown,
                  std::string(name) + " plans only all_reduce, reduce_scatter and all_gather");
    }
    plan pl(q);
    if (q.size == 1) {
      pl.copy(buffer::input, 0, buffer::output, 0, q.count);
      return pl;
    }
    switch (q.coll) {
      case collective::all_reduce: all_reduce(pl, q); break;
      case collective::reduce_scatter: reduce_scatter(pl, q); break;
      default: all_gather(pl, q); break;
    }
    return pl;
  }

private:
  // The halving step at distance d of virtual rank v: the share range it keeps and the one it
  // gives to its partner v ^ d, inside their common group of 2d virtual ranks.
  struct halving_step {
    int peer;
    detail::block_range keep;
    detail::block_range give;
  };
  static halving_step halve(const detail::hd_layout& lay, int v, int d) {
    const int group = v & ~(2 * d - 1);
    const bool upper = (v & d) != 0;
    const int keep = upper ? group + d : group;
    const int give = upper ? group : group + d;
    return {lay.fold.real_rank(v ^ d), lay.range(keep, keep + d), lay.range(give, give + d)};
  }

  static void all_reduce(plan& pl, const plan_request& q) {
    const detail::hd_fold fold(q.size);
    const detail::hd_layout lay{fold, q.count, false};
    const int r = q.rank;
    const std::size_t n = q.count;
    if (fold.folded_out(r)) {
      pl.send(r + 1, buffer::input, 0, n);
      pl.next_round();
      pl.recv(r + 1, buffer::output, 0, n);
      return;
    }
    // The first reduction reads input and writes output; everything after works in output,
    // so in place and out of place run the same steps.
    buffer cur = buffer::input;
    if (fold.absorbs(r)) {
      pl.recv_reduce(r - 1, buffer::input, 0, buffer::output, 0, n);
      pl.next_round();
      cur = buffer::output;
    }
    const int v = fold.virtual_rank(r);
    for (int d = fold.pow2 / 2; d >= 1; d /= 2) {
      const halving_step h = halve(lay, v, d);
      pl.send(h.peer, cur, h.give.begin, h.give.count);
      pl.recv_reduce(h.peer, cur, h.keep.begin, buffer::output, h.keep.begin, h.keep.count);
      pl.next_round();
      cur = buffer::output;
    }
    for (int d = 1; d < fold.pow2; d *= 2) {
      const int peer = fold.real_rank(v ^ d);
      const int mine = v & ~(d - 1);
      const int theirs = (v ^ d) & ~(d - 1);
      const auto m = lay.range(mine, mine + d);
      const auto t = lay.range(theirs, theirs + d);
      pl.send(peer, buffer::output, m.begin, m.count);
      pl.recv(peer, buffer::output, t.begin, t.count);
      pl.next_round();
    }
    if (fold.absorbs(r)) pl.send(r - 1, buffer::output, 0, n);
  }

  static void reduce_scatter(plan& pl, const plan_request& q) {
    const detail::hd_fold fold(q.size);
    const detail::hd_layout lay{fold, q.count, true};
    const int r = q.rank;
    const std::size_t n = q.count;
    const std::size_t total = n * static_cast<std::size_t>(q.size);
    const std::size_t own = static_cast<std::size_t>(r) * n;
    if (fold.folded_out(r)) {
      pl.send(r + 1, buffer::input, 0, total);
      pl.next_round();
      pl.recv(r + 1, buffer::output, 0, n);
      return;
    }
    const bool absorbs = fold.absorbs(r);
    const int v = fold.virtual_rank(r);
    // Partial sums live in scratch at (element - base). The first kept range holds every later
    // one, so scratch needs only that much, or the whole vector after a fold.
    buffer cur = buffer::input;
    std::size_t cur_base = 0;
    std::size_t base = 0;
    if (absorbs) {
      pl.need_scratch(total);
      pl.recv_reduce(r - 1, buffer::input, 0, buffer::scratch, 0, total);
      pl.next_round();
      cur = buffer::scratch;
    } else {
      const halving_step first = halve(lay, v, fold.pow2 / 2);
      base = first.keep.begin;
      if (fold.pow2 > 2) pl.need_scratch(first.keep.count);
    }
    for (int d = fold.pow2 / 2; d >= 1; d /= 2) {
      const halving_step h = halve(lay, v, d);
      // A rank that stands for itself alone keeps exactly block r at the last step: reduce
      // it straight into output.
      const bool to_output = d == 1 && !absorbs;
      const buffer dst = to_output ? buffer::output : buffer::scratch;
      const std::size_t dst_base = to_output ? h.keep.begin : base;
      pl.send(h.peer, cur, h.give.begin - cur_base, h.give.count);
      pl.recv_reduce(h.peer, cur, h.keep.begin - cur_base, dst, h.keep.begin - dst_base,
                     h.keep.count);
      pl.next_round();
      cur = dst;
      cur_base = dst_base;
    }
    if (absorbs) {
      // Scratch holds the reduced blocks r-1 and r.
      pl.send(r - 1, buffer::scratch, own - n - base, n);
      pl.copy(buffer::scratch, own - base, buffer::output, 0, n);
    }
  }

  static void all_gather(plan& pl, const plan_request& q) {
    const detail::hd_fold fold(q.size);
    const detail::hd_layout lay{fold, q.count, true};
    const int r = q.rank;
    const std::size_t n = q.count;
    const std::size_t total = n * static_cast<std::size_t>(q.size);
    const std::size_t own = static_cast<std::size_t>(r) * n;
    if (fold.folded_out(r)) {
      pl.send(r + 1, buffer::input, 0, n);
      pl.copy(buffer::input, 0, buffer::output, own, n);
      pl.next_round();
      pl.recv(r + 1, buffer::output, 0, own);
      pl.recv(r + 1, buffer::output, own + n, total - own - n);
      return;
    }
    const bool absorbs = fold.absorbs(r);
    if (absorbs) {
      pl.recv(r - 1, buffer::output, own - n, n);
      pl.copy(buffer::input, 0, buffer::output, own, n);
      pl.next_round();
    }
    const int v = fold.virtual_rank(r);
    for (int d = 1; d < fold.pow2; d *= 2) {
      const int peer = fold.real_rank(v ^ d);
      const int mine = v & ~(d - 1);
      const int theirs = (v ^ d) & ~(d - 1);
      const auto m = lay.range(mine, mine + d);
      const auto t = lay.range(theirs, theirs + d);
      if (d == 1 && !absorbs) {
        // Sends are posted before a round's copies run: send the own block from input, and
        // place it in output alongside.
        pl.send(peer, buffer::input, 0, n);
        pl.copy(buffer::input, 0, buffer::output, own, n);
      } else {
        pl.send(peer, buffer::output, m.begin, m.count);
      }
      pl.recv(peer, buffer::output, t.begin, t.count);
      pl.next_round();
    }
    if (absorbs) {
      // 2i already holds its own block.
      pl.send(r - 1, buffer::output, 0, own - n);
      pl.send(r - 1, buffer::output, own, total - own);
    }
  }
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
