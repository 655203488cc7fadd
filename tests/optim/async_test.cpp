// weft/comm/async.hpp: queued collectives on a progress thread give what the blocking calls
// give, in order, and hand their errors to wait().
#include <weft/comm/async.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/scale.hpp"

namespace {

using namespace weft;

TEST(async, collectives_match_the_serial_reference) {
  for (int p : {1, 2, 3, 4}) {
    local::run(p, [&](local::communicator& c) {
      async_communicator ac(c);
      const std::size_t n = 37;
      std::vector<std::int64_t> a(n), rs_in(n * static_cast<std::size_t>(p)), rs_out(n),
          ag_out(n * static_cast<std::size_t>(p));
      for (std::size_t i = 0; i < n; ++i)
        a[i] = static_cast<std::int64_t>(i) * (c.rank() + 1);
      for (std::size_t i = 0; i < rs_in.size(); ++i)
        rs_in[i] = static_cast<std::int64_t>(i) + c.rank();
      std::vector<work> ws;
      ws.push_back(all_reduce_async(ac, std::span(a)));
      ws.push_back(
          reduce_scatter_async(ac, std::span<const std::int64_t>(rs_in), std::span(rs_out)));
      ws.push_back(all_gather_async(ac, std::span<const std::int64_t>(rs_out),
                                    std::span(ag_out))); // after the scatter
      c.barrier(); // the original communicator stays usable meanwhile
      for (auto& w : ws)
        w.wait();
      const std::int64_t ranks_sum = static_cast<std::int64_t>(p) * (p + 1) / 2;
      const std::int64_t rank_ids = static_cast<std::int64_t>(p) * (p - 1) / 2;
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(a[i], static_cast<std::int64_t>(i) * ranks_sum);
        EXPECT_EQ(
            rs_out[i],
            p * static_cast<std::int64_t>(n * static_cast<std::size_t>(c.rank()) + i) + rank_ids);
      }
      for (std::size_t i = 0; i < ag_out.size(); ++i)
        EXPECT_EQ(ag_out[i], p * static_cast<std::int64_t>(i) + rank_ids);
    });
  }
}

// Jobs run in order; a failure reaches every wait() of its job, and the jobs queued after it
// fail without running (the queue carries collectives: see the next tests), naming the first
// failure. Both the progress thread and inline execution.
TEST(async, jobs_run_in_order_and_a_failure_stops_the_later_jobs) {
  for (const bool inline_execution : {false, true}) {
    progress_queue q(inline_execution);
    std::vector<int> order;
    std::vector<work> ws;
    for (int i = 0; i < 50; ++i)
      ws.push_back(q.submit([&order, i] { order.push_back(i); }));
    work bad = q.submit([] { throw std::runtime_error("job 50 failed"); });
    work after = q.submit([&order] { order.push_back(51); });
    for (auto& w : ws)
      w.wait();
    EXPECT_THROW(bad.wait(), std::runtime_error);
    EXPECT_THROW(bad.wait(), std::runtime_error); // every wait
    try {
      after.wait();
      ADD_FAILURE() << "a job queued after a failed one ran";
    } catch (const error& e) {
      EXPECT_NE(
          std::string(e.what()).find("an earlier queued job failed on this rank (job 50 failed)"),
          std::string::npos)
          << e.what();
    }
    ASSERT_EQ(order.size(), 50u) << "inline " << inline_execution;
    for (int i = 0; i < 50; ++i)
      EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  }
  EXPECT_TRUE(work{}.done());
}

TEST(async, bad_arguments_throw_weft_error_on_wait) {
  local::run(2, [](local::communicator& c) {
    async_communicator ac(c);
    std::vector<float> in(5), out(2);
    work w = reduce_scatter_async(ac, std::span<const float>(in), std::span(out));
    EXPECT_THROW(w.wait(), error);
  });
}

// A job that fails on one rank only (a bad buffer: it sends nothing) must not let the next job
// pair with the peers' previous one: later jobs on that rank fail instead of finishing with
// another call's data, and the peers are told, not left with wrong results.
TEST(async, after_a_failed_job_later_jobs_fail_instead_of_pairing_with_other_calls) {
  std::vector<std::string> second(2), first(2);
  std::vector<std::vector<int>> got(2);
  local::run(2, [&](local::communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    async_communicator ac(c);
    const std::vector<int> in1(2, 100 + c.rank()), in2(2, 200 + c.rank());
    std::vector<int> out1(c.rank() == 0 ? 3 : 4), out2(4); // rank 0's first output is too short
    work w1 = all_gather_async(ac, std::span<const int>(in1), std::span(out1));
    work w2 = all_gather_async(ac, std::span<const int>(in2), std::span(out2));
    try {
      w1.wait();
      got[r] = out1;
    } catch (const error& e) {
      first[r] = e.what();
    }
    try {
      w2.wait();
      got[r] = out2;
    } catch (const error& e) {
      second[r] = e.what();
    }
  });
  EXPECT_NE(first[0].find("all_gather"), std::string::npos) << first[0];
  EXPECT_NE(second[0].find("an earlier queued job failed on this rank"), std::string::npos)
      << second[0];
  // Rank 1's calls find no partner (rank 0 sent nothing): errors, not rank 0's second call's data.
  EXPECT_FALSE(first[1].empty()) << "rank 1 finished its first all-gather with {" << got[1][0]
                                 << ", ...}";
  EXPECT_FALSE(second[1].empty());
}

TEST(async, inline_execution_runs_on_the_callers_thread) {
  local::run(2, [](local::communicator& c) {
    async_communicator ac(c, /*inline_execution=*/true);
    std::vector<float> v(8, 1.0f);
    work w = all_reduce_async(ac, std::span(v));
    EXPECT_TRUE(w.done());
    EXPECT_EQ(v[7], 2.0f);
  });
}

} // namespace
