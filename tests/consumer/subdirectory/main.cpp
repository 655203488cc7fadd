// Uses weft from outside its tree: the headers resolve through the weft::weft target alone
// (which also asks for C++20; this project does not), and weft::error composes its message
// as documented.
#include <weft/core/error.hpp> // the weft headers under test: <weft/weft.hpp> once it exists
#include <weft/core/types.hpp>

#include <cstdio>
#include <exception>
#include <string>

int main() {
  static_assert(weft::size_of(weft::dtype::bfloat16) == 2);
  const std::string expected = "weft: all_reduce on rank 3 (peer 4): timed out";
  try {
    throw weft::error("all_reduce", 3, 4, "timed out");
  } catch (const std::exception& e) {
    if (e.what() == expected) {
      return 0;
    }
    std::fprintf(stderr, "weft::error says \"%s\", expected \"%s\"\n", e.what(), expected.c_str());
  }
  return 1;
}
