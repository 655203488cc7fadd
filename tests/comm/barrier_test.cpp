#include <weft/weft.hpp>

#include <gtest/gtest.h>

#include <atomic>

namespace {

TEST(barrier, nobody_leaves_before_everyone_arrived) {
  for (int p : {1, 2, 5, 9}) {
    std::atomic<int> arrived{0};
    weft::local::run(p, [&](weft::local::communicator& c) {
      for (int round = 1; round <= 20; ++round) {
        arrived.fetch_add(1);
        weft::barrier(c);
        EXPECT_GE(arrived.load(), round * p);
        weft::barrier(c);
      }
    });
  }
}

TEST(barrier, on_split_communicators) {
  weft::local::run(6, [](weft::local::communicator& c) {
    auto half_comm = c.split(c.rank() / 3, c.rank());
    for (int i = 0; i < 10; ++i)
      weft::barrier(half_comm);
    weft::barrier(c);
  });
}

} // namespace
