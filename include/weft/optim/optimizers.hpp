#pragma once
// The update rules: sgd (momentum, Nesterov), adam (L2 weight decay), adamw (decoupled weight
// decay), as WEFT_HOST_DEVICE element-wise functors, so a host loop and a device kernel run
// the same arithmetic, rounded step by step on both (core/rounding.hpp: no fused multiply-add
// on the device): a device step gives the host loop's bits.
//
//   weft::optim::adamw rule{.lr = 1e-3f};
//   auto k = rule.at(step, multiplier);      // the step's scalars (bias corrections, lr)
//   k(w, g, state + i, n);                   // one element: w (fp32) and its state (slot j at
//                                            // state[i + j * n], slot-major) updated
//
// `multiplier` scales the raw (summed) gradient: averaging, loss-scale removal and clipping
// in one factor. An update_ref (below) walks flat buffers: fp32 master weights (or the
// float parameters themselves), gradients of the parameter type, the state (one array per
// slot, so that the loop vectorizes), and for half/bfloat16 parameters the low-precision copy
// written back. Over a shard whose tensors differ in weight decay the functor is a
// decay_groups (below): the rule's functor on the runs that decay, the same with weight_decay
// 0 on the others, and the loops walk the runs.
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/core/rounding.hpp>
#include <weft/core/types.hpp>
#include <weft/optim/param_set.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

namespace weft::optim {

namespace detail {
/// Throws unless least <= value (and value < below where given) and value is finite.
inline void check_hyper(std::string_view rule, std::string_view what, float value, float least,
                        bool finite, std::optional<float> below = std::nullopt) {
  const bool ok = value >= least && (!finite || std::isfinite(value)) && (!below || value < *below);
  if (!ok) {
    const auto str = [](float x) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", static_cast<double>(x));
      return std::string(buf);
    };
    throw error(std::string(rule) + ": " + std::string(what) + " must be " +
                (below ? "in [" + str(least) + ", " + str(*below) + ")"
                       : "a finite number >= " + str(least)) +
                ", not " + str(value));
  }
}
} // namespace detail

/// Stochastic gradient descent with optional momentum (PyTorch's convention: buf = mu*buf + g,
/// dampening 0) and Nesterov momentum; weight decay as L2 (added to the gradient).
struct sgd {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  static constexpr std::string_view name = "sgd";
  static constexpr std::string_view slot_names[1] = {"momentum"};

  /// fp32 words of state per parameter.
  [[nodiscard]] constexpr int slots() const noexcept { return momentum != 0.0f ? 1 : 0; }

  /// Throws weft::error on a value PyTorch's SGD refuses too (a negative or non-finite lr,
  /// momentum or weight decay; Nesterov without momentum).
  void check() const {
    detail::check_hyper(name, "lr", lr, 0.0f, true);
    detail::check_hyper(name, "momentum", momentum, 0.0f, true);
    detail::check_hyper(name, "weight_decay", weight_decay, 0.0f, true);
    if (nesterov && !(momentum > 0.0f)) throw error("sgd: Nesterov momentum needs momentum > 0");
  }

  struct kernel {
    float lr, momentum, weight_decay, multiplier;
    bool nesterov;
    WEFT_HOST_DEVICE void operator()(float& w, float g, float* s, std::size_t /*stride*/) const {
      using weft::detail::add_rn, weft::detail::mul_rn, weft::detail::sub_rn;
      g = mul_rn(g, multiplier);
      if (weight_decay != 0.0f) g = add_rn(g, mul_rn(weight_decay, w));
      if (momentum != 0.0f) {
        const float b = add_rn(mul_rn(momentum, s[0]), g);
        s[0] = b;
        g = nesterov ? add_rn(g, mul_rn(momentum, b)) : b;
      }
      w = sub_rn(w, mul_rn(lr, g));
    }
  };
  /// The functor of step t (1-based) for a gradient multiplier.
  [[nodiscard]] constexpr kernel at(long /*t*/, float multiplier) const noexcept {
    return {lr, momentum, weight_decay, multiplier, nesterov};
  }
};

/// Adam (Kingma & Ba) with bias correction. adam adds weight_decay * w to the gradient
/// (L2); adamw decays the weight itself, w -= lr * weight_decay * w (Loshchilov & Hutter).
template <bool Decoupled>
struct adam_rule {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = Decoupled ? 0.01f : 0.0f;
  static constexpr std::string_view name = Decoupled ? "adamw" : "adam";
  static constexpr std::string_view slot_names[2] = {"exp_avg", "exp_avg_sq"};

