// Expectations come from published bit patterns, from bit-pattern arithmetic (a tie goes to
// the neighbour whose last bit is 0), or from an independent reference that decodes every
// pattern with the textbook formula (ldexp in double) and rounds by picking the nearer of
// the two neighbouring values. Nothing here calls the conversions under test to make an
// expectation.
#include <weft/core/half.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <ios>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using weft::bfloat16;
using weft::half;

// Compile time: the conversions are constexpr.
static_assert(half(1.0f).bits() == 0x3C00);
static_assert(half(-2.0).bits() == 0xC000);
static_assert(half(65504.0f).bits() == 0x7BFF);
static_assert(half(0x1p-24f).bits() == 0x0001);
static_assert(half(1).bits() == 0x3C00);
static_assert(static_cast<float>(half::from_bits(0x3555)) == 0x1.554p-2f); // 0.333251953125
static_assert(static_cast<float>(half::from_bits(0x0001)) == 0x1p-24f);
static_assert(bfloat16(1.0f).bits() == 0x3F80);
static_assert(bfloat16(3.14159265f).bits() == 0x4049);
static_assert(static_cast<float>(bfloat16::from_bits(0xC049)) == -3.140625f);
static_assert(half::from_bits(0x0000) == half::from_bits(0x8000));
static_assert(!(half::from_bits(0x7E00) == half::from_bits(0x7E00)));

constexpr float inf_f = std::numeric_limits<float>::infinity();
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

std::uint32_t float_bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float float_from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// An independent model of a 16-bit binary format with exp_bits exponent and man_bits
// fraction bits.
class reference_format {
public:
  reference_format(int exp_bits, int man_bits)
      : exp_bits_(exp_bits),
        man_bits_(man_bits),
        inf_bits_(static_cast<std::uint16_t>(((1u << exp_bits) - 1) << man_bits)) {
    // Positive patterns ascend with their value. The infinity pattern's formula value,
    // 2^(emax+1) = max finite + one step, is where rounding overflows: keep it as the
    // top neighbour.
    for (std::uint32_t b = 0; b <= inf_bits_; ++b)
      table_.push_back(decode_magnitude(b));
  }

  std::uint16_t inf_bits() const { return inf_bits_; }
  std::uint16_t man_mask() const { return static_cast<std::uint16_t>((1u << man_bits_) - 1); }

  bool is_nan(std::uint16_t b) const {
    return (b & inf_bits_) == inf_bits_ && (b & man_mask()) != 0;
  }
  bool is_quiet_nan(std::uint16_t b) const {
    return is_nan(b) && (b & (1u << (man_bits_ - 1))) != 0;
  }

  // (-1)^s * 2^(e - bias) * (1 + m / 2^M), or 2^(1 - bias) * (m / 2^M) when e == 0.
  double decode_magnitude(std::uint32_t b) const {
    const int bias = (1 << (exp_bits_ - 1)) - 1;
    const auto e = static_cast<int>(b >> man_bits_);
    const std::uint32_t m = b & man_mask();
    if (e == 0) return std::ldexp(static_cast<double>(m), 1 - bias - man_bits_);
    return std::ldexp(static_cast<double>(m + (1u << man_bits_)), e - bias - man_bits_);
  }

  // Float value of any non-NaN pattern.
  float decode(std::uint16_t b) const {
    const std::uint16_t mag = b & 0x7FFFu;
    const double v =
        mag == inf_bits_ ? std::numeric_limits<double>::infinity() : decode_magnitude(mag);
    return static_cast<float>((b & 0x8000u) != 0 ? -v : v);
  }

  // Round-to-nearest-even of a non-NaN x, by choosing between the two neighbours.
  std::uint16_t round(double x) const {
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    if (a >= table_.back()) return sign | inf_bits_;
    const auto hi = static_cast<std::uint16_t>(std::upper_bound(table_.begin(), table_.end(), a) -
                                               table_.begin());
    const auto lo = static_cast<std::uint16_t>(hi - 1);
    if (table_[lo] == a) return sign | lo;
    // Exact in double: 2a doubles, and the two neighbours sum without rounding.
    const double twice = 2 * a;
    const double sum = table_[lo] + table_[hi];
    std::uint16_t pick = 0;
    if (twice < sum) {
      pick = lo;
    } else if (twice > sum) {
      pick = hi;
    } else {
      pick = (lo & 1) == 0 ? lo : hi;
    }
    return sign | pick;
  }

private:
  int exp_bits_;
  int man_bits_;
  std::uint16_t inf_bits_;
  std::vector<double> table_;
};

