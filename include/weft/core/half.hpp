#pragma once
// weft::half (IEEE 754 binary16, the layout of CUDA's __half) and weft::bfloat16 (the top
// 16 bits of a binary32, the layout of __nv_bfloat16). Both are storage types: they widen
// implicitly to float, and arithmetic happens there, as reductions accumulate them in
// float (see ops.hpp).
//
// The conversions are integer bit manipulation rather than floating-point tricks, so the
// same code is constexpr and gives the same bits on every compiler whatever the rounding mode
// or flush-to-zero setting. Narrowing rounds to nearest, ties to even, once, straight from the
// source format (double is not routed through float, which could round twice).
//
// Device code converts between float and these types with the hardware's instructions
// instead (cvt.rn.f16.f32, cvt.f32.f16 and, from sm_80, cvt.rn.bf16.f32: what CUDA's
// __float2half_rn, __half2float and __float2bfloat16_rn issue on the device), one instruction
// each where the emulation is dozens: the same round-to-nearest-even bits for every value but
// NaN, whose payload the hardware replaces by its canonical NaN. tests/cuda/half_device_test.cu
// checks those CUDA functions (which the CUDA headers also implement on the host) against the
// emulation below for every pattern. CUDA's headers stay out of this one: cuda_fp16.h declares
// a global `half`, which would collide with weft::half wherever both namespaces are open.

#include <weft/core/config.hpp>

#include <bit>
#include <concepts>
#include <cstdint>
#include <type_traits>
#if defined(__CUDACC__)
#include <cuda/std/bit>
#include <cuda/std/type_traits>
#endif

namespace weft::detail {

// std::bit_cast is host-only to nvcc (without --expt-relaxed-constexpr); libcu++'s twin is
// constexpr on both sides.
template <class To, class From>
WEFT_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
#if defined(__CUDACC__)
  return ::cuda::std::bit_cast<To>(from);
#else
  return std::bit_cast<To>(from);
#endif
}

// v / 2^s rounded to nearest, ties to even; needs 1 <= s < bit width of U.
template <class U>
WEFT_HOST_DEVICE constexpr U shift_round_even(U v, int s) noexcept {
  const U q = v >> s;
  const U rest = v & ((U{1} << s) - 1);
  const U tie = U{1} << (s - 1);
  return q + ((rest > tie || (rest == tie && (q & 1) != 0)) ? U{1} : U{0});
}

// Narrows the IEEE binary value with SrcExp exponent and SrcMan fraction bits held in U to
// a 16-bit format with DstExp and DstMan bits. Subnormal results take the normal path with
// the exponent pinned at its minimum and the fraction shifted further, and a rounding
// carry out of the fraction runs into the exponent field, which is what moves the largest
// subnormal up to the smallest normal and the largest finite value up to infinity.
template <int DstExp, int DstMan, int SrcExp, int SrcMan, class U>
WEFT_HOST_DEVICE constexpr std::uint16_t narrow(U x) noexcept {
  static_assert(DstExp + DstMan == 15 && SrcExp + SrcMan + 1 == 8 * sizeof(U));
  static_assert(SrcExp >= DstExp && SrcMan > DstMan);
  constexpr int src_bias = (1 << (SrcExp - 1)) - 1;
  constexpr int dst_bias = (1 << (DstExp - 1)) - 1;
  constexpr int src_exp_ones = (1 << SrcExp) - 1;
  constexpr std::uint32_t dst_inf = ((1u << DstExp) - 1) << DstMan;

  const std::uint32_t sign = (x >> (SrcExp + SrcMan)) != 0 ? 0x8000u : 0u;
  const int exp_field = static_cast<int>((x >> SrcMan) & static_cast<U>(src_exp_ones));
  const U frac = x & ((U{1} << SrcMan) - 1);
  if (exp_field == src_exp_ones) {
    if (frac == 0) return static_cast<std::uint16_t>(sign | dst_inf);
    // Set the quiet bit: a NaN whose payload lives only in the dropped bits would
    // otherwise come out as infinity.
    const auto payload = static_cast<std::uint32_t>(frac >> (SrcMan - DstMan));
    return static_cast<std::uint16_t>(sign | dst_inf | (1u << (DstMan - 1)) | payload);
  }
  // The value is sig * 2^(e - SrcMan) with e = exp_field - src_bias; a subnormal source
  // has no implicit bit and the exponent of field 1.
  const U sig = exp_field != 0 ? (frac | (U{1} << SrcMan)) : frac;
  int biased = (exp_field != 0 ? exp_field : 1) - src_bias + dst_bias;
  if (biased >= (1 << DstExp) - 1) return static_cast<std::uint16_t>(sign | dst_inf);
  int shift = SrcMan - DstMan;
  if (biased < 1) {
    shift += 1 - biased;
    biased = 1;
  }
  // sig < 2^(SrcMan + 1), so this far down it is below half the smallest subnormal.
  if (shift > SrcMan + 1) return static_cast<std::uint16_t>(sign);
  const auto rounded = static_cast<std::uint32_t>(shift_round_even(sig, shift));
  // A normal result's rounded fraction still holds the implicit bit, so the exponent field
  // goes in one lower; a subnormal's holds none, and its field is 0.
  return static_cast<std::uint16_t>(sign |
                                    ((static_cast<std::uint32_t>(biased - 1) << DstMan) + rounded));
}

WEFT_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t frac = h & 0x3ffu;
  if (exp == 0x1f) {
    exp = 0xff; // infinity and NaN keep their payload, so a quiet NaN stays quiet
  } else if (exp != 0) {
    exp += 127 - 15;
  } else if (frac != 0) {
    // Every subnormal half is a normal float: normalize.
    exp = 127 - 15 + 1;
    while ((frac & 0x400u) == 0) {
      frac <<= 1;
      --exp;
    }
    frac &= 0x3ffu;
  }
  return detail::bit_cast<float>(sign | (exp << 23) | (frac << 13));
}

