#pragma once
// weft's one JSON reader, for headers read from files that may be damaged (and that fuzzers
// feed it): a bounded recursive parser of RFC 8259 that builds a json tree or throws
// json_parse_error, which each reader wraps into a message of its own. json_grammar bounds
// the nesting and the keys of an object and, for checkpoint files, narrows escapes and
// numbers to the subset their reader has always accepted.
//
// json_string is the one quoting writers use.
//
// Numbers keep their text, a double, and whether they are an exact unsigned 64-bit integer
// (digits only), as sizes and offsets must be.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::detail {

struct json {
  enum class kind { null, boolean, number, string, array, object } type = kind::null;
  bool b = false;
  double num = 0;
  bool uint_ok = false; // a number written as digits only, within 64 bits
  std::uint64_t uint = 0;
  std::string str;               // a string's value, or a number as written
  std::vector<json> items;       // an array's elements
  std::vector<std::string> keys; // an object's keys in file order, and their values below (two
  std::vector<json> values;      // vectors: a pair of an incomplete json is not allowed)

  [[nodiscard]] const json* find(std::string_view key) const {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return &values[i];
    }
    return nullptr;
  }
  [[nodiscard]] std::string describe() const {
    switch (type) {
      case kind::null: return "null";
      case kind::boolean: return "a boolean";
      case kind::number: return "the number " + str;
      case kind::string: return "a string";
      case kind::array: return "an array";
      case kind::object: return "an object";
    }
    return "?";
  }
};

/// What a reader accepts: the bounds, and the checkpoint subset.
struct json_grammar {
  int max_depth = 16;       // keeps a hostile input off the stack's end
  std::size_t max_keys = 0; // per object; 0: no bound
  // Escapes only \" \\ \/ \n \t and \u below 0x80 (no \b \f \r, no code point past ASCII).
  bool ascii_escapes = false;
  // Numbers are a run of [0-9.eE+-] that strtod reads whole and within range (so 01, +1, .5
  // and 1. pass, 1e400 does not), not RFC 8259's grammar.
  bool strtod_numbers = false;
};

/// Why a parse stopped; the reader that called it phrases the message.
struct json_parse_error {
  std::size_t at = 0;                       // the byte offset reached
  std::string what;                         // the reason, e.g. "unexpected end"
  int depth = 0;                            // the object's nesting, for a key refused
  std::string top_key;                      // the top-level key whose value was being read
  std::optional<std::string> duplicate_key; // set where the reason is a repeated key
};

class json_parser {
public:
  json_parser(std::string_view text, const json_grammar& grammar) : s_(text), g_(grammar) {}

