// The translation unit scripts/compile-time times: the umbrella header and one all_reduce on
// float. Plans are not templated on the element type, so this stays cheap to compile.
#include <weft/weft.hpp>

#include <vector>

int main() {
  weft::local::run(2, [](weft::local::communicator& c) {
    std::vector<float> grad(1024, 1.0f);
    weft::all_reduce(c, std::span(grad));
  });
}
