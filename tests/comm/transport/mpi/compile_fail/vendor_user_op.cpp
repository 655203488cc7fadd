// A user functor has no MPI_Op: algo::vendor on weft::mpi must not compile with it.
// expected error: weft: algo::vendor forwards to the transport's own collective library, and this
//   communicator has none for this element type and operator
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/transport/mpi.hpp>

#include <span>

struct larger {
  template <class A>
  constexpr A operator()(A a, A b) const {
    return a < b ? b : a;
  }
};

void call(weft::mpi::communicator& c, std::span<float> data) {
  weft::all_reduce<weft::algo::vendor>(c, data, larger{});
}
