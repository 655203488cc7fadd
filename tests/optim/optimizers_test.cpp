// The update rules' functors against the published formulas, written here in double, and
// the host loop (vectorized for Adam) against the functor applied element by element.
#include <weft/optim/optimizers.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

namespace wo = weft::optim;

float value(std::uint32_t& s, float lo, float hi) {
  s = s * 1664525u + 1013904223u;
  return lo + (hi - lo) * static_cast<float>(s >> 8) / 16777216.0f;
}

TEST(sgd, momentum_nesterov_and_weight_decay_follow_the_formulas) {
  for (bool nesterov : {false, true}) {
    const wo::sgd r{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = nesterov};
    EXPECT_EQ(r.slots(), 1);
    float w = 1.0f, buf = 0.0f;
    double wr = 1.0, br = 0.0;
    for (int t = 1; t <= 5; ++t) {
      const float g = 0.5f * static_cast<float>(t);
      r.at(t, 0.5f)(w, g, &buf, 1);
      double gd = 0.5 * g + 0.01 * wr;
      br = 0.9 * br + gd;
      gd = nesterov ? gd + 0.9 * br : br;
      wr -= 0.1 * gd;
      EXPECT_NEAR(w, wr, 1e-6 * std::fabs(wr) + 1e-7) << t;
    }
  }
  EXPECT_EQ((wo::sgd{.momentum = 0.0f}.slots()), 0);
}

TEST(adam, adam_and_adamw_follow_the_formulas) {
  for (bool decoupled : {false, true}) {
    const float lr = 0.01f, wd = 0.1f;
    float w = 0.7f, s[2] = {0.0f, 0.0f};
    double wr = 0.7, m = 0, v = 0;
    for (int t = 1; t <= 20; ++t) {
      const float g = std::sin(static_cast<float>(t));
      if (decoupled) {
        wo::adamw{.lr = lr, .weight_decay = wd}.at(t, 2.0f)(w, g, s, 1);
      } else {
        wo::adam{.lr = lr, .weight_decay = wd}.at(t, 2.0f)(w, g, s, 1);
      }
      double gd = 2.0 * g;
      if (!decoupled) gd += wd * wr;
      m = 0.9 * m + 0.1 * gd;
      v = 0.999 * v + 0.001 * gd * gd;
      if (decoupled) wr -= lr * wd * wr;
      wr -= lr * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
      EXPECT_NEAR(w, wr, 2e-6) << t << (decoupled ? " adamw" : " adam");
    }
  }
}

template <class Rule>
void loop_equals_functor(Rule rule) {
  const std::size_t n = 1003; // not a multiple of the vector width
  std::uint32_t seed = 99;
  std::vector<float> w(n), g(n), st(2 * n);
  for (auto& x : w)
    x = value(seed, -1, 1);
  for (auto& x : g)
    x = value(seed, -1, 1);
  for (auto& x : st)
    x = value(seed, 0, 0.1f);
  auto w2 = w, st2 = st;
  for (long t = 3; t <= 5; ++t) {
    const auto k = rule.at(t, 0.25f);
    const wo::update_ref<decltype(k), float, float> u{k, w.data(), g.data(), st.data(), nullptr, n};
    wo::apply(u, 0, n);
    for (std::size_t i = 0; i < n; ++i)
      k(w2[i], g[i], st2.data() + i, n);
  }
  EXPECT_EQ(w, w2);
  EXPECT_EQ(st, st2);
  // and across threads, every element different, so that a chunk applied at another offset shows
  std::vector<float> big_g(1 << 18), big_w(1 << 18), big_s(2 << 18);
  for (auto& x : big_g)
    x = value(seed, -0.01f, 0.01f);
  for (auto& x : big_w)
    x = value(seed, -1, 1);
  for (auto& x : big_s)
    x = value(seed, 0, 0.1f);
  auto bw2 = big_w, bs2 = big_s;
  const auto k = rule.at(1, 1.0f);
  wo::apply_parallel(wo::update_ref<decltype(k), float, float>{k, big_w.data(), big_g.data(),
                                                               big_s.data(), nullptr, 1 << 18},
                     1 << 18, 3);
  wo::apply(wo::update_ref<decltype(k), float, float>{k, bw2.data(), big_g.data(), bs2.data(),
                                                      nullptr, 1 << 18},
            0, 1 << 18);
  EXPECT_EQ(big_w, bw2);
  EXPECT_EQ(big_s, bs2);
}

