#include <weft/weft.hpp>

#include <gtest/gtest.h>

namespace {

using namespace weft;

TEST(send_recv, every_type_arrives_intact_in_order) {
  local::run(3, [](local::communicator& c) {
    const int next = (c.rank() + 1) % 3;
    const int prev = (c.rank() + 2) % 3;
    std::vector<double> d{1.5, -2.25, c.rank() * 1.0};
    std::vector<half> h{half(0.5f), half(-3.0f)};
    std::vector<std::int64_t> big{std::int64_t{1} << 40, -7};
    send(c, std::span(d), next, 1);
    send(c, std::span(h), next, 2);
    send(c, std::span(big), next, 3);
    std::vector<double> d2(3);
    std::vector<half> h2(2);
    std::vector<std::int64_t> big2(2);
    recv(c, std::span(d2), prev, 1);
    recv(c, std::span(h2), prev, 2);
    recv(c, std::span(big2), prev, 3);
    EXPECT_EQ(d2, (std::vector<double>{1.5, -2.25, prev * 1.0}));
    EXPECT_EQ(h2[1].bits(), half(-3.0f).bits());
    EXPECT_EQ(big2[0], std::int64_t{1} << 40);
  });
}

TEST(send_recv, wrong_tag_is_an_error) {
  EXPECT_THROW(local::run(2,
                          [](local::communicator& c) {
                            std::vector<int> v(2);
                            if (c.rank() == 0)
                              send(c, std::span(v), 1, 4);
                            else
                              recv(c, std::span(v), 0, 5);
                          }),
               error);
}

TEST(send_recv, peer_outside_the_communicator_is_an_error) {
  local::run(2, [](local::communicator& c) {
    std::vector<int> v(2);
    EXPECT_THROW(send(c, std::span(v), 2), error);
    EXPECT_THROW(recv(c, std::span(v), c.rank()), error);
  });
}

} // namespace
