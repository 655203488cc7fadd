#pragma once
// ring: ranks 0..p-1 in a ring, each sends only to its right neighbour (r+1)%p and receives
// only from its left neighbour (r-1+p)%p. All-reduce is a reduce-scatter followed by an
// all-gather, each p-1 steps moving one of p near-equal blocks, so every rank sends
// 2(p-1)/p of the data whatever p is: bandwidth-optimal (Patarasuk and Yuan, "Bandwidth
// optimal all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009; the
// scheme Baidu brought to deep learning in 2017 and NCCL's ring uses).
//
//   all-reduce, p = 4, blocks A B C D; step s: rank r sends block r-1-s, receives r-2-s
//
//            reduce-scatter (recv_reduce)        all-gather (recv)
//   step     0        1        2                 3        4        5
//   rank 0   D ->     C ->     B ->  owns A      A ->     D ->     C ->
//   rank 1   A ->     D ->     C ->  owns B      B ->     A ->     D ->
//   rank 2   B ->     A ->     D ->  owns C      C ->     B ->     A ->
//   rank 3   C ->     B ->     A ->  owns D      D ->     C ->     B ->
//
// Block b is reduced once, along the chain b+1, b+2, ..., b, and then only copied, so every
// rank ends with bitwise identical values. Rank r ends the reduce-scatter owning block r,
// which is exactly what reduce_scatter asks of it.
//
// Pipelining: a block larger than chunk_bytes is cut into c chunks, and round t runs step s
// on chunk t - s for every step s in flight, so a rank receives chunk k+1 of a step while it
// forwards chunk k of the next one: 2(p-1) + c - 1 rounds instead of 2(p-1) c. Within a
// round the sent chunk and the written chunk are never the same range (same step: different
// blocks; different steps: different chunk indices).
//
//   broadcast, a chain root -> root+1 -> ... -> root-1; p = 4, root 0, chunks x y z:
//   "x>" sends chunk x to the right, ">x" receives it; c + p - 2 = 5 rounds
//
//   round    0       1        2        3        4
//   rank 0   x>      y>       z>
//   rank 1   >x      x> >y    y> >z    z>
//   rank 2           >x       x> >y    y> >z    z>
//   rank 3                    >x       >y       >z
//
// reduce is the same picture along root+1 -> root+2 -> ... -> root, each receive combining
// the neighbour's partial with the rank's own input; non-roots have no output, so partials
// alternate between two scratch slots (written in one round, sent in the next).
#include <weft/comm/algorithm/generator.hpp>

#include <algorithm>
#include <cstddef>
#include <string_view>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::algo {

struct ring {
  static constexpr std::string_view name = "ring";
  /// Ring steps (all_reduce, reduce_scatter, all_gather) cut a block into chunks of at most
  /// this many bytes. Below it a block moves whole: each extra chunk costs a round, which
  /// is a synchronisation, so small messages go in as few rounds as possible.
  static constexpr std::size_t chunk_bytes = std::size_t{1} << 20;
  /// Chains (broadcast, reduce) cut the whole message into chunks of at most this many
  /// bytes. A chain is idle until the first chunk reaches its end, so it wants smaller
  /// chunks than the ring, where every link is busy from the first round.
  static constexpr std::size_t chain_chunk_bytes = std::size_t{256} << 10;

  static constexpr capabilities caps{.serves = every_collective.without(collective::all_to_all)};
  static constexpr bool serves(collective c) { return caps.serves.contains(c); }

  WEFT_COLD static plan make_plan(const plan_request& q) {
    detail::check_request(q, name);
    if (q.coll == collective::all_to_all) {
      throw error(name_of(q.coll), q.rank, error::unknown, "ring does not plan all_to_all");
    }
    plan pl(q);
    if (q.size == 1) {
      // One rank: every collective is a copy from input to output (broadcast: nothing).
      if (q.coll != collective::broadcast) pl.copy(buffer::input, 0, buffer::output, 0, q.count);
      return pl;
    }
    switch (q.coll) {
      case collective::all_reduce: all_reduce(pl, q); break;
      case collective::reduce_scatter: reduce_scatter(pl, q); break;
      case collective::all_gather: all_gather(pl, q); break;
      case collective::broadcast: broadcast(pl, q); break;
      case collective::reduce: reduce(pl, q); break;
      case collective::all_to_all: break;
    }
    return pl;
  }

