// tree plans all_reduce, broadcast and reduce only; the note lists those that plan all_to_all.
// expected error: weft: this algorithm does not plan this collective
// expected error: weft::algo::algorithms<weft::algo::direct, weft::algo::pairwise,
//   weft::algo::automatic, weft::algo::vendor>
#include <weft/comm/all_to_all.hpp>
#include <weft/comm/transport/local.hpp>

#include <span>

void call(weft::local::communicator& c, std::span<const float> in, std::span<float> out) {
  weft::all_to_all<weft::algo::tree>(c, in, out);
}
