#pragma once
// Pipeline layouts: how many transformer blocks each virtual stage holds.
//
//   weft::pipeline::even_layout(8, 4)              // {2, 2, 2, 2}
//   weft::pipeline::parse_layout("Et*3|t*2|t*2|tL") // {3, 2, 2, 1}
//   weft::pipeline::parse_layout("E|(tt|)*3tL")     // {0, 2, 2, 2, 1}
//
// The string form follows the idea of Megatron-LM's --pipeline-model-parallel-layout: virtual
// stages separated by '|', in virtual-stage order; 't' is one transformer block, 't*N' N of
// them; 'E' (the embedding) may only open the first stage and 'L' (the loss) only close the
// last, where the strategy puts them anyway; "(...)*N" repeats a part N times. Blanks are
// ignored. Anything else is a weft::error that names the position.
#include <weft/core/error.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace weft::pipeline {

/// `layers` blocks over `stages` virtual stages, the same number on each; throws unless they
/// divide.
[[nodiscard]] inline std::vector<int> even_layout(int layers, int stages) {
  if (stages < 1)
    throw error("weft: pipeline layout: " + std::to_string(stages) + " virtual stages");
  if (layers < 0 || layers % stages != 0) {
    throw error("weft: pipeline layout: " + std::to_string(layers) +
                " layers do not split evenly over " + std::to_string(stages) +
                " virtual stages (pipeline stages x chunks); give an explicit layout");
  }
  return std::vector<int>(static_cast<std::size_t>(stages), layers / stages);
}

/// Throws unless `layout` has one non-negative entry per virtual stage and they sum to `layers`.
inline void check_layout(const std::vector<int>& layout, int layers, int stages) {
  if (static_cast<int>(layout.size()) != stages) {
    throw error("weft: pipeline layout: " + std::to_string(layout.size()) + " entries for " +
                std::to_string(stages) + " virtual stages (pipeline stages x chunks)");
  }
  long sum = 0;
  for (int n : layout) {
    if (n < 0) throw error("weft: pipeline layout: a stage of " + std::to_string(n) + " layers");
    sum += n;
  }
  if (sum != layers) {
    throw error("weft: pipeline layout: the stages hold " + std::to_string(sum) +
                " layers, the model has " + std::to_string(layers));
  }
}

namespace detail {

// Expands "(...)*N" repetitions; the result is capped so that no input makes it explode.
inline std::string expand_layout(std::string_view s, std::size_t& at, int depth) {
  constexpr std::size_t max_length = 1 << 20;
  const auto fail = [&](const std::string& what) {
    throw error("weft: pipeline layout: " + what + " at position " + std::to_string(at));
  };
  if (depth > 16) fail("parentheses nested too deep");
  std::string out;
  while (at < s.size()) {
    const char c = s[at];
    if (c == ')') {
      if (depth == 0) fail("')' without '('");
      return out;
    }
    if (c != '(') {
      out += c;
      ++at;
      continue;
    }
    ++at;
    const std::string inner = expand_layout(s, at, depth + 1);
    if (at >= s.size() || s[at] != ')') fail("'(' without ')'");
    ++at;
    if (at >= s.size() || s[at] != '*') fail("'(...)' must be followed by '*N'");
    ++at;
    long n = 0;
    const std::size_t digits = at;
    while (at < s.size() && s[at] >= '0' && s[at] <= '9' && n <= 1'000'000)
      n = n * 10 + (s[at++] - '0');
    if (at == digits || n < 1) fail("'*' must be followed by a count of at least 1");
    if (inner.size() * static_cast<std::size_t>(n) + out.size() > max_length)
      fail("the layout is too long");
    for (long k = 0; k < n; ++k)
      out += inner;
  }
  if (depth > 0) fail("'(' without ')'");
  return out;
}

} // namespace detail

/// Blocks per virtual stage from a layout string (see the header comment).
[[nodiscard]] inline std::vector<int> parse_layout(std::string_view text) {
  std::string compact;
  for (char c : text) {
    if (c != ' ' && c != '\t' && c != '\n') compact += c;
  }
  std::size_t at = 0;
  const std::string s = detail::expand_layout(compact, at, 0);
  if (s.empty()) throw error("weft: pipeline layout: empty");
  std::vector<int> out(1, 0);
  bool seen_loss = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto fail = [&](const std::string& what) {
      throw error("weft: pipeline layout '" + std::string(text.substr(0, 200)) + "': " + what +
                  " (at '" + s.substr(i, 12) + "' of the expanded layout)");
    };
    if (seen_loss) fail("'L' must close the last stage");
    switch (s[i]) {
      case '|': out.push_back(0); break;
      case 'E':
        if (out.size() != 1 || out[0] != 0 || i != 0) fail("'E' may only open the first stage");
        break;
      case 'L': seen_loss = true; break;
      case 't': {
        long n = 1;
        if (i + 1 < s.size() && s[i + 1] == '*') {
          std::size_t j = i + 2;
          n = 0;
          while (j < s.size() && s[j] >= '0' && s[j] <= '9' && n <= 1'000'000)
            n = n * 10 + (s[j++] - '0');
          if (j == i + 2 || n < 1) fail("'t*' must be followed by a count of at least 1");
          i = j - 1;
        }
        if (out.back() + n > 1'000'000) fail("more than 1,000,000 layers in a stage");
        out.back() += static_cast<int>(n);
        break;
      }
      default: fail(std::string("unexpected '") + s[i] + "' (expected t, t*N, |, E, L or (...)*N)");
    }
    if (out.size() > 100'000) fail("more than 100,000 stages");
  }
  return out;
}

} // namespace weft::pipeline
