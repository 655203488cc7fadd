#pragma once
// all_reduce: every rank ends with the reduction over all ranks of their inputs.
//   // automatic, sum, in place
//   weft::all_reduce(comm, std::span(grad));
//   weft::all_reduce<weft::algo::ring>(comm, std::span(grad), weft::op::max{});
//   weft::all_reduce(comm, std::span<const float>(in), std::span(out));   // out of place
#include <weft/comm/detail/dispatch.hpp>

#include <span>
#include <type_traits>

namespace weft {

namespace detail {

/// An out-of-place all-reduce's buffers: the same size, and one buffer or apart.
template <class In, class T>
void check_all_reduce_buffers(int rank, std::span<In> in, std::span<T> out) {
  if (in.size() != out.size()) {
    throw error("all_reduce", rank, error::unknown,
                "input has " + std::to_string(in.size()) + " elements but output has " +
                    std::to_string(out.size()));
  }
  if (in.data() != out.data() &&
      overlap(in.data(), in.size_bytes(), out.data(), out.size_bytes())) {
    throw error("all_reduce", rank, error::unknown,
                "input and output overlap without being the same buffer (in place: pass one span)");
  }
}

} // namespace detail

template <class Algo = algo::automatic, communicator Comm, element T, class Op = op::sum>
requires reduction_for<Op, T>
void all_reduce(Comm& comm, std::span<T> inout, Op op = {}) {
  detail::run_collective<collective::all_reduce, Algo>(
      comm, inout.data(), inout.size(), inout.data(), inout.size(), inout.size(), 0, op);
}

template <class Algo = algo::automatic, communicator Comm, class In, element T, class Op = op::sum>
requires std::same_as<std::remove_const_t<In>, T> && reduction_for<Op, T>
void all_reduce(Comm& comm, std::span<In> in, std::span<T> out, Op op = {}) {
  detail::check_all_reduce_buffers(comm.rank(), in, out);
  detail::run_collective<collective::all_reduce, Algo>(comm, in.data(), in.size(), out.data(),
                                                       out.size(), in.size(), 0, op);
}

} // namespace weft
