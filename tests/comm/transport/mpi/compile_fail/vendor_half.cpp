// MPI has no reduction for half: algo::vendor on weft::mpi must not compile with it, and says
// which types and operators it has.
// expected error: weft: algo::vendor forwards to the transport's own collective library, and this
//   communicator has none for this element type and operator
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/transport/mpi.hpp>

#include <span>

void call(weft::mpi::communicator& c, std::span<weft::half> data) {
  weft::all_reduce<weft::algo::vendor>(c, data);
}