const reference_format& binary16_ref() {
  static const reference_format f(5, 10);
  return f;
}
const reference_format& bfloat16_ref() {
  static const reference_format f(8, 7);
  return f;
}

template <class F>
std::string describe(F x) {
  std::ostringstream s;
  s << std::hexfloat << x;
  return s.str();
}
std::string hex(unsigned v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// Converts every input with T and compares with the reference; reports the count and the
// first few mismatches.
template <class T, class F>
::testing::AssertionResult rounds_like_reference(const reference_format& ref,
                                                 const std::vector<F>& inputs) {
  std::size_t bad = 0;
  std::string report;
  for (F x : inputs) {
    const std::uint16_t got = T(x).bits();
    bool ok = false;
    std::string want;
    if (std::isnan(x)) {
      ok = ref.is_quiet_nan(got) && ((got & 0x8000u) != 0) == std::signbit(x);
      want = "quiet NaN";
    } else {
      const std::uint16_t expected = ref.round(static_cast<double>(x));
      ok = got == expected;
      want = hex(expected);
    }
    if (!ok && ++bad <= 5) report += "\n  " + describe(x) + " -> " + hex(got) + ", want " + want;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << inputs.size() << " mismatch:" << report;
}

// Floats whose exponent is uniform in [lo, hi], with random sign and fraction.
std::vector<float> floats_in_exponent_range(std::mt19937_64& rng, std::size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> exp(lo + 127, hi + 127);
  std::vector<float> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    const auto bits = (static_cast<std::uint32_t>(r >> 63) << 31) |
                      (static_cast<std::uint32_t>(exp(rng)) << 23) |
                      static_cast<std::uint32_t>(r & 0x7FFFFFu);
    out.push_back(float_from_bits(bits));
  }
  return out;
}
std::vector<float> floats_any_bits(std::mt19937_64& rng, std::size_t n) {
  std::vector<float> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(float_from_bits(static_cast<std::uint32_t>(rng() >> 32)));
  return out;
}
std::vector<double> doubles_in_exponent_range(std::mt19937_64& rng, std::size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> exp(lo + 1023, hi + 1023);
  std::vector<double> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    const std::uint64_t bits = (r & (std::uint64_t{1} << 63)) |
                               (static_cast<std::uint64_t>(exp(rng)) << 52) |
                               (r & ((std::uint64_t{1} << 52) - 1));
    out.push_back(std::bit_cast<double>(bits));
  }
  return out;
}