  /// Chunks a message of `count` elements is cut into: 0 for nothing, else at least 1.
  static constexpr std::size_t chunks_for(std::size_t count, std::size_t element_size,
                                          std::size_t max_bytes) {
    const std::size_t per_chunk =
        std::max<std::size_t>(1, max_bytes / std::max<std::size_t>(1, element_size));
    return (count + per_chunk - 1) / per_chunk;
  }

private:
  // Block index x mod p, for x that may be negative.
  static constexpr std::size_t wrap(std::ptrdiff_t x, int p) {
    const std::ptrdiff_t m = x % p;
    return static_cast<std::size_t>(m < 0 ? m + p : m);
  }

  // Round t runs step s on chunk t - s, for every step s with a chunk in range. Steps go in
  // increasing s, so sends to the right neighbour and receives from the left one match in
  // the same order on both ends of every link.
  template <class Step>
  static void wavefront(plan& pl, std::size_t steps, std::size_t chunks, const Step& run_step) {
    if (steps == 0 || chunks == 0) return;
    for (std::size_t t = 0; t + 1 < steps + chunks; ++t) {
      const std::size_t first = t + 1 > chunks ? t + 1 - chunks : 0;
      const std::size_t last = std::min(t, steps - 1);
      for (std::size_t s = first; s <= last; ++s)
        run_step(s, t - s);
      pl.next_round();
    }
  }

  static void all_reduce(plan& pl, const plan_request& q) {
    const int p = q.size;
    const auto r = static_cast<std::ptrdiff_t>(q.rank);
    const int right = (q.rank + 1) % p;
    const int left = (q.rank + p - 1) % p;
    const std::size_t n = q.count;
    const auto up = static_cast<std::size_t>(p);
    const std::size_t chunks =
        chunks_for(detail::split_block(n, up, 0).count, q.element_size, chunk_bytes);
    const auto chunk_of = [&](std::size_t b, std::size_t k) {
      const auto blk = detail::split_block(n, up, b);
      const auto ch = detail::split_block(blk.count, chunks, k);
      return detail::block_range{blk.begin + ch.begin, ch.count};
    };
    wavefront(pl, 2 * (up - 1), chunks, [&](std::size_t s, std::size_t k) {
      const auto is = static_cast<std::ptrdiff_t>(s);
      const auto out = chunk_of(wrap(r - 1 - is, p), k);
      const auto in = chunk_of(wrap(r - 2 - is, p), k);
      // Step 0 sends untouched input; later steps forward what the step before wrote.
      pl.send(right, s == 0 ? buffer::input : buffer::output, out.begin, out.count);
      if (s + 1 < up) {
        // First touch of this output range: read the input there, which in place is the
        // same memory, not yet overwritten.
        pl.recv_reduce(left, buffer::input, in.begin, buffer::output, in.begin, in.count);
      } else {
        pl.recv(left, buffer::output, in.begin, in.count);
      }
    });
  }

  // Input holds p blocks of n; rank r's output is reduced block r. Partials alternate between
  // two scratch slots: the one written at step s is sent at step s+1 while step s+1 writes
  // the other, and is free again at step s+2.
  static void reduce_scatter(plan& pl, const plan_request& q) {
    const int p = q.size;
    const auto r = static_cast<std::ptrdiff_t>(q.rank);
    const int right = (q.rank + 1) % p;
    const int left = (q.rank + p - 1) % p;
    const std::size_t n = q.count;
    const auto up = static_cast<std::size_t>(p);
    const std::size_t last = up - 2; // the step that completes block r
    pl.need_scratch(n * std::min<std::size_t>(last, 2));
    const std::size_t chunks = chunks_for(n, q.element_size, chunk_bytes);
    wavefront(pl, up - 1, chunks, [&](std::size_t s, std::size_t k) {
      const auto is = static_cast<std::ptrdiff_t>(s);
      const auto ch = detail::split_block(n, chunks, k);
      const std::size_t out_block = wrap(r - 1 - is, p);
      const std::size_t in_block = wrap(r - 2 - is, p);
      if (s == 0) {
        pl.send(right, buffer::input, out_block * n + ch.begin, ch.count);
      } else {
        pl.send(right, buffer::scratch, ((s - 1) % 2) * n + ch.begin, ch.count);
      }
      if (s == last) {
        pl.recv_reduce(left, buffer::input, in_block * n + ch.begin, buffer::output, ch.begin,
                       ch.count);
      } else {
        pl.recv_reduce(left, buffer::input, in_block * n + ch.begin, buffer::scratch,
                       (s % 2) * n + ch.begin, ch.count);
      }
    });
  }

