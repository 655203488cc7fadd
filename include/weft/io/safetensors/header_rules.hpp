#pragma once
// The rules a safetensors header obeys, as weft::safetensors checks them: the limits, UTF-8,
// the JSON parsed and written, each entry's size and place, and the tiling of the data buffer.
// Every failure names the file (`source`) and, where one is involved, the tensor.
#include <weft/core/config.hpp>
#include <weft/core/detail/json.hpp>
#include <weft/core/error.hpp>
#include <weft/io/safetensors/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace weft::detail::safetensors {

namespace st = weft::safetensors;

// Beyond the reference implementation's limit a length field is damage, not a header, and is
// refused before it sizes an allocation.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
// Bounds the staging memory a block of any size uses; large enough that a pwrite per chunk
// costs nothing beside the conversion.
inline constexpr std::size_t staging_bytes = std::size_t{8} << 20;

[[noreturn]] WEFT_COLD inline void fail(std::string_view source, const std::string& what) {
  throw error("safetensors: " + std::string(source) + ": " + what);
}
[[noreturn]] WEFT_COLD inline void fail(std::string_view source, std::string_view tensor,
                                        const std::string& what) {
  fail(source, "tensor '" + std::string(tensor) + "': " + what);
}

inline std::string range(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}
inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  return s + "]";
}

/// The index of the first byte of s that does not begin a well-formed UTF-8 sequence
/// (overlong forms, surrogates and code points past U+10FFFF are not), or npos.
[[nodiscard]] constexpr std::size_t invalid_utf8_at(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t more = 0;
    std::uint32_t cp = 0;
    std::uint32_t least = 0;
    if ((c & 0xe0) == 0xc0) {
      more = 1, cp = c & 0x1fu, least = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      more = 2, cp = c & 0x0fu, least = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      more = 3, cp = c & 0x07u, least = 0x10000;
    } else {
      return i;
    }
    if (i + more >= s.size()) return i;
    for (std::size_t k = 1; k <= more; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (b & 0x3fu);
    }
    if (cp < least || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += more + 1;
  }
  return std::string_view::npos;
}

/// Checked a * b and a + b: header numbers come from files that may be damaged.
inline bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return __builtin_mul_overflow(a, b, &out);
}
inline bool add_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return __builtin_add_overflow(a, b, &out);
}

// --- JSON --------------------------------------------------------------------------------------
// weft's one JSON reader, in RFC 8259's full grammar (UTF-8 names, \u escapes with surrogate
// pairs), with no bound on keys: a file holds thousands of tensors. Offsets and dimensions
// read its exact unsigned integers (the reference refuses 1.0 and 1e2 there too).
using weft::detail::json;

/// Parses the header JSON (checked for UTF-8 first); every error names the byte, and the
/// tensor whose entry holds it.
inline json parse_json(std::string_view text, std::string_view source) {
  // The schema nests three deep; the bound keeps a hostile header off the stack's end.
  static constexpr json_grammar grammar{.max_depth = 16};
  try {
    return weft::detail::parse_json(text, grammar);
  } catch (const json_parse_error& e) {
    if (e.duplicate_key && e.depth == 0) {
      fail(source, *e.duplicate_key == "__metadata__"
                       ? std::string("\"__metadata__\" appears twice")
                       : "tensor '" + *e.duplicate_key + "' appears twice in the header");
    }
    std::string where = "header JSON, byte " + std::to_string(e.at);
    if (!e.top_key.empty()) where += " (in the entry of '" + e.top_key + "')";
    fail(source, where + ": " + e.what);
  }
}