TEST(update_ref, host_loop_is_bitwise_the_functor) {
  loop_equals_functor(wo::adam{.weight_decay = 0.01f});
  loop_equals_functor(wo::adamw{});
  loop_equals_functor(wo::sgd{.lr = 0.1f, .momentum = 0.9f, .nesterov = true});
}

// bfloat16 or half parameters with fp32 masters and gradients of their type: the vectorized Adam
// path against the functor element by element (master, moments and the rounded parameter,
// bitwise).
template <class P, class Rule>
void low_precision_loop_equals_functor(Rule rule) {
  const std::size_t n = 1003;
  std::uint32_t seed = 7;
  std::vector<float> w(n), st(2 * n);
  std::vector<P> g(n), p(n);
  for (auto& x : w)
    x = value(seed, -1, 1);
  for (auto& x : g)
    x = P(value(seed, -1, 1));
  for (auto& x : st)
    x = value(seed, 0, 0.1f);
  w[5] = 1e-39f;    // a subnormal master
  w[9] = 3.0e38f;   // near the top of the range
  w[13] = 3.0e-6f;  // a half subnormal
  w[17] = 65519.0f; // rounds to half's largest finite value; 65520 and on to infinity
  w[21] = 70000.0f;
  auto w2 = w, st2 = st;
  auto p2 = p;
  for (long t = 1; t <= 3; ++t) {
    const auto k = rule.at(t, 0.5f);
    const wo::update_ref<decltype(k), P, P> u{k, w.data(), g.data(), st.data(), p.data(), n};
    wo::apply(u, 0, n);
    const wo::update_ref<decltype(k), P, P> ref{k, w2.data(), g.data(), st2.data(), p2.data(), n};
    for (std::size_t i = 0; i < n; ++i)
      ref(i);
  }
  EXPECT_EQ(w, w2);
  EXPECT_EQ(st, st2);
  for (std::size_t i = 0; i < n; ++i)
    ASSERT_EQ(p[i].bits(), p2[i].bits()) << "element " << i;
}

TEST(update_ref, bfloat16_host_loop_is_bitwise_the_functor) {
  low_precision_loop_equals_functor<weft::bfloat16>(wo::adam{.weight_decay = 0.01f});
  low_precision_loop_equals_functor<weft::bfloat16>(wo::adamw{});
}

TEST(update_ref, half_host_loop_is_bitwise_the_functor) {
  low_precision_loop_equals_functor<weft::half>(wo::adam{.weight_decay = 0.01f});
  low_precision_loop_equals_functor<weft::half>(wo::adamw{});
}

#if defined(__SSE2__)
// The vector conversions against weft::bfloat16's scalar ones: every bf16 widened; narrowed,
// every high half with low halves at and around the rounding tie (so every exponent, both
// signs, infinities, NaNs, subnormals and ties), and a million random patterns.
TEST(update_ref, bfloat16_vector_conversions_are_the_scalar_ones) {
  for (std::uint32_t h = 0; h < 65536; h += 4) {
    weft::bfloat16 in[4];
    for (std::uint32_t j = 0; j < 4; ++j)
      in[j] = weft::bfloat16::from_bits(static_cast<std::uint16_t>(h + j));
    float out[4];
    _mm_storeu_ps(out, wo::detail::load_bf16x4(in));
    for (std::uint32_t j = 0; j < 4; ++j) {
      const float want = static_cast<float>(in[j]);
      ASSERT_EQ(std::memcmp(&out[j], &want, 4), 0) << "bf16 bits " << h + j;
    }
  }
  std::vector<std::uint32_t> bits;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    for (std::uint32_t lo :
         {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu, 0x3a5cu})
      bits.push_back(h << 16 | lo);
  }
  std::uint32_t seed = 12345;
  for (int i = 0; i < 1'000'000; ++i) {
    seed = seed * 1664525u + 1013904223u;
    bits.push_back(seed);
  }
  for (std::size_t i = 0; i + 4 <= bits.size(); i += 4) {
    float in[4];
    std::memcpy(in, bits.data() + i, sizeof in);
    weft::bfloat16 out[4];
    wo::detail::store_bf16x4(out, _mm_loadu_ps(in));
    for (std::size_t j = 0; j < 4; ++j) {
      ASSERT_EQ(out[j].bits(), weft::bfloat16(in[j]).bits())
          << "float bits " << std::hex << bits[i + j];
    }
  }
}

