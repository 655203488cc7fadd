// norm_pieces: how a device cuts the global norm's ranges into one block's work each, checked
// against hand-written cuts and against a walk over the ranges' elements.
#include <weft/optim/detail/memory.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace {

using weft::optim::detail::norm_pieces;
using range = weft::optim::detail::norm_range<float>;

std::vector<std::pair<std::ptrdiff_t, std::size_t>> offsets(const std::vector<range>& rs,
                                                            const float* base) {
  std::vector<std::pair<std::ptrdiff_t, std::size_t>> out;
  for (const auto& r : rs)
    out.emplace_back(r.data - base, r.n);
  return out;
}

TEST(norm_pieces, cuts_each_range_in_order_and_drops_empty_ones) {
  std::vector<float> g(64);
  const float* p = g.data();
  const std::vector<range> ranges{{p, 10}, {p + 20, 0}, {p + 30, 4}, {p + 40, 1}, {p + 50, 9}};
  using v = std::vector<std::pair<std::ptrdiff_t, std::size_t>>;
  EXPECT_EQ(offsets(norm_pieces(ranges, 4), p),
            (v{{0, 4}, {4, 4}, {8, 2}, {30, 4}, {40, 1}, {50, 4}, {54, 4}, {58, 1}}));
  EXPECT_EQ(offsets(norm_pieces(ranges, 100), p), (v{{0, 10}, {30, 4}, {40, 1}, {50, 9}}));
  EXPECT_EQ(offsets(norm_pieces(ranges, 1), p).size(), 10u + 4u + 1u + 9u);
  EXPECT_TRUE(norm_pieces(std::vector<range>{}, 4).empty());
  EXPECT_TRUE(norm_pieces(std::vector<range>{{p, 0}}, 4).empty());
}

TEST(norm_pieces, cover_every_element_once_in_order) {
  std::vector<float> g(1000);
  const float* p = g.data();
  const std::vector<range> ranges{{p, 333}, {p + 400, 257}, {p + 700, 256}, {p + 999, 1}};
  for (const std::size_t piece : {1u, 7u, 64u, 256u, 1000u}) {
    std::vector<const float*> walked;
    for (const auto& r : ranges)
      for (std::size_t i = 0; i < r.n; ++i)
        walked.push_back(r.data + i);
    std::vector<const float*> cut;
    for (const auto& c : norm_pieces(ranges, piece)) {
      EXPECT_GT(c.n, 0u);
      EXPECT_LE(c.n, piece);
      for (std::size_t i = 0; i < c.n; ++i)
        cut.push_back(c.data + i);
    }
    EXPECT_EQ(cut, walked) << "piece " << piece;
  }
}

TEST(norm_pieces, refuses_a_zero_piece) {
  std::vector<float> g(4);
  EXPECT_THAT(
      [&] {
        (void)norm_pieces(std::vector<range>{{g.data(), 4}}, 0);
      },
      testing::ThrowsMessage<weft::error>(testing::HasSubstr("piece size must be positive")));
}

} // namespace
