#pragma once
// tree: the double binary tree (Sanders, Speck and Träff, "Two-tree algorithms for full
// bandwidth broadcast, reduction and scan", Parallel Computing 35(12), 2009; NCCL has used it
// for all-reduce since 2.4). Two binary trees over the same ranks, each carrying half of the
// data. Every rank is a leaf in one of them, so in an all-reduce of n elements no rank sends
// or receives more than 2n, the figure a ring's 2(p-1)/p n approaches, while the depth, and
// so the latency, is floor(log2 p) instead of p - 1.
//
//   p = 8:   tree 1, in-order               tree 2 = tree 1 shifted by one rank (i -> i+1)
//                   7                                      0
//                   3                                      4
//               1       5                              2       6
//             0   2   4   6                          1   3   5   7
//            interior: the odd ranks                interior: the even ranks
// Shifting works for odd p too (rank 0 is then a leaf in both); detail/tree_shape.hpp has
// the construction for every p >= 1.
//
// all_reduce: tree 1 carries elements [0, n/2), tree 2 [n/2, n), each cut into m chunks of at
// most chunk_bytes (small messages: one chunk). Both trees run at once, round by round. A node
// of height s (leaves 0) sends its partial of chunk k up in round k + s; its children's
// partials of chunk k came in rounds k + s(child) <= k + s - 1 and were reduced in as they
// came. The root (height H) holds chunk k reduced after round k + H - 1 and sends it down in
// round k + H; a node at depth d receives it in round k + H + d - 1 and passes it on in the
// next. m + 2H - 1 rounds in all.
//
//   tree 1 of p = 4 (3 -> 1 -> {0, 2}), chunks A and B of its half; "A>3" sends A to rank 3,
//   "+A(0,2)" reduces the A of ranks 0 and 2 in, "<A" receives the reduced A:
//   round      0          1             2             3              4
//   ranks 0,2  A>1        B>1                         <A             <B
//   rank 1     +A(0,2)    A>3 +B(0,2)   B>3 <A        A>0,2 <B       B>0,2
//   rank 3                +A(1)         +B(1) A>1     B>1
// In no round does a rank write the chunk it sends (rank 1 in round 2 sends its partial B
// and overwrites A), so sends' sources stay unchanged until their round ends.
//
// Each element is reduced once, at one tree root, through the same tree order, and then only
// copied down: every rank ends with bitwise identical values.
//
// broadcast and reduce from any root: as in the paper, the trees span the other p - 1 ranks
// (relabelled r -> (r - root - 1) mod p), and the root stands above both tree roots.
// Broadcast: the root sends chunk k of each half to that tree's root in round k, and each
// level passes it one level down a round. Reduce: the mirror image, ending with the root
// reducing its own input with each tree root's partial. Both take m + H' rounds, H' =
// floor(log2(p - 1)). A non-root rank has no output buffer in reduce: it accumulates in
// scratch, and only for the one tree in which it is interior.
#include <weft/comm/algorithm/detail/tree_shape.hpp>
#include <weft/comm/algorithm/generator.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::algo {

struct tree {
  static constexpr std::string_view name = "tree";
  /// Each tree's half is cut into chunks of at most this many bytes. A chunk costs a round,
  /// and a tree is idle until its first chunk has gone up and down (2 log2 p rounds), so the
  /// chunks are smaller than a ring's: enough of them to fill the pipeline, few enough that
  /// the per-round latency stays small beside the transfer.
  static constexpr std::size_t chunk_bytes = std::size_t{128} << 10;

  static constexpr capabilities caps{
      .serves = collectives_of(collective::all_reduce, collective::broadcast, collective::reduce)};
  static constexpr bool serves(collective c) { return caps.serves.contains(c); }

  WEFT_COLD static plan make_plan(const plan_request& q) {
    detail::check_request(q, name);
    if (!serves(q.coll)) {
      throw error(name_of(q.coll), q.rank, error::unknown,
                  "tree plans only all_reduce, broadcast and reduce");
    }
    plan pl(q);
    const std::size_t n = q.count;
    if (q.size == 1) {
      if (q.coll != collective::broadcast) pl.copy(buffer::input, 0, buffer::output, 0, n);
      return pl;
    }
    if (n == 0) return pl;

    const setting s = make_setting(q);
    const auto shape = detail::double_binary_tree(s.members);
    std::array<half_tree, 2> halves{};
    std::size_t scratch = 0;
    std::int64_t rounds = 0;
    const std::size_t chunk =
        std::max<std::size_t>(1, chunk_bytes / std::max<std::size_t>(1, q.element_size));
    for (std::size_t t = 0; t < 2; ++t) {
      half_tree& h = halves[t];
      const auto range = detail::split_block(n, 2, t);
      h.begin = range.begin;
      h.count = range.count;
      h.chunks = (h.count + chunk - 1) / chunk;
      h.height = shape[t].height[static_cast<std::size_t>(shape[t].root)];
      // reduce: a non-root rank accumulates its interior tree's half in scratch.
      // It starts at the phase of the half's offset in the input, mod 16 bytes, so that every
      // chunk reduces in 16-byte packs on a device.
      if (q.coll == collective::reduce && s.me >= 0 && !shape[t].leaf(s.me)) {
        h.scratch_base = detail::scratch_offset_like(scratch, h.begin, q.element_size);
        scratch = h.scratch_base + h.count;
      }
      const auto m = static_cast<std::int64_t>(h.chunks);
      rounds =
          std::max(rounds, q.coll == collective::all_reduce ? m + 2 * h.height - 1 : m + h.height);
    }
    pl.need_scratch(scratch);
    for (std::int64_t round = 0; round < rounds; ++round) {
      // Tree 1's steps before tree 2's on every rank: two messages between the same pair in
      // one round (one per tree) then match in the same order on both sides.
      for (std::size_t t = 0; t < 2; ++t)
        emit(pl, q, s, shape[t], halves[t], round);
      pl.next_round();
    }
    return pl;
  }

private:
  // Who takes part in the trees: everyone for all_reduce; for broadcast and reduce, the
  // ranks other than the root, as members 0..p-2 starting after the root.
  struct setting {
    bool rooted = false;
    int members = 0;
    int me = 0; // this rank's member index; -1 for the root above the trees
    int root = 0;
    int size = 0;
    [[nodiscard]] int rank_of(int member) const {
      return rooted ? (root + 1 + member) % size : member;
    }
  };
  static setting make_setting(const plan_request& q) {
    setting s;
    s.rooted = q.coll != collective::all_reduce;
    s.members = s.rooted ? q.size - 1 : q.size;
    s.root = q.root;
    s.size = q.size;
    s.me = !s.rooted ? q.rank : (q.rank == q.root ? -1 : (q.rank - q.root - 1 + q.size) % q.size);
    return s;
  }

