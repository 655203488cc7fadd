#pragma once
// The deadline of a transport's wait, and the check on the timeouts users set. A deadline
// saturates: a timeout too long for the clock (std::chrono::milliseconds::max(), the natural
// way to ask for none) waits forever instead of overflowing into the past and failing every
// wait at once. A timeout of zero or less is a weft::error where it is set.
#include <weft/core/error.hpp>

#include <chrono>
#include <string>
#include <string_view>

namespace weft::detail {

[[nodiscard]] inline std::chrono::steady_clock::time_point deadline_after(
    std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  const auto now = clock::now();
  if (timeout >=
      std::chrono::duration_cast<std::chrono::milliseconds>(clock::time_point::max() - now)) {
    return clock::time_point::max();
  }
  return now + timeout;
}

/// t, if it is a usable timeout; `who` names the setting in the error.
[[nodiscard]] inline std::chrono::milliseconds checked_timeout(std::chrono::milliseconds t,
                                                               std::string_view who) {
  if (t.count() <= 0) {
    throw error(std::string(who) + ": the timeout must be positive, not " +
                std::to_string(t.count()) +
                " ms (std::chrono::milliseconds::max() waits as long as it takes)");
  }
  return t;
}

} // namespace weft::detail
