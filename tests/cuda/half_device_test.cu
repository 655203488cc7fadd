// The conversions device code uses for weft::half and weft::bfloat16 (core/half.hpp: the cvt
// instructions that CUDA's __float2half_rn, __half2float, __float2bfloat16_rn and
// __bfloat162float issue on the device) against weft's integer emulation, which
// tests/core/half_test.cpp checks against an independent reference for every pattern. Those
// CUDA functions are __host__ __device__, with the same results on either side, so they run
// here, on the host, with no GPU:
//   - widening: every one of the 65,536 patterns of each type;
//   - narrowing: every pattern's own value, the midpoint to the next pattern (a tie), the
//     floats one step either side of it, values past the largest finite one and below half
//     the smallest subnormal, and a million random floats, with both signs.
// Bits must agree, except that a NaN need only stay a NaN (the hardware's cvt returns its
// canonical NaN, not the payload).
#include <weft/core/half.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

// The constexpr path stays the emulation, also under nvcc.
static_assert(weft::half(1.0f).bits() == 0x3C00 && weft::bfloat16(1.0f).bits() == 0x3F80);
static_assert(static_cast<float>(weft::half::from_bits(0x0001)) == 0x1p-24f);

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// One 16-bit format as the test sees it: the device path's pair of conversions and the
// emulation's.
struct format {
  const char* name;
  std::uint16_t inf;  // the +infinity pattern
  std::uint16_t mask; // the fraction bits
  std::uint16_t (*device_narrow)(float);
  float (*device_widen)(std::uint16_t);
  std::uint16_t (*host_narrow)(float);
  float (*host_widen)(std::uint16_t);

  bool is_nan(std::uint16_t b) const { return (b & inf) == inf && (b & mask) != 0; }
};

const format half_format{
    "half",
    0x7C00,
    0x03FF,
    [](float f) { return __half_as_ushort(__float2half_rn(f)); },
    [](std::uint16_t b) { return __half2float(__ushort_as_half(b)); },
    [](float f) { return weft::detail::narrow<5, 10, 8, 23>(std::bit_cast<std::uint32_t>(f)); },
    [](std::uint16_t b) { return weft::detail::half_bits_to_float(b); }};

const format bfloat16_format{
    "bfloat16", 0x7F80, 0x007F,
    [](float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); },
    [](std::uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); },
    [](float f) { return weft::detail::narrow<8, 7, 8, 23>(std::bit_cast<std::uint32_t>(f)); },
    // bfloat16 is the top half of a binary32: widening is the shift, stated here.
    [](std::uint16_t b) { return from_bits(static_cast<std::uint32_t>(b) << 16); }};

// Narrowing f both ways agrees: the same bits, or NaN for NaN.
::testing::AssertionResult narrows_alike(const format& t, float f) {
  const std::uint16_t device = t.device_narrow(f);
  const std::uint16_t host = t.host_narrow(f);
  if (std::isnan(f) ? t.is_nan(device) && t.is_nan(host) : device == host)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << t.name << " of float bits 0x" << std::hex << bits_of(f)
                                       << ": device path 0x" << device << ", emulation 0x" << host;
}

