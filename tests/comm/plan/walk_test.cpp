// How every executor walks a plan (comm/plan.hpp): its rounds, the round protocol of the
// single-threaded executors, and the one test of a step's range. The plans are built by hand
// and the expectations written out, so nothing here leans on an algorithm or a transport.
#include <weft/comm/plan.hpp>
#include <weft/core/error.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace {

using weft::buffer;
using weft::collective;
using weft::plan;
using weft::plan_buffers;
using weft::plan_cursor;
using weft::plan_request;
using weft::plan_round;
using weft::rounds_of;
using weft::step;
using weft::step_kind;
using weft::step_range_fits;

constexpr std::size_t max = std::numeric_limits<std::size_t>::max();

plan blank(int rank = 0, int size = 4) {
  return plan(plan_request{collective::all_reduce, size, rank, 16, 0, {}, 4});
}

struct seen {
  std::uint32_t number;
  std::size_t begin;
  std::size_t end;
  friend bool operator==(const seen&, const seen&) = default;
};

std::vector<seen> walk(const plan& pl) {
  std::vector<seen> v;
  for (const plan_round& r : rounds_of(pl.steps()))
    v.push_back({r.number, r.begin, r.end});
  return v;
}

TEST(plan_walk, an_empty_plan_has_no_rounds) {
  const plan pl = blank();
  EXPECT_TRUE(walk(pl).empty());
  EXPECT_EQ(pl.rounds(), 0u);
  plan_cursor c(pl.steps());
  EXPECT_TRUE(c.finished());
}

TEST(plan_walk, rounds_are_the_runs_of_equal_round_numbers) {
  // Round 0: steps 0 and 1; the second next_round() finds the round empty and skips it.
  // Round 1: step 2. The sync is a round alone, 2: step 3. Round 3: steps 4 and 5.
  plan pl = blank();
  pl.send(1, buffer::input, 0, 4);
  pl.recv(3, buffer::output, 0, 4);
  pl.next_round();
  pl.next_round();
  pl.copy(buffer::input, 0, buffer::output, 4, 4);
  pl.sync(pl.add_group({0, 1}));
  pl.reduce(buffer::input, 8, buffer::output, 8, 4);
  pl.send(2, buffer::output, 8, 4);
  ASSERT_EQ(pl.steps().size(), 6u);
  const std::vector<seen> want = {{0, 0, 2}, {1, 2, 3}, {2, 3, 4}, {3, 4, 6}};
  EXPECT_EQ(walk(pl), want) << pl.to_string();
  EXPECT_EQ(pl.rounds(), 4u);
  EXPECT_EQ(weft::round_end(pl.steps(), 2), 3u);
  EXPECT_EQ(weft::round_end(pl.steps(), 4), 6u);
}

TEST(plan_walk, steps_of_no_elements_are_left_out) {
  plan pl = blank();
  pl.send(1, buffer::input, 0, 0);
  pl.copy(buffer::input, 0, buffer::output, 0, 0);
  EXPECT_TRUE(pl.steps().empty());
  EXPECT_TRUE(walk(pl).empty());
}

TEST(plan_walk, round_numbers_that_jump_still_split_where_they_change) {
  // An appended sub-plan's rounds follow the outer plan's; the walk keys on the change of
  // number, not on consecutive numbers.
  const std::vector<step> steps = {
      {step_kind::copy, buffer::input, buffer::output, -1, 0, 0, 1, 0},
      {step_kind::copy, buffer::input, buffer::output, -1, 1, 1, 1, 7},
      {step_kind::copy, buffer::input, buffer::output, -1, 2, 2, 1, 7},
      {step_kind::copy, buffer::input, buffer::output, -1, 3, 3, 1, 9},
  };
  std::vector<seen> got;
  for (const plan_round& r : rounds_of(steps))
    got.push_back({r.number, r.begin, r.end});
  const std::vector<seen> want = {{0, 0, 1}, {7, 1, 3}, {9, 3, 4}};
  EXPECT_EQ(got, want);
}

