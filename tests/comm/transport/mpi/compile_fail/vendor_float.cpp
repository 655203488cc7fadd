// The control: algo::vendor on weft::mpi compiles for MPI's types and operators, and automatic
// beside it for half (weft's plans).
// expected: compiles
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/transport/mpi.hpp>

#include <cstdint>
#include <span>

void call(weft::mpi::communicator& c, std::span<float> f, std::span<double> d,
          std::span<std::int32_t> i, std::span<std::int64_t> l, std::span<weft::half> h) {
  weft::all_reduce<weft::algo::vendor>(c, f);
  weft::all_reduce<weft::algo::vendor>(c, d, weft::op::avg{});
  weft::all_reduce<weft::algo::vendor>(c, i, weft::op::max{});
  weft::all_reduce<weft::algo::vendor>(c, l, weft::op::prod{});
  weft::all_reduce(c, h);
}
