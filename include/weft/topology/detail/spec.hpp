#pragma once
// Lexing for topology specs: trimming, splitting, integers, and quantities with units.
//
// Quantities are read and written through their exact decimal digits, never by scaling a
// double: "2.5us" becomes the decimal 25e-7 and is rounded once, so parse() gives the
// nearest double to what the user wrote, and a value written by format_quantity() (from
// its shortest round-trip digits) reads back bit for bit. That is what lets
// cluster::to_string() promise an exact round trip.
#include <weft/core/error.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <weft/core/detail/planning_begin.hpp>

namespace weft::detail::spec {

// Messages are built by appending, not with operator+ on temporaries: GCC 12 reports a
// false -Wrestrict on `"literal" + std::string&&` once it inlines enough.
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(std::string_view(parts)), ...);
  return s;
}

template <class... Parts>
[[noreturn]] void fail(std::string_view spec, const Parts&... what) {
  throw ::weft::error(cat("weft: topology spec \"", spec, "\": ", what...));
}

inline std::string quoted(std::string_view text) { return cat("\"", text, "\""); }

constexpr bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

constexpr bool is_digit(char c) noexcept { return c >= '0' && c <= '9'; }

constexpr char to_lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

constexpr std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && is_space(s.front())) {
    s.remove_prefix(1);
  }
  while (!s.empty() && is_space(s.back())) {
    s.remove_suffix(1);
  }
  return s;
}

// Keys and link kinds are matched without regard to case ("NVLink", "IB"); units are
// not, because "Gb/s" and "GB/s" differ by a factor of eight.
constexpr bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) {
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (to_lower(a[i]) != to_lower(b[i])) {
      return false;
    }
  }
  return true;
}

// Pieces are trimmed; empty pieces are kept so that the caller can report them.
inline std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  for (;;) {
    const auto at = s.find(sep);
    parts.push_back(trim(s.substr(0, at)));
    if (at == std::string_view::npos) {
      return parts;
    }
    s.remove_prefix(at + 1);
  }
}

// A non-negative decimal integer that fits in an int; digits only, no sign.
inline std::optional<int> parse_count(std::string_view text) noexcept {
  text = trim(text);
  if (text.empty()) {
    return std::nullopt;
  }
  for (const char c : text) {
    if (!is_digit(c)) {
      return std::nullopt;
    }
  }
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

struct unit {
  std::string_view name;
  int exponent; // the unit is 10^exponent base units (bytes/s or seconds)...
  bool bits;    // ...of bits rather than bytes: divide by 8
};

// Largest first: format_quantity() picks the first byte unit that keeps a non-zero
// integer part.
inline constexpr unit bandwidth_units[] = {
    {"TB/s", 12, false}, {"GB/s", 9, false}, {"MB/s", 6, false},
    {"KB/s", 3, false},  {"B/s", 0, false},  {"Tb/s", 12, true},
    {"Gb/s", 9, true},   {"Mb/s", 6, true},  {"Kb/s", 3, true},
};
inline constexpr std::string_view bandwidth_form =
    "a number and a unit B/s, KB/s, MB/s, GB/s, TB/s, Kb/s, Mb/s, Gb/s or Tb/s";

inline constexpr unit latency_units[] = {
    {"s", 0, false}, {"ms", -3, false}, {"us", -6, false}, {"ns", -9, false}};
inline constexpr std::string_view latency_form = "a number and a unit ns, us, ms or s";

// The nearest double to the decimal integer `digits` times 10^exponent; nullopt when it
// overflows or underflows. `digits` holds only '0'..'9', so no locale can change its
// meaning even on the strtod path.
inline std::optional<double> decimal_to_double(std::string_view digits, long long exponent) {
  std::string text(digits);
  text += 'e';
  text += std::to_string(exponent);
  double value = 0.0;
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    return std::nullopt;
  }
#else
  char* end = nullptr;
  errno = 0;
  value = std::strtod(text.c_str(), &end);
  // ERANGE also flags a subnormal result, which from_chars accepts; refuse only what
  // overflowed to infinity or underflowed to zero.
  if (end != text.c_str() + text.size() || (errno == ERANGE && (value == 0 || std::isinf(value)))) {
    return std::nullopt;
  }
#endif
  return value;
}

