#pragma once
// all_to_all: input and output hold size() blocks; block s of rank r's output is block r of
// rank s's input.
#include <weft/comm/detail/dispatch.hpp>

#include <span>
#include <type_traits>

namespace weft {

template <class Algo = algo::automatic, communicator Comm, class In, element T>
requires std::same_as<std::remove_const_t<In>, T>
void all_to_all(Comm& comm, std::span<In> in, std::span<T> out) {
  const auto p = static_cast<std::size_t>(comm.size());
  if (in.size() != out.size() || in.size() % p != 0) {
    throw error(
        "all_to_all", comm.rank(), error::unknown,
        "input and output must hold the same number of elements, a multiple of size(): input " +
            std::to_string(in.size()) + ", output " + std::to_string(out.size()) + ", ranks " +
            std::to_string(p));
  }
  if (detail::overlap(in.data(), in.size_bytes(), out.data(), out.size_bytes())) {
    throw error("all_to_all", comm.rank(), error::unknown, "input and output overlap");
  }
  detail::run_collective<collective::all_to_all, Algo>(comm, in.data(), in.size(), out.data(),
                                                       out.size(), in.size() / p, 0, op::sum{});
}

} // namespace weft