  [[nodiscard]] constexpr int slots() const noexcept { return 2; }

  /// Throws weft::error on a value PyTorch's Adam refuses too: lr, eps or weight decay negative
  /// or not finite, a beta outside [0, 1) (beta = 1 divides by 1 - beta^t = 0).
  void check() const {
    detail::check_hyper(name, "lr", lr, 0.0f, true);
    detail::check_hyper(name, "beta1", beta1, 0.0f, true, 1.0f);
    detail::check_hyper(name, "beta2", beta2, 0.0f, true, 1.0f);
    detail::check_hyper(name, "eps", eps, 0.0f, true);
    detail::check_hyper(name, "weight_decay", weight_decay, 0.0f, true);
  }

  struct kernel {
    float lr, beta1, beta2, eps, weight_decay;
    float step_size;   // lr / (1 - beta1^t)
    float inv_sqrt_c2; // 1 / sqrt(1 - beta2^t)
    float multiplier;
    // One division and one square root per element (as PyTorch's Adam computes it:
    // w -= step_size * m / (sqrt(v) / sqrt(c2) + eps)); no branches (weight_decay 0 adds or
    // subtracts an exact 0), so the host loop vectorizes where the compiler may drop errno.
    WEFT_HOST_DEVICE void operator()(float& w, float g, float* s, std::size_t stride) const {
      using weft::detail::add_rn, weft::detail::mul_rn, weft::detail::sub_rn;
      g = mul_rn(g, multiplier);
      if constexpr (!Decoupled) g = add_rn(g, mul_rn(weight_decay, w));
      const float m = add_rn(mul_rn(beta1, s[0]), mul_rn(1.0f - beta1, g));
      const float v = add_rn(mul_rn(beta2, s[stride]), mul_rn(mul_rn(1.0f - beta2, g), g));
      s[0] = m;
      s[stride] = v;
      if constexpr (Decoupled) w = sub_rn(w, mul_rn(mul_rn(lr, weight_decay), w));
      const float denom = add_rn(mul_rn(sqrtf(v), inv_sqrt_c2), eps);
      w = sub_rn(w, mul_rn(step_size, m) / denom);
    }
  };
  /// The functor of step t (1-based): bias corrections 1 - beta^t computed in double, once.
  [[nodiscard]] kernel at(long t, float multiplier) const noexcept {
    const double c1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
    const double c2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
    return {lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            static_cast<float>(static_cast<double>(lr) / c1),
            static_cast<float>(1.0 / std::sqrt(c2)),
            multiplier};
  }
};
using adam = adam_rule<false>;
using adamw = adam_rule<true>;

/// The distance, in elements, between consecutive state slots of n elements: n rounded up to
/// 16 plus a gap of 2064 (8 KiB + 64 B). Slots exactly n apart (n a large power of two) put
/// the element i of every slot in the same cache sets: the AdamW step over 64M parameters ran
/// 4x slower on this project's build machine (3.4 ns per element instead of 0.8).
[[nodiscard]] constexpr std::size_t slot_stride(std::size_t n) noexcept {
  return (n + 15) / 16 * 16 + 2064;
}

/// An update rule: its state width and its per-step functor.
template <class R>
concept update_rule = requires(const R& r, float w, float* s) {
  { r.slots() } -> std::convertible_to<int>;
  r.at(1L, 1.0f)(w, 1.0f, s, std::size_t{1});
  R::name;
};

/// Updates n elements of flat buffers: master[i] (fp32) from grad[i] and state[i + j*stride],
/// and, for low-precision parameters, param[i] = P(master[i]). Trivially copyable: a device
/// kernel takes it by value.
template <class Kernel, class G, class P>
struct update_ref {
  Kernel k;
  float* master; // the fp32 weights (for float parameters: the parameters)
  const G* grad;
  float* state;       // slot j of element i at state[i + j * stride]
  P* param;           // written when P is not float; unused (may be null) for float
  std::size_t stride; // elements between slots

  WEFT_HOST_DEVICE void operator()(std::size_t i) const {
    float w = master[i];
    k(w, static_cast<float>(grad[i]), state != nullptr ? state + i : state,
      stride); // null: no slots (plain SGD)
    master[i] = w;
    if constexpr (!std::is_same_v<P, float>) param[i] = static_cast<P>(w);
  }
};

