#pragma once
// FNV-1a, 64 bits: the one hash weft writes into files (a checkpoint's per-tensor checksum)
// and exchanges between ranks (a call's signature, a measured table's digest). Not a
// cryptographic hash: it tells accidental differences apart, the same in every process.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace weft::detail {

[[nodiscard]] inline std::uint64_t fnv1a(std::span<const std::byte> data) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (const std::byte b : data)
    h = (h ^ static_cast<std::uint64_t>(b)) * 1099511628211ull;
  return h;
}

[[nodiscard]] inline std::uint64_t fnv1a(std::string_view s) noexcept {
  return fnv1a(std::as_bytes(std::span(s.data(), s.size())));
}

} // namespace weft::detail
