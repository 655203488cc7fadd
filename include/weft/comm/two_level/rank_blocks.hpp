#pragma once
// two_level's reduce_scatter and all_gather by rank blocks: rank block i of a node crosses
// between nodes on the local ranks i mod m, by pieces of up to a chunk
// (comm/two_level/communicator.hpp describes the protocol). On uniform nodes, where both levels
// plan the collective and its two whole calls fit the levels (uniform_calls_fit),
// uniform_nodes.hpp's two calls take it instead. On one level (one node, or
// one rank per node) the level's own collective, by the pieces of the rank blocks that it takes
// in one call (a p2p level's workspace bounds them), each piece gathered into or scattered from
// working memory by a strided copy.
#include <weft/comm/all_gather.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/comm/two_level/communicator.hpp>
#include <weft/comm/two_level/uniform_nodes.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace weft {

template <communicator Intra, communicator Inter, class Runtime>
template <class Algo, class T, class Op>
void two_level<Intra, Inter, Runtime>::reduce_scatter(const T* in, T* out, std::size_t n,
                                                      const Op& op) {
  check_levels<Algo>();
  using IA = typename Algo::intra;
  using OA = typename Algo::inter;
  const auto p = static_cast<std::size_t>(size());
  // One level, where its algorithm plans a reduce_scatter (else the pieces below work too): by
  // the pieces of every rank block that the level takes in one call.
  const auto one_level = [&](auto algo, auto& level) {
    using A = typename decltype(algo)::type;
    by_level_calls<T>(
        level, collective::reduce_scatter, n, [&](std::size_t first, std::size_t len) {
          if (len == n) {
            weft::reduce_scatter<A>(level, std::span<const T>(in, n * p), std::span<T>(out, n), op);
            return;
          }
          auto piece = runtime_.template scratch<T>(level, p * len); // piece [first, +len) of each
          runtime_.copy_rows(level, piece.data(), len, in + first, n, len, p);
          weft::reduce_scatter<A>(level, std::span<const T>(piece.data(), p * len),
                                  std::span<T>(out + first, len), op);
        });
  };
  if constexpr (IA::serves(collective::reduce_scatter)) {
    if (layout_.nodes() == 1) {
      one_level(std::type_identity<IA>{}, intra_);
      return;
    }
  }
  if constexpr (OA::serves(collective::reduce_scatter)) {
    if (layout_.nodes() == size()) {
      inter_alone([&] { one_level(std::type_identity<OA>{}, inter_); });
      return;
    }
  }
  if (n == 0) return;
  if constexpr (IA::serves(collective::reduce_scatter) && OA::serves(collective::reduce_scatter)) {
    if (layout_.uniform() && uniform_calls_fit<T>(collective::reduce_scatter, n)) {
      reduce_scatter_uniform<IA, OA>(in, out, n, op);
      return;
    }
  }
  constexpr bool average = is_average_v<Op>;
  const detail::summing_t<Op> sop(op); // avg sums in the levels, then divides once
  auto ordered = runtime_.template scratch<T>(intra_, contiguous_ ? 0 : p * n);
  const T* x = in;
  if (!contiguous_) {
    for (std::size_t r = 0; r < p; ++r)
      runtime_.copy(intra_, ordered.data() + to_size(pos_[r]) * n, in + r * n, n);
    x = ordered.data();
  }
  const auto pieces = rank_pieces<T>(n);
  const bool lead = leader();
  std::size_t carried = 0; // a leader's rank blocks (i mod m == its local rank)
  for (int c = 0; c < layout_.nodes(); ++c) {
    for (int i = 0; i < ranks_on(c); ++i)
      carried += lead && i % layout_.min_ranks_per_node() == local_;
  }
  auto part = runtime_.template scratch<T>(intra_, carried * n);
  const bool extras_here =
      ranks_on(color_) > layout_.min_ranks_per_node(); // blocks handed on by a broadcast
  auto sink =
      runtime_.template scratch<T>(intra_, extras_here ? std::min(n, chunk_elements<T>()) : 0);
  const auto within = [&](const rank_piece& q) {
    const std::span<T> dst =
        local_ == q.leader ? std::span<T>(part.data() + q.slot, q.len) : std::span<T>{};
    weft::reduce<IA>(intra_, std::span<const T>(x + q.offset, q.len), dst, q.leader, sop);
  };
  const auto across = [&](const rank_piece& q) {
    T* const mine = part.data() + q.slot;
    const bool home = color_ == q.node;
    T* const dst = home && local_ == q.local ? out + q.first : mine;
    weft::reduce<OA>(inter_, std::span<const T>(mine, q.len), std::span<T>(dst, home ? q.len : 0),
                     q.node, sop);
  };
  const auto hand_on = [&](const rank_piece& q) {
    T* const buf = local_ == q.local    ? out + q.first
                   : local_ == q.leader ? part.data() + q.slot
                                        : sink.data();
    weft::broadcast<IA>(intra_, std::span<T>(buf, q.len), q.leader);
  };
  within(pieces.front());
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const auto& q = pieces[k];
    const bool carries = local_ == q.leader;
    if (carries) {
      runtime_(intra_, inter_);
      across(q);
    }
    if (k + 1 < pieces.size()) within(pieces[k + 1]);
    if (q.local != q.leader && color_ == q.node) {
      if (carries) runtime_(inter_, intra_);
      hand_on(q);
    }
  }
  if (lead) runtime_(inter_, intra_);
  if constexpr (average) runtime_.divide(intra_, out, n, size());
}