// For every pair of adjacent positive patterns (lo, lo + 1), up to and including the
// overflow step to infinity: the midpoint goes to the even one, and the nearest inputs
// above and below it go up and down. Run from float and from double; the double inputs
// just off the midpoint would round onto it if double went through float first.
template <class T>
void expect_every_midpoint_rounds_to_nearest_even(const reference_format& ref) {
  std::size_t bad = 0;
  for (std::uint32_t lo = 0; lo < ref.inf_bits(); ++lo) {
    const auto up = static_cast<std::uint16_t>(lo + 1);
    const auto down = static_cast<std::uint16_t>(lo);
    const std::uint16_t even = (lo & 1) == 0 ? down : up;
    const double mid = (ref.decode_magnitude(lo) + ref.decode_magnitude(up)) / 2;
    const auto mid_f = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(mid_f), mid) << "midpoint must be a float for this test";
    for (std::uint16_t sign : {std::uint16_t{0}, std::uint16_t{0x8000}}) {
      const float sf = sign != 0 ? -1.0f : 1.0f;
      const double sd = sign != 0 ? -1.0 : 1.0;
      const struct {
        std::uint16_t got;
        std::uint16_t want;
      } cases[] = {
          {T(sf * mid_f).bits(), static_cast<std::uint16_t>(sign | even)},
          {T(sf * std::nextafter(mid_f, inf_f)).bits(), static_cast<std::uint16_t>(sign | up)},
          {T(sf * std::nextafter(mid_f, 0.0f)).bits(), static_cast<std::uint16_t>(sign | down)},
          {T(sd * mid).bits(), static_cast<std::uint16_t>(sign | even)},
          {T(sd * std::nextafter(mid, 1e300)).bits(), static_cast<std::uint16_t>(sign | up)},
          {T(sd * std::nextafter(mid, 0.0)).bits(), static_cast<std::uint16_t>(sign | down)},
      };
      for (const auto& c : cases) {
        if (c.got != c.want && ++bad <= 5) {
          ADD_FAILURE() << "between " << hex(down) << " and " << hex(up) << " (sign " << hex(sign)
                        << "): got " << hex(c.got) << ", want " << hex(c.want);
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

// Widening every non-NaN pattern gives exactly the textbook value (sign of zero included),
// and every NaN widens to a NaN of the same sign.
template <class T>
void expect_every_pattern_widens_exactly(const reference_format& ref) {
  std::size_t bad = 0;
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float got = T::from_bits(bits);
    bool ok = false;
    if (ref.is_nan(bits)) {
      ok = std::isnan(got) && std::signbit(got) == ((bits & 0x8000u) != 0);
    } else {
      ok = float_bits(got) == float_bits(ref.decode(bits));
    }
    if (!ok && ++bad <= 5) ADD_FAILURE() << hex(bits) << " widened to " << describe(got);
  }
  EXPECT_EQ(bad, 0u);
}

template <class T>
void expect_every_pattern_round_trips(const reference_format& ref) {
  std::size_t bad = 0;
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    if (ref.is_nan(bits)) continue;
    const float f = T::from_bits(bits);
    const std::uint16_t via_float = T(f).bits();
    const std::uint16_t via_double = T(static_cast<double>(f)).bits();
    if ((via_float != bits || via_double != bits) && ++bad <= 5) {
      ADD_FAILURE() << hex(bits) << " came back as " << hex(via_float) << " (float), "
                    << hex(via_double) << " (double)";
    }
  }
  EXPECT_EQ(bad, 0u);
}

// ---------------------------------------------------------------------------- half

TEST(Half, KnownBitPatterns) {
  EXPECT_EQ(half(1.0f).bits(), 0x3C00);
  EXPECT_EQ(half(-2.0f).bits(), 0xC000);
  EXPECT_EQ(half(0.5f).bits(), 0x3800);
  EXPECT_EQ(half(65504.0f).bits(), 0x7BFF);   // largest finite
  EXPECT_EQ(half(0x1p-14f).bits(), 0x0400);   // smallest normal
  EXPECT_EQ(half(0x1p-24f).bits(), 0x0001);   // smallest subnormal
  EXPECT_EQ(half(0x3FFp-24f).bits(), 0x03FF); // largest subnormal
  EXPECT_EQ(half(0.0f).bits(), 0x0000);
  EXPECT_EQ(half(-0.0f).bits(), 0x8000);
  EXPECT_EQ(half(0.1f).bits(), 0x2E66);
  EXPECT_EQ(half(3.14159265f).bits(), 0x4248);
}

TEST(Half, WidensToKnownValues) {
  EXPECT_EQ(static_cast<float>(half::from_bits(0x3C00)), 1.0f);
  EXPECT_EQ(static_cast<float>(half::from_bits(0xC000)), -2.0f);
  EXPECT_EQ(static_cast<float>(half::from_bits(0x7BFF)), 65504.0f);
  EXPECT_EQ(static_cast<float>(half::from_bits(0x0400)), 0x1p-14f);
  EXPECT_EQ(static_cast<float>(half::from_bits(0x0001)), 0x1p-24f);
  EXPECT_EQ(static_cast<float>(half::from_bits(0x8001)), -0x1p-24f);
  EXPECT_EQ(static_cast<float>(half::from_bits(0x03FF)), 0x3FFp-24f);
  EXPECT_EQ(float_bits(half::from_bits(0x8000)), 0x80000000u);
  EXPECT_EQ(static_cast<float>(half::from_bits(0x7C00)), inf_f);
  EXPECT_EQ(static_cast<float>(half::from_bits(0xFC00)), -inf_f);
  EXPECT_EQ(float_bits(half::from_bits(0x7E00)), 0x7FC00000u); // the canonical quiet NaN
}

TEST(Half, TiesGoToEven) {
  EXPECT_EQ(half(1.0f + 0x1p-11f).bits(), 0x3C00);            // halfway between 0x3C00 and 0x3C01
  EXPECT_EQ(half(1.0f + 3 * 0x1p-11f).bits(), 0x3C02);        // halfway between 0x3C01 and 0x3C02
  EXPECT_EQ(half(1.0f + 0x1p-11f + 0x1p-20f).bits(), 0x3C01); // just above the tie
  EXPECT_EQ(half(1.0f + 0x1p-11f - 0x1p-20f).bits(), 0x3C00); // just below
  EXPECT_EQ(half(-(1.0f + 3 * 0x1p-11f)).bits(), 0xBC02);
  EXPECT_EQ(half(2047.0f).bits(), 0x67FF); // integers are exact up to 2048
  EXPECT_EQ(half(2049.0f).bits(), 0x6800); // 2049 ties between 2048 and 2050: 2048 is even
  EXPECT_EQ(half(2051.0f).bits(), 0x6802); // 2051 ties between 2050 and 2052: 2052 is even
}

TEST(Half, SubnormalsRound) {
  EXPECT_EQ(half(0x1p-25f).bits(), 0x0000);        // half the smallest subnormal: tie to 0
  EXPECT_EQ(half(0x1.000002p-25f).bits(), 0x0001); // just above it
  EXPECT_EQ(half(-0x1p-25f).bits(), 0x8000);
  EXPECT_EQ(half(3 * 0x1p-25f).bits(), 0x0002);        // 1.5 steps: tie to 2
  EXPECT_EQ(half(5 * 0x1p-25f).bits(), 0x0002);        // 2.5 steps: tie to 2
  EXPECT_EQ(half(0x1p-14f - 0x1p-25f).bits(), 0x0400); // tie between 0x03FF and 0x0400
  EXPECT_EQ(half(0x1p-14f - 0x1p-24f).bits(), 0x03FF);
  EXPECT_EQ(half(1e-8f).bits(), 0x0000);
  EXPECT_EQ(half(std::numeric_limits<float>::denorm_min()).bits(), 0x0000);
  EXPECT_EQ(half(std::numeric_limits<float>::min()).bits(), 0x0000);
}

TEST(Half, OverflowAndSpecials) {
  EXPECT_EQ(half(65519.0f).bits(), 0x7BFF);
  EXPECT_EQ(half(65520.0f).bits(), 0x7C00); // the tie above the largest finite goes to infinity
  EXPECT_EQ(half(-65520.0f).bits(), 0xFC00);
  EXPECT_EQ(half(1e6f).bits(), 0x7C00);
  EXPECT_EQ(half(std::numeric_limits<float>::max()).bits(), 0x7C00);
  EXPECT_EQ(half(inf_f).bits(), 0x7C00);
  EXPECT_EQ(half(-inf_f).bits(), 0xFC00);

  for (std::uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0x7FA00000u, 0xFFC00001u, 0x7F801FFFu}) {
    const std::uint16_t b = half(float_from_bits(nan_bits)).bits();
    EXPECT_EQ(b & 0x7C00, 0x7C00) << hex(nan_bits);
    EXPECT_NE(b & 0x03FF, 0) << hex(nan_bits) << " became infinity";
    EXPECT_NE(b & 0x0200, 0) << hex(nan_bits) << " is not quiet";
    EXPECT_EQ((b & 0x8000) != 0, (nan_bits >> 31) != 0) << hex(nan_bits);
    EXPECT_TRUE(std::isnan(static_cast<float>(half(float_from_bits(nan_bits)))));
  }
  EXPECT_TRUE(std::isnan(static_cast<float>(half(std::numeric_limits<double>::quiet_NaN()))));
}

TEST(Half, DoubleRoundsOnce) {
  // Through float, 1 + 2^-11 + 2^-40 would first become the tie 1 + 2^-11, then 0x3C00.
  EXPECT_EQ(half(1.0 + 0x1p-11 + 0x1p-40).bits(), 0x3C01);
  EXPECT_EQ(half(0x1p-25 + 0x1p-60).bits(), 0x0001);
  EXPECT_EQ(half(65520.0 - 0x1p-30).bits(), 0x7BFF);
  EXPECT_EQ(half(65520.0).bits(), 0x7C00);
  EXPECT_EQ(half(1e300).bits(), 0x7C00);
  EXPECT_EQ(half(1e-300).bits(), 0x0000);
  EXPECT_EQ(half(-0.0).bits(), 0x8000);
  EXPECT_EQ(half(0.1).bits(), 0x2E66);
}

TEST(Half, IntegersConvert) {
  EXPECT_EQ(half(3).bits(), 0x4200);
  EXPECT_EQ(half(-7L).bits(), 0xC700);
  EXPECT_EQ(half(2049u).bits(), 0x6800);
  EXPECT_EQ(half(std::int64_t{1} << 40).bits(), 0x7C00);
}

TEST(Half, EqualityIsNumeric) {
  EXPECT_TRUE(half(0.0f) == half(-0.0f));
  EXPECT_TRUE(half(1.0f) == half::from_bits(0x3C00));
  EXPECT_FALSE(half(1.0f) == half(2.0f));
  EXPECT_TRUE(half(1.0f) != half(2.0f));
  const half nan(nan_f);
  EXPECT_FALSE(nan == nan);
  EXPECT_TRUE(nan != nan);
  EXPECT_TRUE(half(1.5f) < half(2.0f)); // through the implicit widening
}

TEST(Half, EveryPatternWidensExactly) { expect_every_pattern_widens_exactly<half>(binary16_ref()); }

TEST(Half, EveryPatternRoundTrips) { expect_every_pattern_round_trips<half>(binary16_ref()); }

TEST(Half, EveryMidpointRoundsToNearestEven) {
  expect_every_midpoint_rounds_to_nearest_even<half>(binary16_ref());
}

TEST(Half, RandomFloatsMatchReference) {
  std::mt19937_64 rng(20240611);
  // Exponents from below half's subnormals to above its overflow, where the work is.
  EXPECT_TRUE(rounds_like_reference<half>(binary16_ref(),
                                          floats_in_exponent_range(rng, 3'000'000, -27, 16)));
  EXPECT_TRUE(rounds_like_reference<half>(binary16_ref(), floats_any_bits(rng, 1'000'000)));
}

TEST(Half, RandomDoublesMatchReference) {
  std::mt19937_64 rng(7);
  EXPECT_TRUE(rounds_like_reference<half>(binary16_ref(),
                                          doubles_in_exponent_range(rng, 1'000'000, -28, 17)));
}

// ------------------------------------------------------------------------ bfloat16

TEST(BFloat16, KnownBitPatterns) {
  EXPECT_EQ(bfloat16(1.0f).bits(), 0x3F80);
  EXPECT_EQ(bfloat16(-2.0f).bits(), 0xC000);
  EXPECT_EQ(bfloat16(3.14159265f).bits(), 0x4049);
  EXPECT_EQ(bfloat16(0.0f).bits(), 0x0000);
  EXPECT_EQ(bfloat16(-0.0f).bits(), 0x8000);
  EXPECT_EQ(bfloat16(float_from_bits(0x7F7F0000)).bits(), 0x7F7F); // largest finite
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::min()).bits(), 0x0080);
  EXPECT_EQ(bfloat16(inf_f).bits(), 0x7F80);
  EXPECT_EQ(bfloat16(-inf_f).bits(), 0xFF80);
  EXPECT_EQ(static_cast<float>(bfloat16::from_bits(0x3F80)), 1.0f);
  EXPECT_EQ(static_cast<float>(bfloat16::from_bits(0x4049)), 3.140625f);
  EXPECT_EQ(static_cast<float>(bfloat16::from_bits(0x7F7F)), float_from_bits(0x7F7F0000));
  EXPECT_EQ(static_cast<float>(bfloat16::from_bits(0x0001)), 0x1p-133f);
  EXPECT_EQ(float_bits(bfloat16::from_bits(0x8000)), 0x80000000u);
}

