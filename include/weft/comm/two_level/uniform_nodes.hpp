#pragma once
// two_level on uniform nodes (every node holds L ranks): the paths that make each level one
// reduce_scatter or all_gather call per chunk where the levels' algorithms plan them
// (comm/two_level/communicator.hpp describes the protocol).
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/reduce.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/comm/two_level/communicator.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace weft {

template <communicator Intra, communicator Inter, class Runtime>
template <class IA, class OA, class T, class Op>
void two_level<Intra, Inter, Runtime>::all_reduce_uniform(const T* in, T* out, std::size_t count,
                                                          const Op& op) {
  const detail::summing_t<Op> sop(op);
  const auto across = [&](std::span<T> block) {
    weft::all_reduce<OA>(inter_, block, sop);
    if constexpr (is_average_v<Op>) runtime_.divide(inter_, block.data(), block.size(), size());
  };
  reduce_by_blocks<IA>(in, count, sop, across, [&](std::size_t first) { return out + first; });
}

template <communicator Intra, communicator Inter, class Runtime>
template <class IA, class OA, class T, class Op>
void two_level<Intra, Inter, Runtime>::reduce_uniform(const T* in, T* out, std::size_t count,
                                                      int root, const Op& op) {
  const int root_node = layout_.node[to_size(root)];
  const bool on_root_node = color_ == root_node;
  const bool at_root = rank_ == root;
  const detail::summing_t<Op> sop(op);
  auto sink = runtime_.template scratch<T>(
      intra_, on_root_node && !at_root ? std::min(count, uniform_chunk<T>()) : 0);
  const auto across = [&](std::span<T> block) { // in place on the root's node
    weft::reduce<OA>(inter_, std::span<const T>(block),
                     block.first(on_root_node ? block.size() : 0), root_node, sop);
  };
  reduce_by_blocks<IA>(in, count, sop, across, [&](std::size_t first) -> T* {
    return !on_root_node ? nullptr : at_root ? out + first : sink.data();
  });
  if constexpr (is_average_v<Op>) {
    if (at_root) runtime_.divide(intra_, out, count, size());
  }
}

template <communicator Intra, communicator Inter, class Runtime>
template <class IA, class T, class Op, class Across, class Into>
void two_level<Intra, Inter, Runtime>::reduce_by_blocks(const T* in, std::size_t count,
                                                        const Op& sop, const Across& across,
                                                        const Into& into) {
  if (count == 0) return;
  const auto L = to_size(layout_.min_ranks_per_node());
  const std::size_t chunk = uniform_chunk<T>();
  const std::size_t chunks = chunk_count(count, chunk);
  auto part = runtime_.template scratch<T>(intra_, count / L);
  const auto block = [&](std::size_t k) {
    return std::span<T>(part.data() + k * (chunk / L), chunk_span(k, chunk, count).second / L);
  };
  const auto reduce_chunk = [&](std::size_t k) {
    const auto [first, len] = chunk_span(k, chunk, count);
    weft::reduce_scatter<IA>(intra_, std::span<const T>(in + first, len), block(k), sop);
  };
  reduce_chunk(0);
  runtime_(intra_, inter_);
  for (std::size_t k = 0; k < chunks; ++k) {
    across(block(k));
    if (k + 1 < chunks) {
      reduce_chunk(k + 1);
      runtime_(intra_,
               inter_); // Inter's next chunk waits for this reduce, not for the gather below
    }
    const auto [first, len] = chunk_span(k, chunk, count);
    if (T* const dst = into(first)) {
      runtime_(inter_, intra_);
      weft::all_gather<IA>(intra_, std::span<const T>(block(k)), std::span<T>(dst, len));
    }
  }
  runtime_(inter_, intra_); // ends on Intra's stream, before the scratch is released there
}

template <communicator Intra, communicator Inter, class Runtime>
template <class IA, class OA, class T>
void two_level<Intra, Inter, Runtime>::broadcast_uniform(T* data, std::size_t count, int root) {
  if (count == 0) return;
  const auto L = to_size(layout_.min_ranks_per_node());
  const int root_node = layout_.node[to_size(root)];
  const std::size_t chunk = uniform_chunk<T>();
  const std::size_t chunks = chunk_count(count, chunk);
  if (color_ == root_node) {
    const int root_local = layout_.local[to_size(root)];
    const auto whole = [&](std::size_t k) {
      const auto [first, len] = chunk_span(k, chunk, count);
      weft::broadcast<IA>(intra_, std::span<T>(data + first, len), root_local);
    };
    whole(0);
    for (std::size_t k = 0; k < chunks; ++k) {
      runtime_(intra_, inter_); // chunk k is here
      const auto [first, len] = chunk_span(k, chunk, count);
      weft::broadcast<OA>(inter_, std::span<T>(data + first + to_size(local_) * (len / L), len / L),
                          root_node);
      if (k + 1 < chunks) whole(k + 1);
    }
  } else {
    auto part = runtime_.template scratch<T>(intra_, count / L);
    runtime_(intra_, inter_); // the caller's earlier work on the buffer, and the scratch
    for (std::size_t k = 0; k < chunks; ++k) {
      const auto [first, len] = chunk_span(k, chunk, count);
      const std::span<T> block(part.data() + k * (chunk / L), len / L);
      weft::broadcast<OA>(inter_, block, root_node);
      runtime_(inter_, intra_);
      weft::all_gather<IA>(intra_, std::span<const T>(block), std::span<T>(data + first, len));
    }
  }
  runtime_(inter_, intra_); // the call ends on Intra's stream, after the scratch's last use
}

template <communicator Intra, communicator Inter, class Runtime>
template <class IA, class OA, class T, class Op>
void two_level<Intra, Inter, Runtime>::reduce_scatter_uniform(const T* in, T* out, std::size_t n,
                                                              const Op& op) {
  const auto p = to_size(size());
  const auto N = to_size(layout_.nodes());
  const detail::summing_t<Op> sop(op);
  auto major = runtime_.template scratch<T>(intra_, p * n);
  reorder(major.data(), in, n, order::local_major);
  auto sums = runtime_.template scratch<T>(intra_, N * n);
  weft::reduce_scatter<IA>(intra_, std::span<const T>(major.data(), p * n),
                           std::span<T>(sums.data(), N * n), sop);
  runtime_(intra_, inter_);
  weft::reduce_scatter<OA>(inter_, std::span<const T>(sums.data(), N * n), std::span<T>(out, n),
                           sop);
  runtime_(inter_, intra_); // ends on Intra's stream, before the scratch is released there
  if constexpr (is_average_v<Op>) runtime_.divide(intra_, out, n, size());
}

template <communicator Intra, communicator Inter, class Runtime>
template <class IA, class OA, class T>
void two_level<Intra, Inter, Runtime>::all_gather_uniform(const T* in, T* out, std::size_t n) {
  const auto p = to_size(size());
  const auto N = to_size(layout_.nodes());
  auto mine = runtime_.template scratch<T>(intra_, N * n);
  auto major = runtime_.template scratch<T>(intra_, p * n);
  runtime_(intra_, inter_); // the caller's work on `in`
  weft::all_gather<OA>(inter_, std::span<const T>(in, n), std::span<T>(mine.data(), N * n));
  runtime_(inter_, intra_);
  weft::all_gather<IA>(intra_, std::span<const T>(mine.data(), N * n),
                       std::span<T>(major.data(), p * n));
  reorder(out, major.data(), n, order::rank);
}

template <communicator Intra, communicator Inter, class Runtime>
template <class T>
void two_level<Intra, Inter, Runtime>::reorder(T* dst, const T* src, std::size_t n, order to) {
  const auto N = to_size(layout_.nodes());
  if (contiguous_) {
    const auto L = to_size(layout_.min_ranks_per_node());
    for (std::size_t l = 0; l < L; ++l) {
      if (to == order::local_major) {
        runtime_.copy_rows(intra_, dst + l * N * n, n, src + l * n, L * n, n, N);
      } else {
        runtime_.copy_rows(intra_, dst + l * n, L * n, src + l * N * n, n, n, N);
      }
    }
    return;
  }
  for (std::size_t r = 0; r < to_size(size()); ++r) {
    const std::size_t major = local_major(r) * n;
    const std::size_t ranked = r * n;
    if (to == order::local_major) {
      runtime_.copy(intra_, dst + major, src + ranked, n);
    } else {
      runtime_.copy(intra_, dst + ranked, src + major, n);
    }
  }
}

} // namespace weft
