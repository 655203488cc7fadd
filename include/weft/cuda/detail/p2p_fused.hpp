#pragma once
// The host side of the p2p transport's fused all-reduce kernels (detail/p2p_fused.cuh): which
// calls take them, how their blocks and threads cut the elements, how many blocks run, and the
// element functors they apply. Everything here is host-callable, so the host tests check it.
//
// One-shot (direct's staged plan), one kernel, every block:
//
//   copy its slice of the input into the rank's staging area (times 1/p first: avg on half)
//   grid barrier: the last block to arrive syncs with every peer (the sync of p2p_sync.cuh)
//   reduce every rank's staging in group order into the output (then / p: avg on other types)
//   captured: a second barrier, so that no peer's next replay overwrites a staging area still read
//
// One rank (direct's plan is a copy): the copy into the output, avg's scaling or division in it,
// no barrier.
//
// Two-shot (direct's large plan), one kernel, every block:
//
//   copy its slice of the input into the rank's input region (times 1/p first: avg on half)
//   barrier; reduce block `rank` (split_block(n, p, rank)) of every rank's input region in group
//   order into the rank's output region (then / p); barrier; load every block s, in the plan's
//   staggered order (rank + k) % p, from rank s's output region into the caller's output; barrier
//
// Barriers. A grid barrier is one sync per call per pair of ranks, the same counters, flags and
// failure rules as the step-by-step sync kernel: each block arrives at a counter in the rank's
// workspace (after a system-scope fence, so that what it wrote is published with the flag); the
// last block to arrive resets the counter, runs the sync (detail/p2p_sync.cuh, a thread per
// member), and releases the others by bumping a generation word. So the ranks count the same
// epochs per pair as the step-by-step plan (one-shot: one sync, two captured; two-shot: three),
// fused and step-by-step calls mix in any order, and a failed or abandoned peer fails the call
// as it fails a sync. After each barrier every block reads the rank's failed mark and, where it
// is set, leaves together with the others (no block waits at a later barrier for one that left).
//
// The blocks of one kernel wait for each other, so all must be resident at once: the grid is at
// most the device's SMs divided by the ranks on the device (p2p_fused_blocks), one block of
// block_threads threads per SM always fits, and the spinning kernels of ranks sharing a device
// leave each other room.
#include <weft/comm/algorithm/generator.hpp>
#include <weft/comm/detail/elementwise.hpp>
#include <weft/comm/plan.hpp>
#include <weft/core/config.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace weft::cuda::detail {

/// The most ranks a fused kernel serves: the GPUs of one node. More ranks run step by step.
inline constexpr int p2p_fused_max_ranks = 8;

enum class p2p_fused_shape : std::uint8_t {
  none,     // step by step
  one_rank, // direct's all-reduce on one rank: a copy (avg's scaling or division inside)
  one_shot, // direct's staged all-reduce
  two_shot, // direct's all-reduce by reduce-scatter and all-gather of loads
};

namespace fused_detail {

inline bool is_everyone(const std::vector<int>& group, int size) {
  if (group.size() != static_cast<std::size_t>(size)) return false;
  for (int q = 0; q < size; ++q)
    if (group[static_cast<std::size_t>(q)] != q) return false;
  return true;
}

inline bool is_step(const step& s, step_kind k, buffer src, std::size_t src_offset, buffer dst,
                    std::size_t dst_offset, std::size_t count) {
  return s.kind == k && s.src == src && s.dst == dst && s.src_offset == src_offset &&
         s.dst_offset == dst_offset && s.count == count;
}

} // namespace fused_detail