void expect_every_pattern_widens_alike(const format& t) {
  int mismatches = 0;
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const auto p = static_cast<std::uint16_t>(b);
    const float device = t.device_widen(p);
    const float host = t.host_widen(p);
    const bool same =
        t.is_nan(p) ? std::isnan(device) && std::isnan(host) : bits_of(device) == bits_of(host);
    if (!same && ++mismatches <= 5) {
      ADD_FAILURE() << t.name << " pattern 0x" << std::hex << b << ": device path 0x"
                    << bits_of(device) << ", emulation 0x" << bits_of(host);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

void expect_every_boundary_narrows_alike(const format& t) {
  int mismatches = 0;
  const auto check = [&](float f) {
    for (const float v : {f, -f}) {
      const auto r = narrows_alike(t, v);
      if (!r && ++mismatches <= 5) ADD_FAILURE() << r.message();
    }
  };
  // Positive finite patterns in ascending order; the pattern above the largest is infinity.
  for (std::uint16_t b = 0; b < t.inf; ++b) {
    const float lo = t.host_widen(b);
    const float hi = t.host_widen(static_cast<std::uint16_t>(b + 1));
    check(lo);
    // The midpoint: exact in float for finite neighbours (float has 13 or 16 more fraction
    // bits), and for the top pattern the value where rounding overflows.
    const float mid = b + 1 == t.inf
                          ? lo + (lo - t.host_widen(static_cast<std::uint16_t>(b - 1))) / 2
                          : lo + (hi - lo) / 2;
    check(mid);
    check(std::nextafter(mid, 0.0f));
    check(std::nextafter(mid, std::numeric_limits<float>::infinity()));
  }
  for (const float f : {std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                        std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                        0x1p-25f, 0x1.000002p-25f, 0x1p-26f, 65520.0f, 65519.996f, 1e30f})
    check(f);
  EXPECT_EQ(mismatches, 0);
}

void expect_random_floats_narrow_alike(const format& t) {
  std::mt19937 gen(36);
  std::uniform_int_distribution<std::uint32_t> any;
  int mismatches = 0;
  for (int i = 0; i < (1 << 20); ++i) {
    const auto r = narrows_alike(t, from_bits(any(gen)));
    if (!r && ++mismatches <= 5) ADD_FAILURE() << r.message();
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(half_device, every_pattern_widens_as_the_emulation) {
  expect_every_pattern_widens_alike(half_format);
}
TEST(half_device, every_boundary_narrows_as_the_emulation) {
  expect_every_boundary_narrows_alike(half_format);
}
TEST(half_device, random_floats_narrow_as_the_emulation) {
  expect_random_floats_narrow_alike(half_format);
}
TEST(bfloat16_device, every_pattern_widens_as_the_emulation) {
  expect_every_pattern_widens_alike(bfloat16_format);
}
TEST(bfloat16_device, every_boundary_narrows_as_the_emulation) {
  expect_every_boundary_narrows_alike(bfloat16_format);
}
TEST(bfloat16_device, random_floats_narrow_as_the_emulation) {
  expect_random_floats_narrow_alike(bfloat16_format);
}

// The cases the issue names, stated as bits: ties to even, subnormals, overflow.
TEST(half_device, named_cases) {
  const auto cuda_float_to_half_bits = half_format.device_narrow;
  const auto cuda_float_to_bfloat16_bits = bfloat16_format.device_narrow;
  EXPECT_EQ(cuda_float_to_half_bits(1.0f + 0x1p-11f), 0x3C00);           // tie, even below
  EXPECT_EQ(cuda_float_to_half_bits(1.0f + 0x3p-11f), 0x3C02);           // tie, even above
  EXPECT_EQ(cuda_float_to_half_bits(0x1p-25f), 0x0000);                  // half the least subnormal
  EXPECT_EQ(cuda_float_to_half_bits(0x1.000002p-25f), 0x0001);           // just above it
  EXPECT_EQ(cuda_float_to_half_bits(65519.0f), 0x7BFF);                  // below the overflow tie
  EXPECT_EQ(cuda_float_to_half_bits(65520.0f), 0x7C00);                  // the tie overflows
  EXPECT_EQ(cuda_float_to_bfloat16_bits(1.0f + 0x1p-8f), 0x3F80);        // tie, even below
  EXPECT_EQ(cuda_float_to_bfloat16_bits(1.0f + 0x3p-8f), 0x3F82);        // tie, even above
  EXPECT_EQ(cuda_float_to_bfloat16_bits(0x1.ffp127f), 0x7F80);           // rounds to infinity
  EXPECT_EQ(cuda_float_to_bfloat16_bits(from_bits(0x00018000)), 0x0002); // subnormal tie
}

} // namespace
