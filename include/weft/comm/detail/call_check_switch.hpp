#pragma once
// Whether a collective call is checked against the other ranks' (call_check.hpp): a switch
// for the whole process, read first from the WEFT_CHECK_CALLS environment variable, and a
// communicator's own setting.
#include <atomic>
#include <concepts>
#include <cstdlib>
#include <string_view>

namespace weft::detail {

inline std::atomic<bool>& check_calls_flag() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("WEFT_CHECK_CALLS");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return on;
}

inline bool check_calls_enabled() { return check_calls_flag().load(std::memory_order_relaxed); }

/// Whether a call on comm is checked: for every communicator when the process-wide switch is
/// on, and for a communicator that asks for it (local::options::check_calls,
/// communicator::set_check_calls, weft::checked_calls).
template <class Comm>
bool check_calls_enabled(const Comm& comm) {
  if (check_calls_enabled()) return true;
  if constexpr (requires {
                  { comm.check_calls() } -> std::convertible_to<bool>;
                }) {
    return static_cast<bool>(comm.check_calls());
  } else {
    return false;
  }
}

} // namespace weft::detail

namespace weft {

/// Turns the call check on or off for the whole process (default: the WEFT_CHECK_CALLS
/// environment variable, on when set and not "0"). When on, before every collective the
/// ranks compare the operation, algorithm, count, element type, operator and root, and a
/// mismatch is a weft::error on every rank, raised before any data moves.
inline void check_calls(bool on) { detail::check_calls_flag().store(on); }

} // namespace weft
