#pragma once
// reduce_scatter: input holds size() blocks of out.size() elements; rank r ends with the
// reduction over all ranks of their block r.
#include <weft/comm/detail/dispatch.hpp>

#include <span>
#include <type_traits>

namespace weft {

namespace detail {

/// in holds ranks x out's elements and does not overlap out.
template <class In, class T>
void check_reduce_scatter_buffers(int rank, int ranks, std::span<In> in, std::span<T> out) {
  const auto p = static_cast<std::size_t>(ranks);
  if (in.size() != out.size() * p) {
    throw error("reduce_scatter", rank, error::unknown,
                "input must hold size() x output elements: input has " + std::to_string(in.size()) +
                    ", output " + std::to_string(out.size()) + ", ranks " + std::to_string(p));
  }
  if (overlap(in.data(), in.size_bytes(), out.data(), out.size_bytes())) {
    throw error("reduce_scatter", rank, error::unknown, "input and output overlap");
  }
}

} // namespace detail

template <class Algo = algo::automatic, communicator Comm, class In, element T, class Op = op::sum>
requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void reduce_scatter(Comm& comm, std::span<In> in, std::span<T> out, Op op = {}) {
  detail::check_reduce_scatter_buffers(comm.rank(), comm.size(), in, out);
  detail::run_collective<collective::reduce_scatter, Algo>(comm, in.data(), in.size(), out.data(),
                                                           out.size(), out.size(), 0, op);
}

} // namespace weft