// The same for half: every half widened; narrowed, every float exponent and sign with fractions at
// and around half's rounding ties (13 dropped bits: 0x1000, 0x0fff, 0x1001, with the kept lowest
// bit odd and even), the subnormal and overflow boundaries, NaNs, and a million random patterns.
TEST(update_ref, half_vector_conversions_are_the_scalar_ones) {
  for (std::uint32_t h = 0; h < 65536; h += 4) {
    weft::half in[4];
    for (std::uint32_t j = 0; j < 4; ++j)
      in[j] = weft::half::from_bits(static_cast<std::uint16_t>(h + j));
    float out[4];
    _mm_storeu_ps(out, wo::detail::load_half4(in));
    for (std::uint32_t j = 0; j < 4; ++j) {
      const float want = static_cast<float>(in[j]);
      ASSERT_EQ(std::memcmp(&out[j], &want, 4), 0) << "half bits " << std::hex << h + j;
    }
  }
  std::vector<std::uint32_t> bits;
  for (std::uint32_t top = 0; top < 512; ++top) { // sign and exponent
    for (std::uint32_t kept :
         {0u, 1u, 2u, 3u, 0x1ffu, 0x200u, 0x3feu, 0x3ffu}) { // the 10 kept fraction bits
      for (std::uint32_t dropped : {0u, 1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x0800u}) {
        bits.push_back(top << 23 | kept << 13 | dropped);
      }
    }
  }
  for (std::uint32_t b :
       {0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu, 0x47800000u, 0x38800000u, 0x387fffffu,
        0x33000000u, 0x33000001u, 0x32ffffffu, 0x7f800001u, 0x7fc00000u, 0xffbfffffu}) {
    bits.push_back(b);
  }
  std::uint32_t seed = 54321;
  for (int i = 0; i < 1'000'000; ++i) {
    seed = seed * 1664525u + 1013904223u;
    bits.push_back(seed);
  }
  while (bits.size() % 4 != 0)
    bits.push_back(0);
  for (std::size_t i = 0; i + 4 <= bits.size(); i += 4) {
    float in[4];
    std::memcpy(in, bits.data() + i, sizeof in);
    weft::half out[4];
    wo::detail::store_half4(out, _mm_loadu_ps(in));
    for (std::size_t j = 0; j < 4; ++j) {
      ASSERT_EQ(out[j].bits(), weft::half(in[j]).bits())
          << "float bits " << std::hex << bits[i + j];
    }
  }
}
#endif

TEST(update_ref, low_precision_parameters_get_the_rounded_master) {
  float master[3] = {1.0f, 2.0f, 3.0f};
  const weft::bfloat16 grad[3] = {weft::bfloat16(1.0f), weft::bfloat16(-1.0f),
                                  weft::bfloat16(0.5f)};
  weft::bfloat16 param[3] = {};
  const auto k = wo::sgd{.lr = 0.001f}.at(1, 1.0f);
  wo::apply(wo::update_ref<decltype(k), weft::bfloat16, weft::bfloat16>{k, master, grad, nullptr,
                                                                        param, 3},
            0, 3);
  EXPECT_EQ(master[0], 1.0f - 0.001f);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(param[i], weft::bfloat16(master[i]));
  EXPECT_NE(static_cast<float>(param[0]), master[0]); // the fp32 master keeps what bf16 cannot
}

} // namespace