template <communicator Intra, communicator Inter, class Runtime>
template <class Algo, class T>
void two_level<Intra, Inter, Runtime>::all_gather(const T* in, T* out, std::size_t n) {
  check_levels<Algo>();
  using IA = typename Algo::intra;
  using OA = typename Algo::inter;
  const auto p = static_cast<std::size_t>(size());
  // dst (level.size() blocks of n) = every rank's `in` on `level`, by the pieces of the blocks
  // that the level takes in one call: the one-level paths, and a node's gather below.
  const auto gather = [&](auto algo, auto& level, T* dst) {
    using A = typename decltype(algo)::type;
    const auto k = to_size(level.size());
    by_level_calls<T>(level, collective::all_gather, n, [&](std::size_t first, std::size_t len) {
      if (len == n) {
        weft::all_gather<A>(level, std::span<const T>(in, n), std::span<T>(dst, n * k));
        return;
      }
      auto piece = runtime_.template scratch<T>(level, k * len); // piece [first, +len) of each
      weft::all_gather<A>(level, std::span<const T>(in + first, len),
                          std::span<T>(piece.data(), k * len));
      runtime_.copy_rows(level, dst + first, n, piece.data(), len, len, k);
    });
  };
  if constexpr (IA::serves(collective::all_gather)) {
    if (layout_.nodes() == 1) {
      gather(std::type_identity<IA>{}, intra_, out);
      return;
    }
  }
  if constexpr (OA::serves(collective::all_gather)) {
    if (layout_.nodes() == size()) {
      inter_alone([&] { gather(std::type_identity<OA>{}, inter_, out); });
      return;
    }
  }
  if (n == 0) return;
  if constexpr (IA::serves(collective::all_gather) && OA::serves(collective::all_gather)) {
    if (layout_.uniform() && uniform_calls_fit<T>(collective::all_gather, n)) {
      all_gather_uniform<IA, OA>(in, out, n);
      return;
    }
  }
  auto ordered = runtime_.template scratch<T>(intra_, contiguous_ ? 0 : p * n);
  T* const w = contiguous_ ? out : ordered.data();
  const auto here = to_size(node_first_[to_size(color_)]) * n;
  const int mine = ranks_on(color_);
  if constexpr (IA::serves(collective::all_gather)) {
    gather(std::type_identity<IA>{}, intra_, w + here);
  } else { // IA plans broadcasts only (tree): one per rank of the node
    runtime_.copy(intra_, w + here + to_size(local_) * n, in, n);
    for (int i = 0; i < mine; ++i) {
      by_level_calls<T>(intra_, collective::broadcast, n, [&](std::size_t first, std::size_t len) {
        weft::broadcast<IA>(intra_, std::span<T>(w + here + to_size(i) * n + first, len), i);
      });
    }
  }
  const bool lead = leader();
  if (lead) runtime_(intra_, inter_);
  for (const auto& q : rank_pieces<T>(n)) {
    const bool carries = local_ == q.leader;
    if (carries) weft::broadcast<OA>(inter_, std::span<T>(w + q.offset, q.len), q.node);
    if (color_ != q.node) {
      if (carries) runtime_(inter_, intra_);
      weft::broadcast<IA>(intra_, std::span<T>(w + q.offset, q.len), q.leader);
    }
  }
  if (lead) runtime_(inter_, intra_);
  if (!contiguous_) {
    for (std::size_t r = 0; r < p; ++r)
      runtime_.copy(intra_, out + r * n, w + to_size(pos_[r]) * n, n);
  }
}

} // namespace weft
