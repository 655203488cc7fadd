#pragma once
// two_level's all_reduce, broadcast and reduce: each chunk cut into m blocks (m the fewest
// ranks on a node), block j carried across nodes by local rank j (comm/two_level/communicator.hpp
// describes the protocol). On uniform nodes most of the call goes by uniform_nodes.hpp.
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/two_level/communicator.hpp>
#include <weft/comm/two_level/uniform_nodes.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace weft {

template <communicator Intra, communicator Inter, class Runtime>
template <class Algo, class T, class Op>
void two_level<Intra, Inter, Runtime>::all_reduce(const T* in, T* out, std::size_t count,
                                                  const Op& op) {
  check_levels<Algo>();
  using IA = typename Algo::intra;
  using OA = typename Algo::inter;
  if (layout_.nodes() == 1) {
    by_level_calls<T>(intra_, collective::all_reduce, count, [&](std::size_t first, std::size_t n) {
      run_all_reduce<IA>(intra_, in + first, out + first, n, op);
    });
    return;
  }
  if (layout_.nodes() == size()) { // one rank per node
    inter_alone([&] {
      by_level_calls<T>(inter_, collective::all_reduce, count,
                        [&](std::size_t first, std::size_t n) {
                          run_all_reduce<OA>(inter_, in + first, out + first, n, op);
                        });
    });
    return;
  }
  if constexpr (IA::serves(collective::reduce_scatter) && IA::serves(collective::all_gather)) {
    if (layout_.uniform()) {
      const std::size_t head = count - count % to_size(layout_.min_ranks_per_node());
      all_reduce_uniform<IA, OA>(in, out, head, op);
      in += head;
      out += head;
      count -= head; // fewer than L elements left: by blocks below
    }
  }
  if (count == 0) return;
  constexpr bool average = is_average_v<Op>;
  const detail::summing_t<Op> sop(op); // avg sums in the levels, then divides once
  const std::size_t chunk = chunk_elements<T>();
  const std::size_t chunks = chunk_count(count, chunk);
  const auto span_of = [&](std::size_t k) { return chunk_span(k, chunk, count); };
  const auto reduce_chunk = [&](std::size_t k) {
    const auto [first, len] = span_of(k);
    for (int j = 0; j < layout_.min_ranks_per_node(); ++j) {
      const auto [b, e] = block<T>(len, j);
      if (b == e) continue;
      const std::span<const T> src(in + first + b, e - b);
      const std::span<T> dst(out + first + b, intra_.rank() == j ? e - b : 0);
      weft::reduce<IA>(intra_, src, dst, j, sop);
    }
  };
  const auto reduce_across = [&](std::size_t k) {
    const auto [first, len] = span_of(k);
    const auto [b, e] = block<T>(len, local_);
    if (b == e) return;
    weft::all_reduce<OA>(inter_, std::span<T>(out + first + b, e - b), sop);
    if constexpr (average) runtime_.divide(inter_, out + first + b, e - b, size());
  };
  const auto broadcast_chunk = [&](std::size_t k) {
    const auto [first, len] = span_of(k);
    for (int j = 0; j < layout_.min_ranks_per_node(); ++j) {
      const auto [b, e] = block<T>(len, j);
      if (b != e) weft::broadcast<IA>(intra_, std::span<T>(out + first + b, e - b), j);
    }
  };
  const bool lead = leader();
  reduce_chunk(0);
  if (lead) runtime_(intra_, inter_);
  for (std::size_t k = 0; k < chunks; ++k) {
    if (lead) reduce_across(k);
    if (k + 1 < chunks) {
      reduce_chunk(k + 1);
      if (lead)
        runtime_(intra_,
                 inter_); // Inter's next chunk waits for this reduce, not for the broadcast below
    }
    if (lead) runtime_(inter_, intra_);
    broadcast_chunk(k);
  }
}

