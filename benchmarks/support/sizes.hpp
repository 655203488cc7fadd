#pragma once
// The size range of a suite run: nccl-tests' -b/-e/-f, from WEFT_BENCH_SIZES="min:max:factor"
// (e.g. "4:256M:2", the full range; sizes take K, M, G suffixes, powers of 1024). A suite's
// default is its own; CI's smoke runs pass a short range.
#include <weft/core/error.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace weft::bench {

inline std::int64_t parse_size(std::string_view text) {
  std::size_t used = 0;
  const std::string s(text);
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    throw error("weft: WEFT_BENCH_SIZES: bad size \"" + s + "\"");
  }
  std::int64_t scale = 1;
  if (used < s.size()) {
    switch (s[used]) {
      case 'K': case 'k': scale = std::int64_t{1} << 10; break;
      case 'M': case 'm': scale = std::int64_t{1} << 20; break;
      case 'G': case 'g': scale = std::int64_t{1} << 30; break;
      default: throw error("weft: WEFT_BENCH_SIZES: bad size \"" + s + "\" (suffixes: K, M, G)");
    }
    if (used + 1 != s.size()) throw error("weft: WEFT_BENCH_SIZES: bad size \"" + s + "\"");
  }
  if (v <= 0) throw error("weft: WEFT_BENCH_SIZES: sizes must be positive, not \"" + s + "\"");
  return v * scale;
}

/// The sizes of this run: WEFT_BENCH_SIZES if set, else `fallback` (same syntax).
inline std::vector<std::int64_t> sizes_from_env(std::string_view fallback) {
  const char* env = std::getenv("WEFT_BENCH_SIZES");
  const std::string spec = env != nullptr && *env != '\0' ? env : std::string(fallback);
  const auto a = spec.find(':');
  const auto b = a == std::string::npos ? a : spec.find(':', a + 1);
  if (b == std::string::npos) {
    throw error("weft: WEFT_BENCH_SIZES=\"" + spec + "\": expected min:max:factor, e.g. 4:256M:2");
  }
  const std::int64_t lo = parse_size(spec.substr(0, a));
  const std::int64_t hi = parse_size(spec.substr(a + 1, b - a - 1));
  const std::int64_t f = parse_size(spec.substr(b + 1));
  if (lo > hi || f < 2) {
    throw error("weft: WEFT_BENCH_SIZES=\"" + spec + "\": need min <= max and a factor of at least 2");
  }
  std::vector<std::int64_t> out;
  for (std::int64_t s = lo; s <= hi; s *= f) out.push_back(s);
  return out;
}

/// Registers `sizes` from `at_least` bytes on as a benchmark's arguments (smaller ones cannot
/// give every rank an element, and nccl-tests leaves them out too), with one iteration of
/// manual time in microseconds: each row times its own calls.
inline void apply_sizes(benchmark::internal::Benchmark* b, const std::vector<std::int64_t>& sizes,
                        std::int64_t at_least = 1) {
  for (std::int64_t s : sizes) {
    if (s >= at_least) b->Arg(s);
  }
  b->Iterations(1)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

} // namespace weft::bench