TEST(plan_walk, the_cursor_posts_sends_at_open_and_steps_through_the_rest) {
  // Round 0: a send after a local step, and a send last; round 1: only sends; round 2: a recv.
  plan pl = blank();
  pl.copy(buffer::input, 0, buffer::output, 0, 4); // 0
  pl.send(1, buffer::input, 0, 4);                 // 1
  pl.recv(3, buffer::scratch, 0, 4);               // 2
  pl.send(2, buffer::input, 4, 4);                 // 3
  pl.next_round();
  pl.send(1, buffer::output, 0, 4); // 4
  pl.next_round();
  pl.recv_reduce(3, buffer::output, 0, buffer::output, 0, 4); // 5
  plan_cursor c(pl.steps());

  ASSERT_FALSE(c.finished());
  EXPECT_FALSE(c.is_open());
  const plan_round r0 = c.open();
  EXPECT_TRUE(c.is_open());
  EXPECT_EQ(r0.number, 0u);
  EXPECT_EQ(r0.begin, 0u);
  EXPECT_EQ(r0.end, 4u); // the executor posts the sends among steps [0, 4)
  ASSERT_NE(c.current(), nullptr);
  EXPECT_EQ(c.index(), 0u);
  EXPECT_EQ(c.current()->kind, step_kind::copy);
  c.next();
  ASSERT_NE(c.current(), nullptr); // the send at 1 is passed over
  EXPECT_EQ(c.index(), 2u);
  EXPECT_EQ(c.current()->kind, step_kind::recv);
  c.next();
  EXPECT_EQ(c.current(), nullptr); // the send at 3 ends the round
  EXPECT_FALSE(c.finished());      // still open until its sends are consumed
  c.close();

  const plan_round r1 = c.open();
  EXPECT_EQ(r1.number, 1u);
  EXPECT_EQ(r1.begin, 4u);
  EXPECT_EQ(r1.end, 5u);
  EXPECT_EQ(c.current(), nullptr); // nothing but a send
  c.close();

  const plan_round r2 = c.open();
  EXPECT_EQ(r2.number, 2u);
  ASSERT_NE(c.current(), nullptr);
  EXPECT_EQ(c.current()->kind, step_kind::recv_reduce);
  c.next();
  EXPECT_EQ(c.current(), nullptr);
  EXPECT_FALSE(c.finished());
  c.close();
  EXPECT_TRUE(c.finished());
}

TEST(plan_walk, a_range_fits_without_wrapping) {
  EXPECT_TRUE(step_range_fits(0, 0, 0));
  EXPECT_TRUE(step_range_fits(0, 10, 10));
  EXPECT_TRUE(step_range_fits(10, 0, 10)); // an empty range at the end
  EXPECT_TRUE(step_range_fits(3, 7, 10));
  EXPECT_FALSE(step_range_fits(3, 8, 10));
  EXPECT_FALSE(step_range_fits(11, 0, 10));
  // offset + count would wrap to a small number: still outside.
  EXPECT_FALSE(step_range_fits(max, 2, 10));
  EXPECT_FALSE(step_range_fits(2, max, 10));
  EXPECT_FALSE(step_range_fits(max, max, max - 1));
  EXPECT_TRUE(step_range_fits(max - 1, 1, max));
  EXPECT_TRUE(step_range_fits(0, max, max));
  EXPECT_FALSE(step_range_fits(1, max, max));
}

TEST(plan_walk, plan_buffers_checks_the_range_and_names_it) {
  float in[8] = {};
  float out[4] = {};
  const plan_buffers<float> b{{in, out, nullptr}, {8, 4, 0}, "all_reduce", 2};
  EXPECT_EQ(b.at(buffer::input, 3, 5), in + 3);
  EXPECT_EQ(b.at(buffer::output, 4, 0), out + 4);
  EXPECT_EQ(b.at(buffer::scratch, 0, 0), nullptr);
  try {
    (void)b.at(buffer::output, 2, 3);
    ADD_FAILURE() << "a range past the output's end was accepted";
  } catch (const weft::error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("all_reduce"), std::string::npos) << what;
    EXPECT_NE(what.find("elements [2, 5) of a buffer of 4"), std::string::npos) << what;
  }
  EXPECT_THROW((void)b.at(buffer::input, max, 2), weft::error);
  EXPECT_THROW((void)b.at(buffer::scratch, 0, 1), weft::error);
}

} // namespace