template <communicator Intra, communicator Inter, class Runtime>
template <class Algo, class T>
void two_level<Intra, Inter, Runtime>::broadcast(T* data, std::size_t count, int root) {
  check_levels<Algo>();
  using IA = typename Algo::intra;
  using OA = typename Algo::inter;
  const int root_node = layout_.node[to_size(root)];
  const int root_local = layout_.local[to_size(root)];
  if (layout_.nodes() == 1) {
    by_level_calls<T>(intra_, collective::broadcast, count, [&](std::size_t first, std::size_t n) {
      weft::broadcast<IA>(intra_, std::span<T>(data + first, n), root_local);
    });
    return;
  }
  if (layout_.nodes() == size()) { // one rank per node
    inter_alone([&] {
      by_level_calls<T>(inter_, collective::broadcast, count,
                        [&](std::size_t first, std::size_t n) {
                          weft::broadcast<OA>(inter_, std::span<T>(data + first, n), root_node);
                        });
    });
    return;
  }
  if constexpr (IA::serves(collective::all_gather)) {
    if (layout_.uniform()) {
      const std::size_t head = count - count % to_size(layout_.min_ranks_per_node());
      broadcast_uniform<IA, OA>(data, head, root);
      data += head;
      count -= head; // fewer than L elements left: by blocks below
    }
  }
  if (count == 0) return;
  const std::size_t chunk = chunk_elements<T>();
  const std::size_t chunks = chunk_count(count, chunk);
  const bool lead = leader();
  const auto across = [&](std::size_t k) {
    const auto [first, len] = chunk_span(k, chunk, count);
    const auto [b, e] = block<T>(len, local_);
    if (b != e) weft::broadcast<OA>(inter_, std::span<T>(data + first + b, e - b), root_node);
  };
  if (color_ == root_node) {
    const auto whole = [&](std::size_t k) {
      const auto [first, len] = chunk_span(k, chunk, count);
      weft::broadcast<IA>(intra_, std::span<T>(data + first, len), root_local);
    };
    whole(0);
    for (std::size_t k = 0; k < chunks; ++k) {
      if (lead) {
        runtime_(intra_, inter_); // chunk k is here
        across(k);
      }
      if (k + 1 < chunks) whole(k + 1);
    }
  } else {
    if (lead) runtime_(intra_, inter_); // the caller's earlier work on the buffer
    for (std::size_t k = 0; k < chunks; ++k) {
      if (lead) {
        across(k);
        runtime_(inter_, intra_);
      }
      const auto [first, len] = chunk_span(k, chunk, count);
      for (int j = 0; j < layout_.min_ranks_per_node(); ++j) {
        const auto [b, e] = block<T>(len, j);
        if (b != e) weft::broadcast<IA>(intra_, std::span<T>(data + first + b, e - b), j);
      }
    }
  }
  if (lead) runtime_(inter_, intra_); // the call ends on Intra's stream
}

