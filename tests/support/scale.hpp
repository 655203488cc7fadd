#pragma once
// Sanitizer builds (WEFT_TEST_SANITIZED, set by CMake with WEFT_SANITIZE) run the same tests
// over smaller sweeps: ThreadSanitizer slows this code about 40-fold, and what it looks
// for (races between ranks) shows on small sweeps as well as on large ones.
#include <cstddef>

namespace weft::test {

#if defined(WEFT_TEST_SANITIZED)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif

/// n in a plain build; a sixty-fourth of it (at least `floor`) under a sanitizer.
constexpr std::size_t scaled(std::size_t n, std::size_t floor = 64) {
  if (!sanitized) return n;
  return n / 64 > floor ? n / 64 : (n < floor ? n : floor);
}

} // namespace weft::test
