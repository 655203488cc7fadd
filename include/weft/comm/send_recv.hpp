#pragma once
// Point to point: typed spans with a tag. Messages between two ranks arrive in order; the
// receiver must expect the size, type and tag that was sent (a mismatch is a weft::error).
#include <weft/comm/communicator.hpp>
#include <weft/core/types.hpp>

#include <span>

namespace weft {

template <communicator Comm, element T>
void send(Comm& comm, std::span<const T> data, int peer, int tag = 0) {
  comm.send(data, peer, tag);
}
template <communicator Comm, element T>
void send(Comm& comm, std::span<T> data, int peer, int tag = 0) {
  comm.send(std::span<const T>(data), peer, tag);
}
template <communicator Comm, element T>
void recv(Comm& comm, std::span<T> data, int peer, int tag = 0) {
  comm.recv(data, peer, tag);
}

} // namespace weft
