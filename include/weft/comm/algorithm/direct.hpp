#pragma once
// direct: every rank reads its peers' buffers itself (load/store access, as over NVLink or
// shared memory). Needs a transport with the peer_access capability.
//
//   two-shot all-reduce (large):      one-shot all-reduce (small, a staged plan):
//     sync                              copy input -> scratch (the staging area)
//     rank r reduces block r of         sync
//     every rank's input -> its out     every rank reduces all ranks' staging -> out
//     sync
//     rank r loads block s from rank s  Peers read only the staging area, which the next
//     sync                              staged call leaves alone until its own sync, so
//                                       the call ends without one: one sync in all.
// Reductions run over the ranks in rank order, so every rank computes bitwise the same value.
#include <weft/comm/algorithm/generator.hpp>

#include <numeric>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::algo {

struct direct {
  static constexpr std::string_view name = "direct";
  /// Its plans load from peers' buffers and never send: it runs on communicators with peer
  /// access (weft::local, weft::cuda::p2p, the one-GPU harness) and only there.
  static constexpr capabilities caps{
      .serves = every_collective, .loads = peer_loads::always, .messages = false};
  /// All-reduces of at most this many bytes take the one-shot path.
  static constexpr std::size_t one_shot_bytes = max_staged_scratch_bytes;

  static constexpr bool serves(collective c) { return caps.serves.contains(c); }

  WEFT_COLD static plan make_plan(const plan_request& q) {
    detail::check_request(q, name);
    plan pl(q);
    const int p = q.size;
    const int r = q.rank;
    const std::size_t n = q.count;
    if (p == 1) {
      local_only(pl, q);
      return pl;
    }
    std::vector<int> everyone(static_cast<std::size_t>(p));
    std::iota(everyone.begin(), everyone.end(), 0);
    const int all = pl.add_group(everyone);
    if (q.coll == collective::all_reduce && n * q.element_size <= one_shot_bytes) {
      pl.stage();
      pl.need_scratch(n);
      pl.copy(buffer::input, 0, buffer::scratch, 0, n);
      pl.sync(all);
      pl.load_reduce(all, buffer::scratch, 0, buffer::output, 0, n);
      return pl;
    }
    pl.sync(all);
    switch (q.coll) {
      case collective::all_reduce: {
        const auto mine =
            detail::split_block(n, static_cast<std::size_t>(p), static_cast<std::size_t>(r));
        pl.load_reduce(all, buffer::input, mine.begin, buffer::output, mine.begin, mine.count);
        pl.sync(all);
        for (int k = 1; k < p; ++k) {
          const int s = (r + k) % p; // staggered, so ranks do not all read rank 0 first
          const auto b =
              detail::split_block(n, static_cast<std::size_t>(p), static_cast<std::size_t>(s));
          pl.load(s, buffer::output, b.begin, buffer::output, b.begin, b.count);
        }
        break;
      }
      case collective::reduce_scatter:
        pl.load_reduce(all, buffer::input, static_cast<std::size_t>(r) * n, buffer::output, 0, n);
        break;
      case collective::all_gather:
        for (int k = 0; k < p; ++k) {
          const int s = (r + k) % p;
          pl.load(s, buffer::input, 0, buffer::output, static_cast<std::size_t>(s) * n, n);
        }
        break;
      case collective::broadcast:
        if (r != q.root) pl.load(q.root, buffer::output, 0, buffer::output, 0, n);
        break;
      case collective::reduce:
        if (r == q.root) pl.load_reduce(all, buffer::input, 0, buffer::output, 0, n);
        break;
      case collective::all_to_all:
        for (int k = 0; k < p; ++k) {
          const int s = (r + k) % p;
          pl.load(s, buffer::input, static_cast<std::size_t>(r) * n, buffer::output,
                  static_cast<std::size_t>(s) * n, n);
        }
        break;
    }
    pl.sync(all);
    return pl;
  }

private:
  // One rank: every collective is a copy from input to output (broadcast: nothing).
  static void local_only(plan& pl, const plan_request& q) {
    if (q.coll != collective::broadcast) pl.copy(buffer::input, 0, buffer::output, 0, q.count);
  }
};

} // namespace weft::algo

#include <weft/core/detail/planning_end.hpp>
