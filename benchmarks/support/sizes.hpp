#pragma once
// The size range of a suite run: nccl-tests' -b/-e/-f, from WEFT_BENCH_SIZES="min:max:factor"
// (e.g. "4:256M:2", the full range; sizes take K, M, G suffixes, powers of 1024). A suite's
// default is its own; CI's smoke runs pass a short range.
#include <weft/core/error.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace weft::bench {

/// A size such as 4096, 64K, 16m or 1G (K, M, G in either case, powers of 1024), from the
/// environment variable `variable` (named in the error). Throws weft::error on anything else:
/// fractions, other suffixes, trailing junk, zero, negatives, overflow.
inline std::int64_t parse_size(std::string_view text,
                               std::string_view variable = "WEFT_BENCH_SIZES") {
  std::size_t used = 0;
  const std::string s(text);
  const std::string where = std::string(variable) + ": bad size \"" + s + "\"";
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    throw error(where + " (a whole number, then K, M or G)");
  }
  std::int64_t scale = 1;
  if (used < s.size()) {
    switch (s[used]) {
      case 'K':
      case 'k': scale = std::int64_t{1} << 10; break;
      case 'M':
      case 'm': scale = std::int64_t{1} << 20; break;
      case 'G':
      case 'g': scale = std::int64_t{1} << 30; break;
      default: throw error(where + " (a whole number, then K, M or G)");
    }
    if (used + 1 != s.size()) throw error(where + " (a whole number, then K, M or G)");
  }
  if (v <= 0) throw error(std::string(variable) + ": sizes must be positive, not \"" + s + "\"");
  if (v > std::numeric_limits<std::int64_t>::max() / scale) throw error(where + " (too large)");
  return v * scale;
}

/// The sizes of this run: WEFT_BENCH_SIZES if set, else `fallback` (same syntax). A suite's main
/// calls this before registering anything and turns a weft::error into exit status 2: thrown
/// from a registration, it would end the program in std::terminate.
inline std::vector<std::int64_t> sizes_from_env(std::string_view fallback) {
  const char* env = std::getenv("WEFT_BENCH_SIZES");
  const std::string spec = env != nullptr && *env != '\0' ? env : std::string(fallback);
  const auto a = spec.find(':');
  const auto b = a == std::string::npos ? a : spec.find(':', a + 1);
  if (b == std::string::npos) {
    throw error("WEFT_BENCH_SIZES=\"" + spec + "\": expected min:max:factor, e.g. 4:256M:2");
  }
  const std::int64_t lo = parse_size(spec.substr(0, a));
  const std::int64_t hi = parse_size(spec.substr(a + 1, b - a - 1));
  const std::int64_t f = parse_size(spec.substr(b + 1));
  if (lo > hi || f < 2) {
    throw error("WEFT_BENCH_SIZES=\"" + spec + "\": need min <= max and a factor of at least 2");
  }
  std::vector<std::int64_t> out;
  for (std::int64_t s = lo; s <= hi; s *= f) {
    out.push_back(s);
    if (s > hi / f) break; // the next step would pass max (or overflow)
  }
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