/// k with its weight decay off (a tensor exempt from decay); a functor without weight decay
/// has none to turn off.
template <class Kernel>
[[nodiscard]] constexpr Kernel without_weight_decay(Kernel k) noexcept {
  if constexpr (requires { k.weight_decay = 0.0f; }) k.weight_decay = 0.0f;
  return k;
}

/// A step's functor over a shard cut into runs of equal decay (layout::decay_runs): `decayed`
/// on the runs that decay, `exempt` (without_weight_decay(decayed)) on the others. It has no
/// element operator, so a loop that does not walk the runs (apply and apply_parallel below, the
/// device's dp_memory::update) does not compile, rather than decaying every element. The runs
/// are host memory, and outlive the loop.
template <class Kernel>
struct decay_groups {
  Kernel decayed;
  Kernel exempt;
  const decay_run* runs;
  std::size_t count;
  /// f(functor, begin, end) for each run, [begin, end) in the shard's elements.
  template <class F>
  void for_each_run(F&& f) const {
    for (std::size_t r = 0; r < count; ++r) {
      f(runs[r].decay ? decayed : exempt, runs[r].begin, runs[r].begin + runs[r].count);
    }
  }
  /// update_ref u with run functor k in place of this one (the same buffers and indices).
  template <class G, class P>
  [[nodiscard]] static update_ref<Kernel, G, P> with(const update_ref<decay_groups, G, P>& u,
                                                     const Kernel& k) noexcept {
    return {k, u.master, u.grad, u.state, u.param, u.stride};
  }
};

namespace detail {

template <class K>
inline constexpr int adam_kernel_kind = 0; // 1: adam, 2: adamw
template <>
inline constexpr int adam_kernel_kind<adam_rule<false>::kernel> = 1;
template <>
inline constexpr int adam_kernel_kind<adam_rule<true>::kernel> = 2;

#if defined(__SSE2__) && !defined(__CUDACC__)
// Four bfloat16 values (8 bytes, unaligned) widened to floats: each is the top half of its float.
inline __m128 load_bf16x4(const bfloat16* p) {
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
}

// Four floats narrowed to bfloat16 as bfloat16(float) narrows them (core/half.hpp): round to
// nearest, ties to even, on the bits, (x + 0x7fff + bit 16 of x) >> 16, which carries into the
// exponent where it should (the largest finite values up to infinity) and leaves infinities
// alone; a NaN keeps its sign and top payload bits and gets the quiet bit.
inline void store_bf16x4(bfloat16* p, __m128 v) {
  const __m128i x = _mm_castps_si128(v);
  const __m128i odd = _mm_and_si128(_mm_srli_epi32(x, 16), _mm_set1_epi32(1));
  const __m128i rounded =
      _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(x, _mm_set1_epi32(0x7fff)), odd), 16);
  const __m128i nan =
      _mm_cmpgt_epi32(_mm_and_si128(x, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
  const __m128i quiet = _mm_or_si128(_mm_srli_epi32(x, 16), _mm_set1_epi32(0x40));
  __m128i r = _mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rounded));
  r = _mm_srai_epi32(_mm_slli_epi32(r, 16),
                     16); // 16-bit values as int16, so the pack does not saturate
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi32(r, r));
}

// Four halves (8 bytes, unaligned) widened to floats exactly, as weft::half's conversion
// (core/half.hpp): normals rebias the exponent, subnormals (every one a normal float) are their
// fraction times 2^-24 through an exact int-to-float conversion (so no float subnormal appears and
// DAZ cannot change the result), infinities and NaNs keep their payload.
inline __m128 load_half4(const half* p) {
  const __m128i h =
      _mm_unpacklo_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), _mm_setzero_si128());
  const __m128i sign = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16);
  const __m128i exp = _mm_and_si128(h, _mm_set1_epi32(0x7c00));
  const __m128i frac = _mm_and_si128(h, _mm_set1_epi32(0x03ff));
  const __m128i normal = _mm_add_epi32(_mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x7fff)), 13),
                                       _mm_set1_epi32((127 - 15) << 23));
  const __m128i subnormal =
      _mm_castps_si128(_mm_mul_ps(_mm_cvtepi32_ps(frac), _mm_set1_ps(1.0f / 16777216.0f)));
  const __m128i special = _mm_or_si128(_mm_slli_epi32(frac, 13), _mm_set1_epi32(0x7f800000));
  const __m128i is_sub = _mm_cmpeq_epi32(exp, _mm_setzero_si128());
  const __m128i is_special = _mm_cmpeq_epi32(exp, _mm_set1_epi32(0x7c00));
  __m128i r = _mm_or_si128(_mm_and_si128(is_sub, subnormal), _mm_andnot_si128(is_sub, normal));
  r = _mm_or_si128(_mm_and_si128(is_special, special), _mm_andnot_si128(is_special, r));
  return _mm_castsi128_ps(_mm_or_si128(r, sign));
}

