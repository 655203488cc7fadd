#include <weft/comm/plan/check.hpp>
#include <weft/core/error.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using weft::buffer;
using weft::collective;
using weft::plan;
using weft::plan_request;
using weft::step;

struct refusing : weft::plan_check_hooks {
  int refused = 0;
  std::vector<int> members;
  void refuse(const step&) { ++refused; }
  void member(const plan& pl, int g, std::size_t i) { members.push_back(pl.group(g)[i]); }
};

TEST(plan_check, refuses_the_kinds_a_transport_does_not_run_and_checks_the_rest) {
  plan pl(plan_request{collective::all_reduce, 4, 1, 8, 0, {}, 4});
  pl.send(2, buffer::input, 0, 8);
  const int g = pl.add_group({0, 1, 3});
  pl.sync(g);
  const std::size_t sizes[3] = {8, 8, 0};
  refusing x;
  weft::check_plan_steps(
      pl, {.rank = 1, .size = 4, .operation = "all_reduce", .sizes = sizes, .peer_access = false},
      x);
  EXPECT_EQ(x.refused, 1); // the sync
  EXPECT_EQ(x.members, (std::vector<int>{0, 1, 3}));
  const std::size_t short_input[3] = {7, 8, 0};
  EXPECT_THROW(weft::check_plan_steps(
                   pl, {.rank = 1, .size = 4, .operation = "all_reduce", .sizes = short_input}, x),
               weft::error);
  // Without sizes, ranges are left to the run; a peer outside the ranks is not.
  weft::plan_check_hooks none;
  EXPECT_NO_THROW(weft::check_plan_steps(pl, {.rank = 1, .size = 4, .operation = "x"}, none));
  EXPECT_THROW(weft::check_plan_steps(pl, {.rank = 1, .size = 2, .operation = "x"}, none),
               weft::error);
}

// A transport that refuses a family of kinds without a refuse of its own runs no such step:
// the default refuse throws, naming the step's kind and the family.
TEST(plan_check, the_default_refuse_throws_naming_the_kind) {
  plan pl(plan_request{collective::all_reduce, 4, 1, 8, 0, {}, 4});
  pl.sync(pl.add_group({0, 1}));
  weft::plan_check_hooks none;
  EXPECT_THAT(
      [&] {
        weft::check_plan_steps(pl, {.rank = 1, .size = 4, .operation = "x", .peer_access = false},
                               none);
      },
      ThrowsMessage<weft::error>(HasSubstr("sync step, and this transport runs no peer-access")));
  plan sends(plan_request{collective::all_reduce, 4, 1, 8, 0, {}, 4});
  sends.send(2, buffer::input, 0, 8);
  EXPECT_THAT(
      [&] {
        weft::check_plan_steps(sends, {.rank = 1, .size = 4, .operation = "x", .messages = false},
                               none);
      },
      ThrowsMessage<weft::error>(HasSubstr("send step, and this transport runs no message")));
}

// A plan runs in place on one buffer, or on two apart; overlapping otherwise is refused, since
// the device transports place receives by buffer and offset.
TEST(plan_check, a_plan_runs_in_place_on_one_buffer_and_refuses_buffers_that_only_overlap) {
  float m[16] = {};
  EXPECT_TRUE(weft::plan_runs_in_place(m, 32, m, 32, "all_reduce", 0));
  EXPECT_FALSE(weft::plan_runs_in_place(m, 32, m + 8, 32, "all_reduce", 0)); // apart
  EXPECT_FALSE(weft::plan_runs_in_place(m, 0, m, 32, "all_gather", 0));      // no input
  EXPECT_THAT([&] { (void)weft::plan_runs_in_place(m, 32, m + 3, 32, "all_reduce", 1); },
              ThrowsMessage<weft::error>(HasSubstr("overlap without being the same buffer")));
  EXPECT_THROW((void)weft::plan_runs_in_place(m + 3, 32, m, 32, "reduce", 0), weft::error);
}

} // namespace