#if defined(__CUDA_ARCH__)
// The hardware's conversions, one instruction each.
__device__ inline std::uint16_t device_float_to_half_bits(float f) noexcept {
  std::uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ inline float device_half_bits_to_float(std::uint16_t h) noexcept {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ inline float device_bfloat16_bits_to_float(std::uint16_t b) noexcept {
  float f;
  asm("mov.b32 %0, {0, %1};" : "=f"(f) : "h"(b)); // b as the high half of the word
  return f;
}
#if __CUDA_ARCH__ >= 800
__device__ inline std::uint16_t device_float_to_bfloat16_bits(float f) noexcept {
  std::uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}
#endif
#endif

// float -> binary16 bits: the hardware's conversion in device code, the emulation elsewhere
// (and wherever the compiler evaluates it as a constant).
WEFT_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  if (!::cuda::std::is_constant_evaluated()) return device_float_to_half_bits(f);
#endif
  return narrow<5, 10, 8, 23>(detail::bit_cast<std::uint32_t>(f));
}

WEFT_HOST_DEVICE constexpr float half_to_float(std::uint16_t h) noexcept {
#if defined(__CUDA_ARCH__)
  if (!::cuda::std::is_constant_evaluated()) return device_half_bits_to_float(h);
#endif
  return half_bits_to_float(h);
}

WEFT_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if (!::cuda::std::is_constant_evaluated()) return device_float_to_bfloat16_bits(f);
#endif
  return narrow<8, 7, 8, 23>(detail::bit_cast<std::uint32_t>(f));
}

WEFT_HOST_DEVICE constexpr float bfloat16_to_float(std::uint16_t b) noexcept {
#if defined(__CUDA_ARCH__)
  if (!::cuda::std::is_constant_evaluated()) return device_bfloat16_bits_to_float(b);
#endif
  return detail::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

} // namespace weft::detail

namespace weft {

/// IEEE 754 binary16: 1 sign, 5 exponent, 10 fraction bits.
struct half {
  half() = default;
  WEFT_HOST_DEVICE constexpr explicit half(float f) noexcept
      : bits_(detail::float_to_half_bits(f)) {}
  WEFT_HOST_DEVICE constexpr explicit half(double d) noexcept
      : bits_(detail::narrow<5, 10, 11, 52>(detail::bit_cast<std::uint64_t>(d))) {}
  /// Through double, which holds every integer up to 2^53, far beyond where half overflows,
  /// so this rounds once. Without it half(1) would be ambiguous between float and double.
  template <std::integral I>
  WEFT_HOST_DEVICE constexpr explicit half(I i) noexcept : half(static_cast<double>(i)) {}

  WEFT_HOST_DEVICE constexpr operator float() const noexcept {
    return detail::half_to_float(bits_);
  }

  WEFT_HOST_DEVICE static constexpr half from_bits(std::uint16_t b) noexcept {
    return half(bits_tag{}, b);
  }
  WEFT_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// Numeric equality: +0 == -0 and NaN != NaN. Compare bits() for identity.
  WEFT_HOST_DEVICE friend constexpr bool operator==(half a, half b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }

private:
  struct bits_tag {};
  WEFT_HOST_DEVICE constexpr half(bits_tag, std::uint16_t b) noexcept : bits_(b) {}
  std::uint16_t bits_;
};

/// bfloat16: the top 16 bits of a binary32 (1 sign, 8 exponent, 7 fraction bits), so it
/// has float's range and widens by a shift.
struct bfloat16 {
  bfloat16() = default;
  WEFT_HOST_DEVICE constexpr explicit bfloat16(float f) noexcept
      : bits_(detail::float_to_bfloat16_bits(f)) {}
  WEFT_HOST_DEVICE constexpr explicit bfloat16(double d) noexcept
      : bits_(detail::narrow<8, 7, 11, 52>(detail::bit_cast<std::uint64_t>(d))) {}
  /// Through double: correctly rounded for |i| <= 2^53; above that, rounding twice can
  /// land one bfloat16 step off at an exact tie.
  template <std::integral I>
  WEFT_HOST_DEVICE constexpr explicit bfloat16(I i) noexcept : bfloat16(static_cast<double>(i)) {}

  WEFT_HOST_DEVICE constexpr operator float() const noexcept {
    return detail::bfloat16_to_float(bits_);
  }

  WEFT_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    return bfloat16(bits_tag{}, b);
  }
  WEFT_HOST_DEVICE constexpr std::uint16_t bits() const noexcept { return bits_; }

  /// Numeric equality: +0 == -0 and NaN != NaN. Compare bits() for identity.
  WEFT_HOST_DEVICE friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept {
    return static_cast<float>(a) == static_cast<float>(b);
  }

private:
  struct bits_tag {};
  WEFT_HOST_DEVICE constexpr bfloat16(bits_tag, std::uint16_t b) noexcept : bits_(b) {}
  std::uint16_t bits_;
};

// Buffers of these are copied and reinterpreted between host, device and the wire.
static_assert(sizeof(half) == 2 && alignof(half) == 2 && std::is_trivially_copyable_v<half> &&
              std::is_trivially_default_constructible_v<half> && std::is_standard_layout_v<half>);
static_assert(sizeof(bfloat16) == 2 && alignof(bfloat16) == 2 &&
              std::is_trivially_copyable_v<bfloat16> &&
              std::is_trivially_default_constructible_v<bfloat16> &&
              std::is_standard_layout_v<bfloat16>);

} // namespace weft