// The decimal digits of digits x 125 (a bit count x 125 x 10^-3 is the byte count: digits
// only, so "1e306Kb/s" is read without passing through 1e309 bits).
inline std::string times_125(std::string_view digits) {
  std::string out(digits.size() + 3, '0');
  unsigned carry = 0;
  std::size_t o = out.size();
  for (std::size_t i = digits.size(); i-- > 0;) {
    const unsigned v = static_cast<unsigned>(digits[i] - '0') * 125u + carry;
    out[--o] = static_cast<char>('0' + v % 10);
    carry = v / 10;
  }
  while (carry > 0) {
    out[--o] = static_cast<char>('0' + carry % 10);
    carry /= 10;
  }
  return out.substr(o);
}

// NUMBER [UNIT] with NUMBER = digits ['.' digits] [('e'|'E') ['+'|'-'] digits]; spaces
// may separate the number from its unit. nullopt on anything else, an unknown unit, or a
// value out of the range of double (then *out_of_range, if given, is set).
inline std::optional<double> parse_quantity(std::string_view text, std::span<const unit> units,
                                            bool* out_of_range = nullptr) {
  text = trim(text);
  std::size_t i = 0;
  std::string digits;
  while (i < text.size() && is_digit(text[i])) {
    digits += text[i++];
  }
  if (digits.empty()) {
    return std::nullopt;
  }
  long long exponent = 0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    const std::size_t begin = i;
    while (i < text.size() && is_digit(text[i])) {
      digits += text[i++];
    }
    if (i == begin) {
      return std::nullopt;
    }
    exponent -= static_cast<long long>(i - begin);
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    // An 'e' not followed by an exponent is left for the unit check to reject.
    std::size_t j = i + 1;
    bool negative = false;
    if (j < text.size() && (text[j] == '+' || text[j] == '-')) {
      negative = text[j] == '-';
      ++j;
    }
    const std::size_t begin = j;
    while (j < text.size() && is_digit(text[j])) {
      ++j;
    }
    if (j > begin) {
      int written = 0;
      const auto [end, ec] = std::from_chars(text.data() + begin, text.data() + j, written);
      if (ec != std::errc{} || end != text.data() + j) {
        if (ec == std::errc::result_out_of_range && out_of_range != nullptr) {
          *out_of_range = true;
        }
        return std::nullopt;
      }
      exponent += negative ? -static_cast<long long>(written) : static_cast<long long>(written);
      i = j;
    }
  }
  const std::string_view name = trim(text.substr(i));
  for (const unit& u : units) {
    if (u.name == name) {
      // Bits: x 125 x 10^-3 = / 8, in the decimal, so that it is rounded once, as bytes are.
      const auto value = u.bits ? decimal_to_double(times_125(digits), exponent + u.exponent - 3)
                                : decimal_to_double(digits, exponent + u.exponent);
      if (!value && out_of_range != nullptr) {
        *out_of_range = true;
      }
      return value;
    }
  }
  return std::nullopt;
}

// The shortest decimal that reads back as `value`, as integer digits D (no trailing
// zeros) and the power of ten of D's last digit.
struct decimal {
  std::string digits;
  int exponent;
};

inline decimal shortest_decimal(double value) {
  char buffer[64];
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
  const auto result =
      std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string_view text(buffer, static_cast<std::size_t>(result.ptr - buffer));
#else
  // The fewest significant digits (17 always suffice) that strtod reads back as `value`.
  // printf and strtod share the locale's radix character, so they agree with each other;
  // below, any non-digit before the 'e' is skipped.
  int n = 0;
  for (int precision = 0; precision <= 16; ++precision) {
    n = std::snprintf(buffer, sizeof buffer, "%.*e", precision, value);
    if (std::strtod(buffer, nullptr) == value) {
      break;
    }
  }
  const std::string_view text(buffer, n > 0 ? static_cast<std::size_t>(n) : 0);
#endif
  const auto e = text.find_first_of("eE");
  decimal d{{}, 0};
  for (const char c : text.substr(0, e)) {
    if (is_digit(c)) {
      d.digits += c;
    }
  }
  std::string_view exp_text = text.substr(e + 1);
  bool negative = false;
  if (!exp_text.empty() && (exp_text.front() == '+' || exp_text.front() == '-')) {
    negative = exp_text.front() == '-';
    exp_text.remove_prefix(1);
  }
  int leading_exponent = 0;
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), leading_exponent);
  if (negative) {
    leading_exponent = -leading_exponent;
  }
  while (d.digits.size() > 1 && d.digits.back() == '0') {
    d.digits.pop_back();
  }
  d.exponent = leading_exponent - static_cast<int>(d.digits.size() - 1);
  return d;
}

