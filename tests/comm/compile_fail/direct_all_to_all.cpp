// The control: direct plans every collective and weft::local lends it peer access.
// expected: compiles
#include <weft/comm/all_to_all.hpp>
#include <weft/comm/transport/local.hpp>

#include <span>

void call(weft::local::communicator& c, std::span<const float> in, std::span<float> out) {
  weft::all_to_all<weft::algo::direct>(c, in, out);
}