  // One tree's half of the data.
  struct half_tree {
    std::size_t begin = 0;
    std::size_t count = 0;
    std::size_t chunks = 0;
    std::int64_t height = 0;      // of the tree's root
    std::size_t scratch_base = 0; // reduce: where this half's partials sit in scratch
  };

  // Chunk k of a half, or a zero count when k is outside 0..chunks-1 (the plan drops empty steps).
  static detail::block_range chunk_of(const half_tree& h, std::int64_t k) {
    if (k < 0 || static_cast<std::size_t>(k) >= h.chunks) return {h.begin, 0};
    const auto b = detail::split_block(h.count, h.chunks, static_cast<std::size_t>(k));
    return {h.begin + b.begin, b.count};
  }

  // This rank's steps of one tree in one round.
  static void emit(plan& pl, const plan_request& q, const setting& s, const detail::tree_links& tr,
                   const half_tree& h, std::int64_t round) {
    if (h.chunks == 0) return;
    const bool up = q.coll != collective::broadcast;
    const bool down = q.coll != collective::reduce;
    const int top = s.rank_of(tr.root);
    if (s.me < 0) { // the root above the trees
      if (up) {
        const auto c = chunk_of(h, round - h.height);
        pl.recv_reduce(top, buffer::input, c.begin, buffer::output, c.begin, c.count);
      } else {
        const auto c = chunk_of(h, round);
        pl.send(top, buffer::output, c.begin, c.count);
      }
      return;
    }
    const auto me = static_cast<std::size_t>(s.me);
    const int parent = tr.parent[me] >= 0 ? s.rank_of(tr.parent[me]) : (s.rooted ? q.root : -1);
    // Children in the order their partials of a chunk arrive (lower first, then left first).
    std::array<int, 2> kids = tr.children[me];
    if (kids[1] >= 0 && tr.height[static_cast<std::size_t>(kids[1])] <
                            tr.height[static_cast<std::size_t>(kids[0])]) {
      std::swap(kids[0], kids[1]);
    }
    if (up) {
      // Partials live in output for all_reduce, in scratch at reduce's non-root ranks.
      const bool in_scratch = q.coll == collective::reduce;
      const buffer acc = in_scratch ? buffer::scratch : buffer::output;
      const auto at = [&](std::size_t x) {
        return in_scratch ? h.scratch_base + (x - h.begin) : x;
      };
      if (parent >= 0) {
        const auto c = chunk_of(h, round - tr.height[me]);
        if (tr.leaf(s.me)) {
          pl.send(parent, buffer::input, c.begin, c.count);
        } else {
          pl.send(parent, acc, at(c.begin), c.count);
        }
      }
      for (std::size_t i = 0; i < 2 && kids[i] >= 0; ++i) {
        const auto c = chunk_of(h, round - tr.height[static_cast<std::size_t>(kids[i])]);
        // The first partial of a chunk combines with this rank's input; the next with that.
        if (i == 0) {
          pl.recv_reduce(s.rank_of(kids[i]), buffer::input, c.begin, acc, at(c.begin), c.count);
        } else {
          pl.recv_reduce(s.rank_of(kids[i]), acc, at(c.begin), acc, at(c.begin), c.count);
        }
      }
    }
    if (down) {
      // all_reduce: the root sends chunk k down in round k + H. broadcast: it receives chunk
      // k from the root above in round k and sends it on in round k + 1.
      const std::int64_t start = q.coll == collective::all_reduce ? h.height : 1;
      const std::int64_t depth = tr.depth[me];
      if (parent >= 0) {
        const auto c = chunk_of(h, round - start - depth + 1);
        pl.recv(parent, buffer::output, c.begin, c.count);
      }
      const auto c = chunk_of(h, round - start - depth);
      for (int kid : tr.children[me]) {
        if (kid >= 0) pl.send(s.rank_of(kid), buffer::output, c.begin, c.count);
      }
    }
  }
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