  json parse() {
    json v = value(0);
    skip_space();
    if (i_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

private:
  [[noreturn]] void fail(std::string what, int depth = 0,
                         std::optional<std::string> duplicate = {}) const {
    throw json_parse_error{i_, std::move(what), depth, top_key_, std::move(duplicate)};
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t'))
      ++i_;
  }
  char peek() {
    skip_space();
    if (i_ >= s_.size()) fail("unexpected end");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }

  json value(int depth) {
    if (depth > g_.max_depth) fail("nested too deeply");
    const char c = peek();
    json v;
    if (c == '{') {
      v.type = json::kind::object;
      ++i_;
      if (peek() == '}') {
        ++i_;
        return v;
      }
      std::set<std::string, std::less<>> seen;
      for (;;) {
        if (peek() != '"') fail("expected a key");
        std::string k = string();
        if (g_.max_keys != 0 && v.keys.size() >= g_.max_keys) {
          fail("more than " + std::to_string(g_.max_keys) + " keys in an object", depth);
        }
        if (!seen.insert(k).second) fail("key '" + k + "' appears twice", depth, k);
        expect(':');
        if (depth == 0) top_key_ = k;
        json item = value(depth + 1);
        if (depth == 0) top_key_.clear();
        v.keys.push_back(std::move(k));
        v.values.push_back(std::move(item));
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        return v;
      }
    }
    if (c == '[') {
      v.type = json::kind::array;
      ++i_;
      if (peek() == ']') {
        ++i_;
        return v;
      }
      for (;;) {
        v.items.push_back(value(depth + 1));
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return v;
      }
    }
    if (c == '"') {
      v.type = json::kind::string;
      v.str = string();
      return v;
    }
    if (literal("true")) {
      v.type = json::kind::boolean;
      v.b = true;
      return v;
    }
    if (literal("false")) {
      v.type = json::kind::boolean;
      return v;
    }
    if (literal("null")) return v;
    return number();
  }

  bool literal(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      const int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (d < 0) fail("bad hex digit in a \\u escape");
      cp = cp * 16 + static_cast<unsigned>(d);
    }
    return cp;
  }
  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  std::string string() {
    ++i_; // the opening quote
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c; // bytes past ASCII pass through; a reader that wants UTF-8 checks it first
        continue;
      }
      if (i_ >= s_.size()) fail("unexpected end in an escape");
      const char e = s_[i_++];
      if (g_.ascii_escapes && (e == 'b' || e == 'f' || e == 'r')) fail("unknown escape");
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (g_.ascii_escapes && cp >= 0x80) fail("\\u escape beyond ASCII");
          if (cp >= 0xdc00 && cp <= 0xdfff) fail("lone low surrogate in a \\u escape");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (!literal("\\u")) fail("lone high surrogate in a \\u escape");
            const std::uint32_t low = hex4();
            if (low < 0xdc00 || low > 0xdfff)
              fail("high surrogate without a low one in a \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("unknown escape");
      }
    }
  }

  // Scans a number's text by the grammar in use, then converts it once.
  json number() {
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t from = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9')
        ++i_;
      return i_ - from;
    };
    if (g_.strtod_numbers) {
      if (i_ < s_.size() && s_[i_] == '-') ++i_;
      bool any_digit = false;
      while (i_ < s_.size() && ((s_[i_] >= '0' && s_[i_] <= '9') || s_[i_] == '.' ||
                                s_[i_] == 'e' || s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) {
        any_digit = any_digit || (s_[i_] >= '0' && s_[i_] <= '9');
        ++i_;
      }
      if (!any_digit) fail("expected a value");
    } else {
      if (s_[i_] != '-' && (s_[i_] < '0' || s_[i_] > '9')) fail("expected a value");
      if (s_[i_] == '-') ++i_;
      const std::size_t int_start = i_;
      const std::size_t int_digits = digits();
      if (int_digits == 0) fail("expected a digit");
      if (int_digits > 1 && s_[int_start] == '0') fail("leading zero in a number");
      if (i_ < s_.size() && s_[i_] == '.') {
        ++i_;
        if (digits() == 0) fail("expected a digit after '.'");
      }
      if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
        ++i_;
        if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
        if (digits() == 0) fail("expected a digit in the exponent");
      }
    }
    json v;
    v.type = json::kind::number;
    v.str = std::string(s_.substr(start, i_ - start));
    errno = 0;
    char* end = nullptr;
    v.num = std::strtod(v.str.c_str(), &end);
    const bool whole = end == v.str.c_str() + v.str.size() && errno != ERANGE;
    if (g_.strtod_numbers && !whole) fail("bad number '" + v.str + "'");
    v.uint_ok = !v.str.empty();
    for (const char d : v.str) {
      v.uint_ok = v.uint_ok && d >= '0' && d <= '9' &&
                  !__builtin_mul_overflow(v.uint, 10, &v.uint) &&
                  !__builtin_add_overflow(v.uint, static_cast<std::uint64_t>(d - '0'), &v.uint);
    }
    if (!v.uint_ok) v.uint = 0;
    return v;
  }

  std::string_view s_;
  json_grammar g_;
  std::string top_key_; // the top-level key whose value is being read, for messages
  std::size_t i_ = 0;
};

/// Parses text whole (nothing but white space after the value) or throws json_parse_error.
[[nodiscard]] inline json parse_json(std::string_view text, const json_grammar& grammar) {
  return json_parser(text, grammar).parse();
}

/// s as a JSON string: '"', '\\' and control characters escaped, every other byte as it is
/// (a writer that promises ASCII or UTF-8 checks s first).
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

} // namespace weft::detail
