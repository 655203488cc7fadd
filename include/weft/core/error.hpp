#pragma once
// weft::error: the one exception type the library throws. Its message names the operation,
// the rank and the peer where they are known, so a failure on rank 5 of 64 says where it is.
#include <weft/core/config.hpp>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace weft {

class error : public std::runtime_error {
public:
  static constexpr int unknown = -1;

  // Out of line and cold: errors are rare, and the many places that throw one should not
  // each carry (and each translation unit compile) a copy of the message building.
  WEFT_COLD explicit error(const std::string& what) : std::runtime_error(what) {}

  WEFT_COLD error(std::string_view operation, int rank, int peer, std::string_view what)
      : std::runtime_error(compose(operation, rank, peer, what)),
        operation_(operation),
        rank_(rank),
        peer_(peer) {}

  [[nodiscard]] const std::string& operation() const noexcept { return operation_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int peer() const noexcept { return peer_; }

private:
  WEFT_COLD static std::string compose(std::string_view operation, int rank, int peer,
                                       std::string_view what) {
    std::string s = "weft: ";
    if (!operation.empty()) {
      s += operation;
    }
    if (rank != unknown) {
      s += (operation.empty() ? "rank " : " on rank ") + std::to_string(rank);
    }
    if (peer != unknown) {
      s += " (peer " + std::to_string(peer) + ")";
    }
    if (!operation.empty() || rank != unknown || peer != unknown) {
      s += ": ";
    }
    s += what;
    return s;
  }

  std::string operation_;
  int rank_ = unknown;
  int peer_ = unknown;
};

} // namespace weft

// Precondition check: throws weft::error naming the failed condition and the caller's words.
#define WEFT_EXPECTS(cond, what)                                                                   \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      throw ::weft::error(std::string("weft: ") + (what) +                                         \
                          " [expected " #cond " at " __FILE__ ":" + std::to_string(__LINE__) +     \
                          "]");                                                                    \
    }                                                                                              \
  } while (false)