// Four floats narrowed to half as half(float) narrows them: round to nearest, ties to even. On
// the magnitude's bits a: at or above 2^16 infinity (or the NaN with the quiet bit and the top
// payload bits); below 2^-14 a half subnormal, placed by adding 0.5f in float arithmetic, whose
// rounding is the round to nearest even of the dropped bits (the sum and 0.5 are normal floats,
// so FTZ and DAZ do not change it, and a float subnormal input rounds to zero either way); else
// the exponent rebiased and (a + 0xfff + bit 13 of a) >> 13, whose carry runs into the exponent
// (up to infinity from 65520 on).
inline void store_half4(half* p, __m128 v) {
  const __m128i x = _mm_castps_si128(v);
  const __m128i sign = _mm_and_si128(_mm_srli_epi32(x, 16), _mm_set1_epi32(0x8000));
  const __m128i a = _mm_and_si128(x, _mm_set1_epi32(0x7fffffff));
  const __m128i odd = _mm_and_si128(_mm_srli_epi32(a, 13), _mm_set1_epi32(1));
  const __m128i normal = _mm_srli_epi32(
      _mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(static_cast<int>((15u - 127u) << 23) + 0xfff)),
                    odd),
      13);
  const __m128 half_one = _mm_set1_ps(0.5f);
  const __m128i subnormal = _mm_sub_epi32(
      _mm_castps_si128(_mm_add_ps(_mm_castsi128_ps(a), half_one)), _mm_castps_si128(half_one));
  const __m128i nan = _mm_or_si128(_mm_set1_epi32(0x7e00),
                                   _mm_and_si128(_mm_srli_epi32(a, 13), _mm_set1_epi32(0x3ff)));
  const __m128i is_nan = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x7f800000));
  const __m128i is_big =
      _mm_cmpgt_epi32(a, _mm_set1_epi32(0x477fffff)); // >= 2^16: infinity (or NaN)
  const __m128i is_sub = _mm_cmplt_epi32(a, _mm_set1_epi32(0x38800000)); // < 2^-14
  __m128i r = _mm_or_si128(_mm_and_si128(is_sub, subnormal), _mm_andnot_si128(is_sub, normal));
  r = _mm_or_si128(_mm_and_si128(is_big, _mm_set1_epi32(0x7c00)), _mm_andnot_si128(is_big, r));
  r = _mm_or_si128(_mm_and_si128(is_nan, nan), _mm_andnot_si128(is_nan, r));
  r = _mm_or_si128(r, sign);
  r = _mm_srai_epi32(_mm_slli_epi32(r, 16),
                     16); // 16-bit values as int16, so the pack does not saturate
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi32(r, r));
}

template <class G>
__m128 load4(const G* p) {
  if constexpr (std::is_same_v<G, bfloat16>) {
    return load_bf16x4(p);
  } else if constexpr (std::is_same_v<G, half>) {
    return load_half4(p);
  } else {
    static_assert(std::is_same_v<G, float>);
    return _mm_loadu_ps(p);
  }
}

