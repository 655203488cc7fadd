// halving_doubling does not plan broadcast; the note lists those that do, hierarchical ones too
// (GCC and Clang spell hierarchical<ring, ring> differently: Clang drops default arguments).
// expected error: weft: this algorithm does not plan this collective
// expected error: weft::algo::algorithms<weft::algo::direct, weft::algo::ring, weft::algo::tree,
//   weft::algo::hierarchical<
// expected error: weft::algo::hierarchical<weft::algo::ring, weft::algo::tree>,
//   weft::algo::automatic, weft::algo::vendor>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/transport/local.hpp>

#include <span>

void call(weft::local::communicator& c, std::span<float> data) {
  weft::broadcast<weft::algo::halving_doubling>(c, data, 0);
}