// Plain text for a double in a message: short, and exact where it matters.
inline std::string to_text(double value) {
  char buffer[64];
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;
  return std::string(buffer, end);
#else
  const int n = std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return std::string(buffer, n > 0 ? static_cast<std::size_t>(n) : 0);
#endif
}

// `value` (finite, non-negative) in the largest byte (not bit) unit of `units` that
// leaves a non-zero integer part, or the smallest unit when none does: 3.35e12 ->
// "3.35TB/s", 2e-6 -> "2us". Far from every unit it switches to an exponent rather than
// write hundreds of zeros: 5e-324 -> "5e-324B/s".
inline std::string format_quantity(double value, std::span<const unit> units) {
  const decimal d = shortest_decimal(value);
  const int size = static_cast<int>(d.digits.size());
  const int leading = d.exponent + size - 1; // power of ten of the first digit
  const unit* chosen = nullptr;
  for (const unit& u : units) {
    if (u.bits) {
      continue;
    }
    chosen = &u;
    if (leading >= u.exponent) {
      break;
    }
  }
  const int shift = d.exponent - chosen->exponent; // value = digits * 10^shift chosen units
  const int point = size + shift;                  // digits before the '.'
  std::string s;
  if (shift >= 0 && shift <= 3) {
    s = d.digits;
    s.append(static_cast<std::size_t>(shift), '0');
  } else if (shift < 0 && point > 0) {
    s = d.digits;
    s.insert(static_cast<std::size_t>(point), 1, '.');
  } else if (shift < 0 && point > -3) {
    s = "0.";
    s.append(static_cast<std::size_t>(-point), '0');
    s += d.digits;
  } else {
    s = d.digits.substr(0, 1);
    if (size > 1) {
      s.append(".").append(d.digits.substr(1));
    }
    s.append("e").append(std::to_string(leading - chosen->exponent));
  }
  s += chosen->name;
  return s;
}

inline constexpr std::string_view shape_expected =
    "expected N (one node of N devices), NxM (N nodes of M devices) or A+B+... (nodes of A, B, "
    "... devices)";
inline constexpr std::string_view option_keys =
    "intra, inter, nics, reduce, nvlink, pcie, shm, ib, infiniband, ethernet, eth or net";

inline int parse_shape_count(std::string_view spec, std::string_view shape, std::string_view text) {
  const auto n = parse_count(text);
  if (!n) {
    fail(spec, "bad shape ", quoted(shape), ": ", quoted(trim(text)),
         " is not a whole number that fits in an int; ", shape_expected);
  }
  return *n;
}

// A bound on the nodes of a shape: a cluster stores per-node data, so "2000000000x1" must be
// an error, not an 8 GB allocation (found by tests/fuzz/topology_spec_fuzz.cpp).
inline constexpr int max_nodes = 1 << 16;

inline std::vector<int> parse_shape(std::string_view spec, std::string_view shape) {
  if (shape.empty()) {
    fail(spec, "bad shape ", quoted(shape), ": ", shape_expected);
  }
  std::vector<int> devices;
  const auto x = shape.find_first_of("xX");
  if (x != std::string_view::npos) {
    const int n = parse_shape_count(spec, shape, shape.substr(0, x));
    const int m = parse_shape_count(spec, shape, shape.substr(x + 1));
    if (n < 1) {
      fail(spec, "bad shape ", quoted(shape), ": a cluster needs at least one node");
    }
    if (n > max_nodes) {
      fail(spec, "bad shape ", quoted(shape), ": more than ", std::to_string(max_nodes), " nodes");
    }
    if (m < 1) {
      fail(spec, "bad shape ", quoted(shape), ": a node needs at least one device");
    }
    if (m > 0x7fffffff / n) {
      fail(spec, "bad shape ", quoted(shape), ": more devices in all than fit in an int");
    }
    devices.assign(static_cast<std::size_t>(n), m);
    return devices;
  }
  long long total = 0;
  for (const auto part : split(shape, '+')) {
    const int m = parse_shape_count(spec, shape, part);
    if (m < 1) {
      fail(spec, "bad shape ", quoted(shape), ": node ", std::to_string(devices.size()),
           " has no devices; a node needs at least one");
    }
    total += m;
    if (total > 0x7fffffff) {
      fail(spec, "bad shape ", quoted(shape), ": more devices in all than fit in an int");
    }
    if (devices.size() == static_cast<std::size_t>(max_nodes)) {
      fail(spec, "bad shape ", quoted(shape), ": more than ", std::to_string(max_nodes), " nodes");
    }
    devices.push_back(m);
  }
  return devices;
}

