// Deterministic initialisation: a rank's slice holds exactly the values the unsplit tensor has
// there, at every split; values depend only on (seed, tensor id, flat index); different seeds and
// ids give different streams; the samples have the requested mean and spread. And split_range.
#include <weft/layer/init.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>

#include "layer/layer_support.hpp"

namespace {

namespace wl = weft::layer;

TEST(Init, SlicesEqualTheFullTensor) {
  const std::size_t rows = 11, cols = 13;
  weft::matrix<double> full(rows, cols);
  wl::init_normal(full.view(), cols, 0, 0, 5, 3, 1.0);
  for (int parts = 1; parts <= 5; ++parts) {
    for (int p = 0; p < parts; ++p) {
      const wl::range rr = wl::split_range(rows, parts, p);
      const wl::range cr = wl::split_range(cols, parts, (p + 1) % parts);
      weft::matrix<double> block(rr.size(), cr.size());
      wl::init_normal(block.view(), cols, rr.begin, cr.begin, 5, 3, 1.0);
      for (std::size_t r = 0; r < rr.size(); ++r)
        for (std::size_t c = 0; c < cr.size(); ++c)
          ASSERT_EQ(block(r, c), full(rr.begin + r, cr.begin + c)) << parts << " " << p;
    }
  }
}

TEST(Init, FloatIsTheRoundedDouble) {
  weft::matrix<double> d(4, 6);
  weft::matrix<float> f(4, 6);
  wl::init_normal(d.view(), 6, 0, 0, 9, 1, 0.02);
  wl::init_normal(f.view(), 6, 0, 0, 9, 1, 0.02);
  for (std::size_t i = 0; i < d.size(); ++i)
    EXPECT_EQ(f.flat()[i], static_cast<float>(d.flat()[i]));
}

TEST(Init, DependsOnTheFlatIndexOnly) {
  weft::matrix<double> a(3, 4), b(1, 12), c(2, 5);
  wl::init_normal(a.view(), 4, 0, 0, 1, 2, 1.0);
  wl::init_normal(b.view(), 12, 0, 0, 1, 2, 1.0);
  for (std::size_t i = 0; i < 12; ++i)
    EXPECT_EQ(a.flat()[i], b.flat()[i]);
  wl::init_normal(c.view(), 5, 0, 0, 1, 2, 1.0);
  EXPECT_EQ(c(0, 0), a(0, 0));
  EXPECT_EQ(c(1, 0), a(1, 1)); // flat index 5 either way
}

TEST(Init, SeedsAndIdsGiveDifferentStreams) {
  weft::matrix<double> a(1, 64), b(1, 64), c(1, 64);
  wl::init_normal(a.view(), 64, 0, 0, 1, 2, 1.0);
  wl::init_normal(b.view(), 64, 0, 0, 2, 2, 1.0);
  wl::init_normal(c.view(), 64, 0, 0, 1, 3, 1.0);
  int same_ab = 0, same_ac = 0;
  for (std::size_t i = 0; i < 64; ++i) {
    same_ab += a(0, i) == b(0, i) ? 1 : 0;
    same_ac += a(0, i) == c(0, i) ? 1 : 0;
  }
  EXPECT_EQ(same_ab, 0);
  EXPECT_EQ(same_ac, 0);
}

TEST(Init, MeanAndSpread) {
  const std::size_t n = 200000;
  weft::matrix<double> m(1, n);
  wl::init_normal(m.view(), n, 0, 0, 11, 4, 0.5);
  double s = 0, s2 = 0, s4 = 0;
  for (double x : m.flat()) {
    s += x;
    s2 += x * x;
    s4 += x * x * x * x;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01); // 4.5 standard errors (0.5 / sqrt(n))
  EXPECT_NEAR(std::sqrt(var), 0.5, 0.004);
  EXPECT_NEAR(s4 / n / (var * var), 3.0, 0.06); // a normal's kurtosis, not a uniform's 1.8
}

TEST(Init, SplitRangeIsBalancedAndCovers) {
  for (std::size_t n : {0u, 1u, 7u, 10u, 64u}) {
    for (int parts = 1; parts <= 6; ++parts) {
      std::size_t next = 0;
      for (int p = 0; p < parts; ++p) {
        const wl::range r = wl::split_range(n, parts, p);
        EXPECT_EQ(r.begin, next);
        EXPECT_EQ(r.size(), n / parts + (static_cast<std::size_t>(p) < n % parts ? 1 : 0));
        next = r.end;
      }
      EXPECT_EQ(next, n);
    }
  }
  weft::test::layer::expect_error([] { (void)wl::split_range(4, 2, 2); }, "part 2 of 2");
  weft::matrix<float> m(2, 3);
  weft::test::layer::expect_error([&] { wl::init_normal(m.view(), 4, 0, 2, 1, 1, 1.0); },
                                  "outside a tensor");
}

} // namespace