/// Which fused kernel runs rank pl.rank()'s plan on `size` ranks, read from the plan's steps:
/// one_rank for exactly [copy input -> output] of an all-reduce on one rank, one_shot for exactly
/// [copy input -> scratch, sync everyone, load_reduce everyone's scratch -> output] of a staged
/// all-reduce, two_shot for exactly [sync, load_reduce of block rank, sync, a load of every other
/// rank's block of the output, sync] over everyone in rank order with the blocks split_block
/// cuts; none for anything else (another algorithm, more than p2p_fused_max_ranks ranks, no
/// elements), which runs step by step. Every rank makes the same call, so every rank reads the
/// same shape from its plan.
inline p2p_fused_shape p2p_fused_shape_of(const plan& pl, int size) {
  using fused_detail::is_step;
  const std::size_t n = pl.count();
  const auto& st = pl.steps();
  if (pl.coll() != collective::all_reduce || size < 1 || size > p2p_fused_max_ranks ||
      pl.size() != size || n == 0 || st.empty()) {
    return p2p_fused_shape::none;
  }
  if (size == 1) {
    const bool copy = !pl.staged() && st.size() == 1 &&
                      is_step(st[0], step_kind::copy, buffer::input, 0, buffer::output, 0, n);
    return copy ? p2p_fused_shape::one_rank : p2p_fused_shape::none;
  }
  const int g =
      st.front().kind == step_kind::sync ? st.front().peer : (st.size() > 1 ? st[1].peer : -1);
  if (g < 0 || static_cast<std::size_t>(g) >= pl.groups().size() ||
      !fused_detail::is_everyone(pl.group(g), size)) {
    return p2p_fused_shape::none;
  }
  const auto sync_all = [&](const step& s) { return s.kind == step_kind::sync && s.peer == g; };
  if (pl.staged()) {
    const bool one_shot =
        st.size() == 3 &&
        is_step(st[0], step_kind::copy, buffer::input, 0, buffer::scratch, 0, n) &&
        sync_all(st[1]) &&
        is_step(st[2], step_kind::load_reduce, buffer::scratch, 0, buffer::output, 0, n) &&
        st[2].peer == g && pl.scratch_count() >= n;
    return one_shot ? p2p_fused_shape::one_shot : p2p_fused_shape::none;
  }
  const auto p = static_cast<std::size_t>(size);
  const auto mine = weft::detail::split_block(n, p, static_cast<std::size_t>(pl.rank()));
  if (st.size() < 4 || !sync_all(st[0]) || st[1].peer != g ||
      !is_step(st[1], step_kind::load_reduce, buffer::input, mine.begin, buffer::output, mine.begin,
               mine.count) ||
      !sync_all(st[2]) || !sync_all(st.back())) {
    return p2p_fused_shape::none;
  }
  // The loads between the second and the last sync: each other rank's block once, from its output.
  std::vector<bool> loaded(p, false);
  loaded[static_cast<std::size_t>(pl.rank())] = true;
  for (std::size_t i = 3; i + 1 < st.size(); ++i) {
    const step& s = st[i];
    if (s.kind != step_kind::load || s.peer < 0 || s.peer >= size) return p2p_fused_shape::none;
    const auto b = weft::detail::split_block(n, p, static_cast<std::size_t>(s.peer));
    if (loaded[static_cast<std::size_t>(s.peer)] ||
        !is_step(s, step_kind::load, buffer::output, b.begin, buffer::output, b.begin, b.count)) {
      return p2p_fused_shape::none;
    }
    loaded[static_cast<std::size_t>(s.peer)] = true;
  }
  for (std::size_t s = 0; s < p; ++s) {
    // A block of no elements may have no load.
    if (!loaded[s] && weft::detail::split_block(n, p, s).count != 0) return p2p_fused_shape::none;
  }
  return p2p_fused_shape::two_shot;
}

/// The grid barrier's arrival rule: the block whose arrival, after `arrived_before` others, makes
/// `blocks`, is the last, and it runs the sync with the peers.
WEFT_HOST_DEVICE constexpr bool p2p_grid_last(unsigned arrived_before, unsigned blocks) noexcept {
  return arrived_before + 1 == blocks;
}

/// The grid barrier's release rule: a waiting block goes on once the generation word differs from
/// the one it read before arriving (it wraps; only a change counts).
WEFT_HOST_DEVICE constexpr bool p2p_grid_released(std::uint32_t generation,
                                                  std::uint32_t seen) noexcept {
  return generation != seen;
}