/// The header JSON a writer puts in the file, padded with spaces to a multiple of 8 bytes so
/// that the data buffer starts 8-aligned.
inline std::string encode(const st::header& h) {
  std::string s = "{";
  if (!h.metadata.empty()) {
    s += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : h.metadata) {
      s += (first ? "" : ",") + json_string(k) + ":" + json_string(v);
      first = false;
    }
    s += "}";
  }
  for (const st::tensor_info& t : h.tensors) {
    if (s.size() > 1) s += ",";
    s += json_string(t.name) + ":{\"dtype\":\"" + std::string(st::dtype_name(t.type)) +
         "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i)
      s += (i == 0 ? "" : ",") + std::to_string(t.shape[i]);
    s += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  s += "}";
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

// --- layout ------------------------------------------------------------------------------------

/// The bytes a tensor of this type and shape holds, refusing a count past 64 bits.
inline std::uint64_t tensor_bytes(st::dtype type, const std::vector<std::size_t>& shape,
                                  std::string_view source, std::string_view name) {
  std::uint64_t n = st::element_size(type);
  for (const std::size_t d : shape) {
    if (mul_overflows(n, d, n)) {
      fail(source, name,
           std::string(st::dtype_name(type)) + " " + shape_text(shape) +
               " holds more than 2^64 bytes");
    }
  }
  return n;
}

/// One entry against its own shape and the buffer: the size matches, and it lies inside.
inline void check_entry(const st::tensor_info& t, std::uint64_t buffer_bytes,
                        std::uint64_t file_size, std::string_view source) {
  if (t.end < t.begin)
    fail(source, t.name,
         "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] end before they begin");
  const std::uint64_t need = tensor_bytes(t.type, t.shape, source, t.name);
  if (t.end - t.begin != need) {
    fail(source, t.name,
         "data_offsets " + range(t.begin, t.end) + " hold " + std::to_string(t.end - t.begin) +
             " bytes, but " + std::string(st::dtype_name(t.type)) + " " + shape_text(t.shape) +
             " needs " + std::to_string(need));
  }
  if (t.end > buffer_bytes) {
    fail(source, t.name,
         "data_offsets " + range(t.begin, t.end) + " reach past the end of the " +
             std::to_string(buffer_bytes) + "-byte data buffer (the file is " +
             std::to_string(file_size) + " bytes: truncated, or the header is wrong)");
  }
}

/// Sorts tensors by offset and demands that they tile [0, buffer_bytes): each begins where the
/// one before ends. Zero-byte tensors may sit at any boundary.
inline void check_tiling(std::vector<st::tensor_info>& tensors, std::uint64_t buffer_bytes,
                         std::string_view source) {
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const st::tensor_info& a, const st::tensor_info& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  std::uint64_t at = 0;
  const st::tensor_info* last = nullptr; // the tensor that ends at `at`
  for (const st::tensor_info& t : tensors) {
    if (t.begin < at) {
      fail(source, t.name,
           "data_offsets " + range(t.begin, t.end) + " overlap tensor '" + last->name + "' " +
               range(last->begin, last->end));
    }
    if (t.begin > at) {
      fail(source,
           "bytes " + range(at, t.begin) + " of the data buffer, " +
               (last ? "between tensor '" + last->name + "' and " : std::string("before ")) +
               "tensor '" + t.name + "', belong to no tensor (a hole)");
    }
    if (t.end > t.begin || last == nullptr) last = &t;
    at = t.end;
  }
  if (at != buffer_bytes) {
    fail(source, "the data buffer holds " + std::to_string(buffer_bytes) +
                     " bytes, but the tensors end at byte " + std::to_string(at) + ": bytes " +
                     range(at, buffer_bytes) + " belong to no tensor (trailing bytes" +
                     (last ? " after tensor '" + last->name + "')" : ")"));
  }
}

inline std::uint64_t as_offset(const json& v, std::string_view source, std::string_view name,
                               std::string_view key) {
  if (v.type != json::kind::number || !v.uint_ok) {
    fail(source, name,
         "\"" + std::string(key) + "\" holds " + v.describe() + ", not an integer in [0, 2^64)");
  }
  return v.uint;
}

inline st::tensor_info decode_entry(const std::string& name, const json& v,
                                    std::string_view source) {
  if (v.type != json::kind::object)
    fail(source, name, "the entry is " + v.describe() + ", not an object");
  const json* fields[3] = {nullptr, nullptr, nullptr};
  static constexpr std::string_view keys[3] = {"dtype", "shape", "data_offsets"};
  for (std::size_t i = 0; i < v.keys.size(); ++i) {
    const std::string& k = v.keys[i];
    const json& item = v.values[i];
    const auto* pos = std::find(std::begin(keys), std::end(keys), k);
    if (pos == std::end(keys)) {
      fail(source, name,
           "unexpected key '" + k + "' (an entry holds \"dtype\", \"shape\" and \"data_offsets\")");
    }
    fields[pos - std::begin(keys)] = &item;
  }
  for (int i = 0; i < 3; ++i) {
    if (fields[i] == nullptr) fail(source, name, "missing key \"" + std::string(keys[i]) + "\"");
  }
  st::tensor_info t;
  t.name = name;
  if (fields[0]->type != json::kind::string) {
    fail(source, name, "\"dtype\" is " + fields[0]->describe() + ", not a string");
  }
  const std::optional<st::dtype> type = st::parse_dtype(fields[0]->str);
  if (!type) fail(source, name, "unknown dtype '" + fields[0]->str + "'");
  t.type = *type;
  if (fields[1]->type != json::kind::array) {
    fail(source, name, "\"shape\" is " + fields[1]->describe() + ", not an array");
  }
  for (const json& d : fields[1]->items)
    t.shape.push_back(as_offset(d, source, name, "shape"));
  const json& off = *fields[2];
  if (off.type != json::kind::array || off.items.size() != 2) {
    fail(source, name,
         "\"data_offsets\" is " +
             (off.type == json::kind::array ? "an array of " + std::to_string(off.items.size())
                                            : off.describe()) +
             ", not [begin, end]");
  }
  t.begin = as_offset(off.items[0], source, name, "data_offsets");
  t.end = as_offset(off.items[1], source, name, "data_offsets");
  return t;
}

} // namespace weft::detail::safetensors