// Adam over flat buffers, four elements at a time: the functor's operations in the
// functor's order, each IEEE-rounded as the scalar instructions round them, so the result is
// bitwise the functor's (tests/optim/optimizers_test.cpp checks it). It exists because GCC
// does not vectorize sqrtf where errno may be set (no -fno-math-errno in a header library's
// users' flags), and the scalar loop runs at a fifth of the memory's speed. Gradients and
// parameters are float, or bfloat16 or half with fp32 masters (the parameter the master rounded;
// the conversions above assume the default rounding mode, round to nearest).
template <bool Decoupled, class G, class P>
std::size_t adam_sse(const update_ref<typename adam_rule<Decoupled>::kernel, G, P>& u,
                     std::size_t begin, std::size_t end) {
  const auto& k = u.k;
  const __m128 mul = _mm_set1_ps(k.multiplier), wd = _mm_set1_ps(k.weight_decay),
               b1 = _mm_set1_ps(k.beta1), c1 = _mm_set1_ps(1.0f - k.beta1),
               b2 = _mm_set1_ps(k.beta2), c2 = _mm_set1_ps(1.0f - k.beta2),
               lr_wd = _mm_set1_ps(k.lr * k.weight_decay), step = _mm_set1_ps(k.step_size),
               isc = _mm_set1_ps(k.inv_sqrt_c2), eps = _mm_set1_ps(k.eps);
  float* s0 = u.state;
  float* s1 = u.state + u.stride;
  std::size_t i = begin;
  for (; i + 4 <= end; i += 4) {
    __m128 w = _mm_loadu_ps(u.master + i);
    __m128 g = _mm_mul_ps(load4(u.grad + i), mul);
    if constexpr (!Decoupled) g = _mm_add_ps(g, _mm_mul_ps(wd, w));
    const __m128 m = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(s0 + i)), _mm_mul_ps(c1, g));
    const __m128 v =
        _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(s1 + i)), _mm_mul_ps(_mm_mul_ps(c2, g), g));
    _mm_storeu_ps(s0 + i, m);
    _mm_storeu_ps(s1 + i, v);
    if constexpr (Decoupled) w = _mm_sub_ps(w, _mm_mul_ps(lr_wd, w));
    const __m128 denom = _mm_add_ps(_mm_mul_ps(_mm_sqrt_ps(v), isc), eps);
    w = _mm_sub_ps(w, _mm_div_ps(_mm_mul_ps(step, m), denom));
    _mm_storeu_ps(u.master + i, w);
    if constexpr (std::is_same_v<P, bfloat16>) store_bf16x4(u.param + i, w);
    if constexpr (std::is_same_v<P, half>) store_half4(u.param + i, w);
  }
  return i;
}
#endif

} // namespace detail

/// The host loop over [begin, end).
template <class Kernel, class G, class P>
void apply(const update_ref<Kernel, G, P>& u, std::size_t begin, std::size_t end) {
  const update_ref<Kernel, G, P> local = u; // a copy the compiler sees is not written by the loop
#if defined(__SSE2__) && !defined(__CUDACC__)
  if constexpr (detail::adam_kernel_kind<Kernel> != 0 &&
                ((std::is_same_v<G, float> && std::is_same_v<P, float>) ||
                 (std::is_same_v<G, bfloat16> && std::is_same_v<P, bfloat16>) ||
                 (std::is_same_v<G, half> && std::is_same_v<P, half>))) {
    begin = detail::adam_sse<detail::adam_kernel_kind<Kernel> == 2>(local, begin, end);
  }
#endif
  for (std::size_t i = begin; i < end; ++i)
    local(i);
}

/// The host loop over [begin, end) of a shard cut into runs of equal decay: each run's part
/// in [begin, end) with its functor, so the thread seams of apply_parallel fall anywhere.
template <class Kernel, class G, class P>
void apply(const update_ref<decay_groups<Kernel>, G, P>& u, std::size_t begin, std::size_t end) {
  u.k.for_each_run([&](const Kernel& k, std::size_t lo, std::size_t hi) {
    lo = std::max(lo, begin);
    hi = std::min(hi, end);
    if (lo < hi) apply(decay_groups<Kernel>::with(u, k), lo, hi);
  });
}

/// The host loop over [0, n) split across `threads` threads (the calling one included).
template <class Kernel, class G, class P>
void apply_parallel(const update_ref<Kernel, G, P>& u, std::size_t n, int threads) {
  if (threads <= 1 || n < 2 * 65536) {
    apply(u, 0, n);
    return;
  }
  const auto t = static_cast<std::size_t>(threads);
  const auto part = [&](std::size_t k) { return n * k / t / 16 * 16; }; // 64-byte aligned seams
  std::vector<std::thread> pool;
  for (std::size_t k = 1; k < t; ++k)
    pool.emplace_back([&u, lo = part(k), hi = k + 1 == t ? n : part(k + 1)] { apply(u, lo, hi); });
  apply(u, 0, part(1));
  for (auto& th : pool)
    th.join();
}

} // namespace weft::optim