/// The syncs per pair of ranks of one fused call: what the step-by-step plan makes, so that the
/// two mix. A captured one-shot call ends with a second sync (p2p.cuh: its staging area is the
/// same at every replay).
constexpr int p2p_fused_barriers(p2p_fused_shape s, bool captured) noexcept {
  switch (s) {
    case p2p_fused_shape::none: return 0;
    case p2p_fused_shape::one_rank: return 0;
    case p2p_fused_shape::one_shot: return captured ? 2 : 1;
    case p2p_fused_shape::two_shot: return 3;
  }
  return 0;
}

/// One range of a fused kernel's phase: `count` elements from element `offset` of the operands,
/// cut for 16-byte packs (weft::detail::split_for_packs).
struct p2p_fused_range {
  std::size_t offset = 0;
  std::size_t count = 0;
  weft::detail::pack_split cut;
};

/// The ranges of a fused call, from the operands' addresses: the copy of the input, the reduction
/// and, two-shot, the gather of every block in the plan's order (gather[k]: block (rank + k) % p).
struct p2p_fused_work {
  p2p_fused_range copy;
  p2p_fused_range reduce;
  p2p_fused_range gather[p2p_fused_max_ranks];
  int gathers = 0;
};

/// The ranges of rank `rank`'s fused call of n elements of element_size bytes on p ranks.
/// Addresses (as integers): `in` the caller's input, `out` the caller's output, `stage[q]` rank
/// q's staging area (one-shot) or input region (two-shot) in this rank's address space,
/// `reduced[q]` rank q's output region (two-shot). The reduction's operands are the stages (and,
/// two-shot, this rank's output region at its block); a gather's are the caller's output and rank
/// s's output region at block s.
inline p2p_fused_work p2p_fused_ranges(p2p_fused_shape shape, int p, int rank, std::size_t n,
                                       std::size_t element_size, std::uintptr_t in,
                                       std::uintptr_t out, const std::uintptr_t* stage,
                                       const std::uintptr_t* reduced) {
  using weft::detail::split_for_packs;
  const auto at = [&](std::uintptr_t base, std::size_t offset) {
    return base + offset * element_size;
  };
  p2p_fused_work w;
  // One rank copies into its output, the others into their staging area or input region.
  const std::uintptr_t copy_ops[2] = {shape == p2p_fused_shape::one_rank ? out : stage[rank], in};
  w.copy = {0, n, split_for_packs(copy_ops, 2, element_size, n)};
  if (shape == p2p_fused_shape::one_rank) return w;
  std::uintptr_t ops[p2p_fused_max_ranks + 1] = {};
  if (shape == p2p_fused_shape::one_shot) {
    ops[0] = out;
    for (int q = 0; q < p; ++q)
      ops[q + 1] = stage[q];
    w.reduce = {0, n, split_for_packs(ops, p + 1, element_size, n)};
    return w;
  }
  const auto pz = static_cast<std::size_t>(p);
  const auto mine = weft::detail::split_block(n, pz, static_cast<std::size_t>(rank));
  ops[0] = at(reduced[rank], mine.begin);
  for (int q = 0; q < p; ++q)
    ops[q + 1] = at(stage[q], mine.begin);
  w.reduce = {mine.begin, mine.count, split_for_packs(ops, p + 1, element_size, mine.count)};
  for (int k = 0; k < p; ++k) {
    const int s = (rank + k) % p;
    const auto b = weft::detail::split_block(n, pz, static_cast<std::size_t>(s));
    const std::uintptr_t g[2] = {at(out, b.begin), at(reduced[s], b.begin)};
    w.gather[k] = {b.begin, b.count, split_for_packs(g, 2, element_size, b.count)};
  }
  w.gathers = p;
  return w;
}

/// Calls f(i) for the indices i < n that thread `thread` of block `block` of a grid of `blocks`
/// blocks of `threads` threads handles: a grid-stride loop, so every index once over the grid.
template <class F>
WEFT_HOST_DEVICE void p2p_fused_indices(std::size_t n, unsigned block, unsigned blocks,
                                        unsigned thread, unsigned threads, F&& f) {
  const std::size_t stride = static_cast<std::size_t>(blocks) * threads;
  for (std::size_t i = static_cast<std::size_t>(block) * threads + thread; i < n; i += stride)
    f(i);
}