TEST(BFloat16, TiesGoToEvenOnTheLowBits) {
  EXPECT_EQ(bfloat16(float_from_bits(0x3F808000)).bits(), 0x3F80); // tie, 0x3F80 even
  EXPECT_EQ(bfloat16(float_from_bits(0x3F818000)).bits(), 0x3F82); // tie, 0x3F81 odd
  EXPECT_EQ(bfloat16(float_from_bits(0x3F808001)).bits(), 0x3F81);
  EXPECT_EQ(bfloat16(float_from_bits(0x3F817FFF)).bits(), 0x3F81);
  EXPECT_EQ(bfloat16(float_from_bits(0xBF818000)).bits(), 0xBF82);
  EXPECT_EQ(bfloat16(float_from_bits(0x3F80FFFF)).bits(), 0x3F81);
  EXPECT_EQ(bfloat16(float_from_bits(0x3FFF8000)).bits(), 0x4000); // carry into the exponent
  // Float subnormals land on bfloat16 subnormals.
  EXPECT_EQ(bfloat16(float_from_bits(0x00000001)).bits(), 0x0000);
  EXPECT_EQ(bfloat16(float_from_bits(0x00008000)).bits(), 0x0000);
  EXPECT_EQ(bfloat16(float_from_bits(0x00018000)).bits(), 0x0002);
  EXPECT_EQ(bfloat16(float_from_bits(0x0000FFFF)).bits(), 0x0001);
  EXPECT_EQ(bfloat16(float_from_bits(0x007FFFFF)).bits(),
            0x0080); // largest subnormal -> smallest normal
}