template <communicator Intra, communicator Inter, class Runtime>
template <class Algo, class T, class Op>
void two_level<Intra, Inter, Runtime>::reduce(const T* in, T* out, std::size_t count, int root,
                                              const Op& op) {
  check_levels<Algo>();
  using IA = typename Algo::intra;
  using OA = typename Algo::inter;
  const int root_node = layout_.node[to_size(root)];
  const int root_local = layout_.local[to_size(root)];
  const bool at_root = rank_ == root;
  // One level (one node, or one rank per node): the level's reduce, by the pieces it takes.
  const auto piece = [&](std::size_t first, std::size_t n) {
    return std::pair(std::span<const T>(in + first, n),
                     at_root ? std::span<T>(out + first, n) : std::span<T>{});
  };
  if (layout_.nodes() == 1) {
    by_level_calls<T>(intra_, collective::reduce, count, [&](std::size_t first, std::size_t n) {
      const auto [src, dst] = piece(first, n);
      weft::reduce<IA>(intra_, src, dst, root_local, op);
    });
    return;
  }
  if (layout_.nodes() == size()) {
    inter_alone([&] {
      by_level_calls<T>(inter_, collective::reduce, count, [&](std::size_t first, std::size_t n) {
        const auto [src, dst] = piece(first, n);
        weft::reduce<OA>(inter_, src, dst, root_node, op);
      });
    });
    return;
  }
  if constexpr (IA::serves(collective::reduce_scatter) && IA::serves(collective::all_gather)) {
    if (layout_.uniform()) {
      const std::size_t head = count - count % to_size(layout_.min_ranks_per_node());
      reduce_uniform<IA, OA>(in, out, head, root, op);
      in += head;
      out += at_root ? head : 0;
      count -= head; // fewer than L elements left: by blocks below
    }
  }
  if (count == 0) return;
  constexpr bool average = is_average_v<Op>;
  const detail::summing_t<Op> sop(op); // avg sums in the levels, then divides once
  const std::size_t chunk = chunk_elements<T>();
  const std::size_t chunks = chunk_count(count, chunk);
  const bool lead = leader();
  const bool on_root_node = color_ == root_node;
  // A leader's block of chunk k, reduced over its node, lives at slot k of `part`; on the
  // root's node the ranks that only pass blocks on to the root receive them into `sink`.
  // (sized by the longest chunk there is: chunk_bytes may well exceed the whole call)
  const std::size_t longest = std::min(chunk, count);
  const std::size_t slot = detail::two_level_block_room(
      longest, static_cast<std::size_t>(layout_.min_ranks_per_node()), sizeof(T));
  auto part = runtime_.template scratch<T>(intra_, lead ? chunks * slot : 0);
  auto sink = runtime_.template scratch<T>(intra_, on_root_node && !at_root ? slot : 0);
  const auto reduce_within = [&](std::size_t k) {
    const auto [first, len] = chunk_span(k, chunk, count);
    for (int j = 0; j < layout_.min_ranks_per_node(); ++j) {
      const auto [b, e] = block<T>(len, j);
      if (b == e) continue;
      // Only rank j receives (part is empty on the others: no pointer into it there).
      const std::span<T> dst =
          local_ == j ? std::span<T>(part.data() + k * slot, e - b) : std::span<T>{};
      weft::reduce<IA>(intra_, std::span<const T>(in + first + b, e - b), dst, j, sop);
    }
  };
  const auto reduce_across = [&](std::size_t k) {
    const auto [first, len] = chunk_span(k, chunk, count);
    const auto [b, e] = block<T>(len, local_);
    if (b == e) return;
    T* const mine = part.data() + k * slot;
    T* const dst = at_root ? out + first + b : mine; // the root's node's other leaders: in place
    weft::reduce<OA>(inter_, std::span<const T>(mine, e - b),
                     std::span<T>(dst, on_root_node ? e - b : 0), root_node, sop);
  };
  const auto hand_to_root = [&](std::size_t k) {
    const auto [first, len] = chunk_span(k, chunk, count);
    for (int j = 0; j < layout_.min_ranks_per_node(); ++j) {
      const auto [b, e] = block<T>(len, j);
      if (b == e || j == root_local) continue;
      T* const buf = at_root ? out + first + b : local_ == j ? part.data() + k * slot : sink.data();
      weft::broadcast<IA>(intra_, std::span<T>(buf, e - b), j);
    }
  };
  reduce_within(0);
  for (std::size_t k = 0; k < chunks; ++k) {
    if (lead) {
      runtime_(intra_, inter_);
      reduce_across(k);
    }
    if (k + 1 < chunks) reduce_within(k + 1);
    if (on_root_node) {
      if (lead) runtime_(inter_, intra_);
      hand_to_root(k);
    }
  }
  if (lead) runtime_(inter_, intra_); // ends on Intra's stream, before `part` is released there
  if constexpr (average) {
    if (at_root) runtime_.divide(intra_, out, count, size());
  }
}

} // namespace weft