// Why `text` is not a quantity, beyond "not the form": a sign, or a number out of range.
inline void fail_quantity(std::string_view spec, std::string_view what, std::string_view text,
                          bool out_of_range, std::string_view form) {
  if (trim(text).starts_with('-')) {
    fail(spec, "bad ", what, " ", quoted(text), ": a ", what, " cannot be negative");
  }
  if (out_of_range) {
    fail(spec, "bad ", what, " ", quoted(text), ": out of the range of a double");
  }
  fail(spec, "bad ", what, " ", quoted(text), ": expected ", form);
}

inline double parse_bandwidth(std::string_view spec, std::string_view text) {
  bool out_of_range = false;
  const auto value = parse_quantity(text, bandwidth_units, &out_of_range);
  if (!value) {
    fail_quantity(spec, "bandwidth", text, out_of_range, bandwidth_form);
  }
  if (!(*value > 0)) {
    fail(spec, "bad bandwidth ", quoted(text), ": a bandwidth must be positive");
  }
  return *value;
}

inline double parse_latency(std::string_view spec, std::string_view text) {
  bool out_of_range = false;
  const auto value = parse_quantity(text, latency_units, &out_of_range);
  if (!value) {
    fail_quantity(spec, "latency", text, out_of_range, latency_form);
  }
  return *value;
}

// The VALUES of a link option (see the grammar in topology.hpp): what it sets, each side
// empty when left to the kind's default. `values` is empty for a bare "intra=KIND".
struct link_values {
  std::optional<double> bandwidth;
  std::optional<double> latency;
};

inline link_values parse_link_values(std::string_view spec, std::string_view option,
                                     const std::vector<std::string_view>& values) {
  link_values out;
  if (values.size() > 2) {
    fail(spec, "bad option ", quoted(option), ": too many ':' fields; expected BW:LAT, BW or LAT");
  }
  if (values.size() == 2) {
    if (!values[0].empty()) {
      out.bandwidth = parse_bandwidth(spec, values[0]);
    }
    if (!values[1].empty()) {
      out.latency = parse_latency(spec, values[1]);
    }
  } else if (values.size() == 1) {
    const std::string_view v = values[0];
    if (v.empty()) {
      fail(spec, "bad option ", quoted(option), ": expected BW:LAT, BW or LAT after the link kind");
    }
    bool out_of_range = false;
    if (v.size() >= 2 && v.substr(v.size() - 2) == "/s") {
      out.bandwidth = parse_bandwidth(spec, v);
    } else if (parse_quantity(v, latency_units, &out_of_range) || out_of_range ||
               v.starts_with('-')) {
      out.latency = parse_latency(spec, v); // a latency, or says why it is not one
    } else {
      fail(spec, "bad bandwidth or latency ", quoted(v), ": expected a bandwidth (", bandwidth_form,
           ") or a latency (", latency_form, ")");
    }
  }
  return out;
}

// Presets take a node count from the caller; refuse a bad one before it sizes a vector.
inline std::vector<int> preset_nodes(std::string_view preset, int nodes, int devices) {
  if (nodes < 1) {
    throw ::weft::error(
        cat("weft: topology: ", preset, " needs at least one node, not ", std::to_string(nodes)));
  }
  return std::vector<int>(static_cast<std::size_t>(nodes), devices);
}

} // namespace weft::detail::spec

#include <weft/core/detail/planning_end.hpp>
