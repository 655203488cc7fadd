#pragma once
// all_gather: block r of every rank's output is rank r's input.
#include <weft/comm/detail/dispatch.hpp>

#include <span>
#include <type_traits>

namespace weft {

namespace detail {

/// out holds ranks x in's elements and does not overlap in.
template <class In, class T>
void check_all_gather_buffers(int rank, int ranks, std::span<In> in, std::span<T> out) {
  const auto p = static_cast<std::size_t>(ranks);
  if (out.size() != in.size() * p) {
    throw error("all_gather", rank, error::unknown,
                "output must hold size() x input elements: input has " + std::to_string(in.size()) +
                    ", output " + std::to_string(out.size()) + ", ranks " + std::to_string(p));
  }
  if (overlap(in.data(), in.size_bytes(), out.data(), out.size_bytes())) {
    throw error("all_gather", rank, error::unknown, "input and output overlap");
  }
}

} // namespace detail

template <class Algo = algo::automatic, communicator Comm, class In, element T>
requires std::same_as<std::remove_const_t<In>, T>
void all_gather(Comm& comm, std::span<In> in, std::span<T> out) {
  detail::check_all_gather_buffers(comm.rank(), comm.size(), in, out);
  detail::run_collective<collective::all_gather, Algo>(comm, in.data(), in.size(), out.data(),
                                                       out.size(), in.size(), 0, op::sum{});
}

} // namespace weft