/// The blocks of a fused kernel whose largest phase has `indices` indices: enough to cover them
/// with `threads` threads each, at most the device's `sms` shared by the `ranks_on_device` ranks
/// whose fused kernels may spin there at once (all of a kernel's blocks must be resident), at
/// least one.
constexpr unsigned p2p_fused_blocks(std::size_t indices, unsigned threads, int sms,
                                    int ranks_on_device) noexcept {
  const std::size_t wanted = (indices + threads - 1) / threads;
  const int share = sms / std::max(ranks_on_device, 1);
  const std::size_t most = static_cast<std::size_t>(std::max(share, 1));
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(wanted, most)));
}

static_assert(p2p_fused_blocks(0, 512, 132, 1) == 1);
static_assert(p2p_fused_blocks(513, 512, 132, 1) == 2);
static_assert(p2p_fused_blocks(std::size_t{1} << 30, 512, 132, 1) == 132);
static_assert(p2p_fused_blocks(std::size_t{1} << 30, 512, 132, 3) == 44);
static_assert(p2p_fused_blocks(std::size_t{1} << 30, 512, 4, 8) == 1);

/// How a fused call finishes op::avg, as the step-by-step path does (comm/detail/planned_path.hpp):
/// on half each input is scaled by 1/p before the sum (scale_elements), on the other types the
/// sum is divided by p (divide_elements); any other operator, or an execute() whose caller
/// divides itself, has none.
enum class p2p_average : std::uint8_t { none, prescale, divide };

template <class T, class Op>
constexpr p2p_average p2p_average_of(bool whole_call) noexcept {
  if (!whole_call || !is_average_v<Op>) return p2p_average::none;
  return std::is_same_v<T, half> ? p2p_average::prescale : p2p_average::divide;
}

/// The copy phase's functor: dst[i] = src[i], or src[i] times `by` (weft::detail::scale_elements)
/// where `scale`; then, where `ranks` > 0 (one rank's avg), the element divided by ranks
/// (weft::detail::divide_elements) after it is stored, as the step-by-step divide reads it.
template <class T>
struct p2p_stage_elements {
  static constexpr int width = weft::detail::packed<T>::width;
  T* dst;
  const T* src;
  bool scale;
  accumulate_t<T> by;
  int ranks = 0; // 0: no division

  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    if (scale) {
      weft::detail::scale_elements<T>{dst, src, by}(i);
    } else {
      dst[i] = src[i];
    }
    if (ranks > 0) weft::detail::divide_elements<T>{dst, ranks}(i);
  }
  WEFT_HOST_DEVICE void pack(std::size_t e) const {
    if (scale || ranks > 0) {
      for (int l = 0; l < width; ++l)
        (*this)(e + static_cast<std::size_t>(l));
    } else {
      weft::detail::copy_elements<T>{dst, src}.pack(e);
    }
  }
};

/// The reduction phase's functor: weft::detail::reduce_sources, then, where `ranks` > 0, the
/// element divided by ranks (weft::detail::divide_elements) after it is stored, as the
/// step-by-step path's divide kernel reads it.
template <class T, class Op>
struct p2p_reduce_elements {
  static constexpr int width = weft::detail::packed<T>::width;
  weft::detail::reduce_sources<T, Op> sum;
  int ranks; // 0: no division

  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    sum(i);
    if (ranks > 0) weft::detail::divide_elements<T>{sum.dst, ranks}(i);
  }
  WEFT_HOST_DEVICE void pack(std::size_t e) const {
    sum.pack(e);
    if (ranks > 0) {
      for (int l = 0; l < width; ++l)
        weft::detail::divide_elements<T>{sum.dst, ranks}(e + static_cast<std::size_t>(l));
    }
  }
};

} // namespace weft::cuda::detail