TEST(BFloat16, OverflowAndSpecials) {
  EXPECT_EQ(bfloat16(float_from_bits(0x7F7F7FFF)).bits(), 0x7F7F);
  EXPECT_EQ(bfloat16(float_from_bits(0x7F7F8000)).bits(), 0x7F80); // tie above the largest finite
  EXPECT_EQ(bfloat16(std::numeric_limits<float>::max()).bits(), 0x7F80);
  EXPECT_EQ(bfloat16(-std::numeric_limits<float>::max()).bits(), 0xFF80);
  for (std::uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0xFFC00001u, 0x7FFFFFFFu}) {
    const std::uint16_t b = bfloat16(float_from_bits(nan_bits)).bits();
    EXPECT_EQ(b & 0x7F80, 0x7F80) << hex(nan_bits);
    EXPECT_NE(b & 0x007F, 0) << hex(nan_bits) << " became infinity";
    EXPECT_NE(b & 0x0040, 0) << hex(nan_bits) << " is not quiet";
    EXPECT_EQ((b & 0x8000) != 0, (nan_bits >> 31) != 0) << hex(nan_bits);
  }
  EXPECT_EQ(bfloat16(float_from_bits(0x7FC00000)).bits(), 0x7FC0); // the canonical quiet NaN
  EXPECT_EQ(bfloat16(float_from_bits(0x7FA50000)).bits(), 0x7FE5); // payload kept, quietened
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<double>::quiet_NaN()))));
}

