#pragma once
// The small JSON subset checkpoint headers use: objects, arrays, strings (escapes \" \\ \/
// \n \t \uXXXX below 0x80), integers and decimals, true/false/null. A bounded recursive
// parser that throws on anything else (checkpoint headers come from files that may be
// damaged, and a fuzzer will call it).
#include <weft/core/error.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::detail {

struct json {
  enum class kind { null, boolean, number, string, array, object } type = kind::null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<json> items;          // an array's elements
  std::vector<std::string> keys;    // an object's keys, and their values below (vectors: allowed
  std::vector<json> values;         // while json is still incomplete)

  [[nodiscard]] const json* find(std::string_view key) const {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] == key) return &values[i];
    }
    return nullptr;
  }
};

class json_parser {
public:
  json_parser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  json parse() {
    json v = value(0);
    skip_space();
    if (i_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

private:
  static constexpr int max_depth = 32;
  static constexpr std::size_t max_keys = 64;  // checkpoint objects have a handful; bounds the duplicate check

  [[noreturn]] void fail(const std::string& what) const {
    throw error("checkpoint: " + std::string(source_) + ": malformed header at byte " + std::to_string(i_) + ": " +
                what);
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
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
    if (depth > max_depth) fail("nested too deeply");
    const char c = peek();
    json v;
    if (c == '{') {
      v.type = json::kind::object;
      ++i_;
      if (peek() == '}') {
        ++i_;
        return v;
      }
      for (;;) {
        if (peek() != '"') fail("expected a key");
        std::string k = string();
        expect(':');
        json item = value(depth + 1);
        if (v.keys.size() >= max_keys) fail("more than " + std::to_string(max_keys) + " keys in an object");
        if (v.find(k) != nullptr) fail("duplicate key");
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
    v.type = json::kind::number;
    v.num = number();
    return v;
  }
  bool literal(std::string_view w) {
    if (s_.substr(i_, w.size()) == w) {
      i_ += w.size();
      return true;
    }
    return false;
  }
  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c == '\\') {
        if (i_ >= s_.size()) fail("unexpected end in an escape");
        const char e = s_[i_++];
        switch (e) {
          case '"': c = '"'; break;
          case '\\': c = '\\'; break;
          case '/': c = '/'; break;
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'u': {
            if (i_ + 4 > s_.size()) fail("short \\u escape");
            unsigned cp = 0;
            for (int k = 0; k < 4; ++k) {
              const char h = s_[i_++];
              cp = cp * 16 + static_cast<unsigned>(h >= '0' && h <= '9'   ? h - '0'
                                                   : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                   : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                                          : (fail("bad hex digit"), 0));
            }
            if (cp >= 0x80) fail("\\u escape beyond ASCII");
            c = static_cast<char>(cp);
            break;
          }
          default: fail("unknown escape");
        }
      }
      out += c;
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }
  double number() {
    const std::size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    bool digits = false;
    while (i_ < s_.size() && ((s_[i_] >= '0' && s_[i_] <= '9') || s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E' ||
                              s_[i_] == '+' || s_[i_] == '-')) {
      digits = digits || (s_[i_] >= '0' && s_[i_] <= '9');
      ++i_;
    }
    if (!digits) fail("expected a value");
    const std::string text(s_.substr(start, i_ - start));
    std::size_t used = 0;
    double d = 0;
    try {
      d = std::stod(text, &used);
    } catch (const std::exception&) {
      fail("bad number '" + text + "'");
    }
    if (used != text.size()) fail("bad number '" + text + "'");
    return d;
  }

  std::string_view s_;
  std::string_view source_;
  std::size_t i_ = 0;
};

/// Quotes s as a JSON string (names are written by weft, but may hold any characters).
inline std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x80) {
      static constexpr char hex[] = "0123456789abcdef";
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x80) throw error("checkpoint: tensor names must be ASCII: '" + std::string(s) + "'");
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
