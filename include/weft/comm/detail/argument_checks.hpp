#pragma once
// Checks of a collective's arguments that every operation shares.
#include <weft/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace weft::detail {

inline bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

template <class Comm>
void check_root(const Comm& comm, int root, std::string_view opname) {
  if (root < 0 || root >= comm.size()) {
    throw error(opname, comm.rank(), error::unknown,
                "root " + std::to_string(root) + " outside the communicator of " +
                    std::to_string(comm.size()) + " ranks");
  }
}

} // namespace weft::detail
