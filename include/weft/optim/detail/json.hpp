#pragma once
// JSON for checkpoint files: the header and index reader (weft's one JSON parser, narrowed to
// the subset checkpoint files have always used: \" \\ \/ \n \t and \u below 0x80, numbers as
// strtod reads them, 32 levels, 64 keys an object), and the quoting their writers use.
#include <weft/core/detail/json.hpp>
#include <weft/core/error.hpp>

#include <string>
#include <string_view>

namespace weft::detail {

/// Parses a checkpoint header or index; throws weft::error "checkpoint: <source>: malformed
/// header at byte N: <why>" on anything outside the subset.
[[nodiscard]] inline json parse_checkpoint_json(std::string_view text, std::string_view source) {
  // Checkpoint objects have a handful of keys; the bound caps what a damaged file costs.
  static constexpr json_grammar grammar{
      .max_depth = 32, .max_keys = 64, .ascii_escapes = true, .strtod_numbers = true};
  try {
    return parse_json(text, grammar);
  } catch (const json_parse_error& e) {
    throw error("checkpoint: " + std::string(source) + ": malformed header at byte " +
                std::to_string(e.at) + ": " +
                (e.duplicate_key ? std::string("duplicate key") : e.what));
  }
}

/// Quotes s as a JSON string; checkpoint names must be ASCII (names are written by weft, but
/// may hold any characters).
inline std::string json_quote(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      throw error("checkpoint: tensor names must be ASCII: '" + std::string(s) + "'");
    }
  }
  return json_string(s);
}

} // namespace weft::detail