  // Block b of the output is rank b's input; step s forwards block r-s.
  static void all_gather(plan& pl, const plan_request& q) {
    const int p = q.size;
    const auto r = static_cast<std::ptrdiff_t>(q.rank);
    const int right = (q.rank + 1) % p;
    const int left = (q.rank + p - 1) % p;
    const std::size_t n = q.count;
    const auto up = static_cast<std::size_t>(p);
    const std::size_t chunks = chunks_for(n, q.element_size, chunk_bytes);
    pl.copy(buffer::input, 0, buffer::output, static_cast<std::size_t>(q.rank) * n, n);
    wavefront(pl, up - 1, chunks, [&](std::size_t s, std::size_t k) {
      const auto is = static_cast<std::ptrdiff_t>(s);
      const auto ch = detail::split_block(n, chunks, k);
      if (s == 0) {
        pl.send(right, buffer::input, ch.begin, ch.count);
      } else {
        pl.send(right, buffer::output, wrap(r - is, p) * n + ch.begin, ch.count);
      }
      pl.recv(left, buffer::output, wrap(r - 1 - is, p) * n + ch.begin, ch.count);
    });
  }

  // Position i = r - root along the chain; position i sends chunk k in round k + i.
  static void broadcast(plan& pl, const plan_request& q) {
    const int p = q.size;
    const int right = (q.rank + 1) % p;
    const int left = (q.rank + p - 1) % p;
    const std::size_t n = q.count;
    const std::size_t pos = wrap(q.rank - q.root, p);
    const std::size_t last = static_cast<std::size_t>(p) - 1;
    const std::size_t chunks = chunks_for(n, q.element_size, chain_chunk_bytes);
    if (chunks == 0) return;
    for (std::size_t t = 0; t < chunks + last - 1; ++t) {
      if (pos < last && t >= pos && t - pos < chunks) {
        const auto ch = detail::split_block(n, chunks, t - pos);
        pl.send(right, buffer::output, ch.begin, ch.count);
      }
      if (pos > 0 && t + 1 >= pos && t + 1 - pos < chunks) {
        const auto ch = detail::split_block(n, chunks, t + 1 - pos);
        pl.recv(left, buffer::output, ch.begin, ch.count);
      }
      pl.next_round();
    }
  }

  // Position i = r - root - 1 along the chain, so the root is last; position i sends its
  // partial of chunk k in round k + i. Non-roots have no output: partials live in two
  // scratch slots, chunk k in slot k % 2 (written in one round, sent in the next, reused in
  // the one after).
  static void reduce(plan& pl, const plan_request& q) {
    const int p = q.size;
    const int right = (q.rank + 1) % p;
    const int left = (q.rank + p - 1) % p;
    const std::size_t n = q.count;
    const std::size_t pos = wrap(q.rank - q.root - 1, p);
    const std::size_t last = static_cast<std::size_t>(p) - 1;
    const std::size_t chunks = chunks_for(n, q.element_size, chain_chunk_bytes);
    if (chunks == 0) return;
    const std::size_t slot = detail::split_block(n, chunks, 0).count;
    if (pos > 0 && pos < last) pl.need_scratch(slot * std::min<std::size_t>(chunks, 2));
    for (std::size_t t = 0; t < chunks + last - 1; ++t) {
      if (pos < last && t >= pos && t - pos < chunks) {
        const std::size_t k = t - pos;
        const auto ch = detail::split_block(n, chunks, k);
        if (pos == 0) {
          pl.send(right, buffer::input, ch.begin, ch.count);
        } else {
          pl.send(right, buffer::scratch, (k % 2) * slot, ch.count);
        }
      }
      if (pos > 0 && t + 1 >= pos && t + 1 - pos < chunks) {
        const std::size_t k = t + 1 - pos;
        const auto ch = detail::split_block(n, chunks, k);
        if (pos == last) {
          pl.recv_reduce(left, buffer::input, ch.begin, buffer::output, ch.begin, ch.count);
        } else {
          pl.recv_reduce(left, buffer::input, ch.begin, buffer::scratch, (k % 2) * slot, ch.count);
        }
      }
      pl.next_round();
    }
  }
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