TEST(BFloat16, DoubleRoundsOnce) {
  // Through float, 1 + 2^-8 + 2^-30 would first become the tie 1 + 2^-8, then 0x3F80.
  EXPECT_EQ(bfloat16(1.0 + 0x1p-8 + 0x1p-30).bits(), 0x3F81);
  EXPECT_EQ(bfloat16(0x1p-134 + 0x1p-180).bits(), 0x0001); // below float's subnormals
  EXPECT_EQ(bfloat16(0x1p-134).bits(), 0x0000);
  EXPECT_EQ(bfloat16(0x1p128).bits(), 0x7F80);
  EXPECT_EQ(bfloat16(1e300).bits(), 0x7F80);
  EXPECT_EQ(bfloat16(3.141592653589793).bits(), 0x4049);
}

TEST(BFloat16, IntegersConvert) {
  EXPECT_EQ(bfloat16(1).bits(), 0x3F80);
  EXPECT_EQ(bfloat16(-3).bits(), 0xC040);
  EXPECT_EQ(bfloat16(257).bits(), 0x4380); // 257 ties between 256 and 258: 256 is even
  EXPECT_EQ(bfloat16(259).bits(), 0x4382); // 259 ties between 258 and 260: 260 is even
}

TEST(BFloat16, EqualityIsNumeric) {
  EXPECT_TRUE(bfloat16(0.0f) == bfloat16(-0.0f));
  EXPECT_TRUE(bfloat16(1.0f) == bfloat16::from_bits(0x3F80));
  EXPECT_FALSE(bfloat16(1.0f) == bfloat16(2.0f));
  const bfloat16 nan(nan_f);
  EXPECT_FALSE(nan == nan);
  EXPECT_TRUE(nan != nan);
}

TEST(BFloat16, EveryPatternWidensExactly) {
  expect_every_pattern_widens_exactly<bfloat16>(bfloat16_ref());
}

TEST(BFloat16, EveryPatternRoundTrips) {
  expect_every_pattern_round_trips<bfloat16>(bfloat16_ref());
}

TEST(BFloat16, EveryMidpointRoundsToNearestEven) {
  expect_every_midpoint_rounds_to_nearest_even<bfloat16>(bfloat16_ref());
}

TEST(BFloat16, RandomFloatsMatchReference) {
  std::mt19937_64 rng(20240612);
  EXPECT_TRUE(rounds_like_reference<bfloat16>(bfloat16_ref(), floats_any_bits(rng, 3'000'000)));
  EXPECT_TRUE(rounds_like_reference<bfloat16>(bfloat16_ref(),
                                              floats_in_exponent_range(rng, 500'000, -126, 127)));
}

TEST(BFloat16, RandomDoublesMatchReference) {
  std::mt19937_64 rng(11);
  EXPECT_TRUE(rounds_like_reference<bfloat16>(
      bfloat16_ref(), doubles_in_exponent_range(rng, 1'000'000, -140, 129)));
}

} // namespace
