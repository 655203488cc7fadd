#pragma once
// reduce: the root's output becomes the reduction over all ranks of their inputs. Other
// ranks' output is not touched and may be empty.
#include <weft/comm/detail/dispatch.hpp>

#include <span>
#include <type_traits>

namespace weft {

namespace detail {

/// The root's output holds as many elements as the input and is the input or apart from it.
template <class In, class T>
void check_reduce_buffers(int rank, bool at_root, std::span<In> in, std::span<T> out) {
  if (!at_root) return;
  if (out.size() != in.size()) {
    throw error("reduce", rank, error::unknown,
                "the root's output must hold as many elements as the input: input " +
                    std::to_string(in.size()) + ", output " + std::to_string(out.size()));
  }
  if (in.data() != out.data() &&
      overlap(in.data(), in.size_bytes(), out.data(), out.size_bytes())) {
    throw error("reduce", rank, error::unknown,
                "input and output overlap without being the same buffer");
  }
}

} // namespace detail

template <class Algo = algo::automatic, communicator Comm, class In, element T, class Op = op::sum>
requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void reduce(Comm& comm, std::span<In> in, std::span<T> out, int root, Op op = {}) {
  const bool at_root = comm.rank() == root;
  detail::check_reduce_buffers(comm.rank(), at_root, in, out);
  detail::run_collective<collective::reduce, Algo>(comm, in.data(), in.size(), out.data(),
                                                   at_root ? out.size() : 0, in.size(), root, op);
}

} // namespace weft
