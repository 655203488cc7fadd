#pragma once
// barrier: returns on each rank once every rank of the communicator has entered it.
#include <weft/comm/communicator.hpp>

namespace weft {

template <communicator Comm>
void barrier(Comm& comm) {
  comm.barrier();
}

} // namespace weft
