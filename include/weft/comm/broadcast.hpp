#pragma once
// broadcast: every rank's data becomes the root's.
#include <weft/comm/detail/dispatch.hpp>

#include <span>

namespace weft {

template <class Algo = algo::automatic, communicator Comm, element T>
void broadcast(Comm& comm, std::span<T> data, int root) {
  detail::run_collective<collective::broadcast, Algo>(comm, data.data(), data.size(), data.data(),
                                                      data.size(), data.size(), root, op::sum{});
}

} // namespace weft
