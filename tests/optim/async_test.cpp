// weft/comm/async.hpp: queued collectives on a progress thread give what the blocking calls
// give, in order, and hand their errors to wait().
#include "support/scale.hpp"

#include <weft/comm/async.hpp>
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

namespace {

using namespace weft;

TEST(async, collectives_match_the_serial_reference) {
  for (int p : {1, 2, 3, 4}) {
    local::run(p, [&](local::communicator& c) {
      async_communicator ac(c);
      const std::size_t n = 37;
      std::vector<std::int64_t> a(n), rs_in(n * static_cast<std::size_t>(p)), rs_out(n), ag_out(n * static_cast<std::size_t>(p));
      for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<std::int64_t>(i) * (c.rank() + 1);
      for (std::size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = static_cast<std::int64_t>(i) + c.rank();
      std::vector<work> ws;
      ws.push_back(all_reduce_async(ac, std::span(a)));
      ws.push_back(reduce_scatter_async(ac, std::span<const std::int64_t>(rs_in), std::span(rs_out)));
      ws.push_back(all_gather_async(ac, std::span<const std::int64_t>(rs_out), std::span(ag_out)));  // after the scatter
      c.barrier();  // the original communicator stays usable meanwhile
      for (auto& w : ws) w.wait();
      const std::int64_t ranks_sum = static_cast<std::int64_t>(p) * (p + 1) / 2;
      const std::int64_t rank_ids = static_cast<std::int64_t>(p) * (p - 1) / 2;
      for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(a[i], static_cast<std::int64_t>(i) * ranks_sum);
        EXPECT_EQ(rs_out[i], p * static_cast<std::int64_t>(n * static_cast<std::size_t>(c.rank()) + i) + rank_ids);
      }
      for (std::size_t i = 0; i < ag_out.size(); ++i) EXPECT_EQ(ag_out[i], p * static_cast<std::int64_t>(i) + rank_ids);
    });
  }
}

TEST(async, jobs_run_in_order_and_errors_reach_wait) {
  progress_queue q;
  std::vector<int> order;
  std::vector<work> ws;
  for (int i = 0; i < 50; ++i) ws.push_back(q.submit([&order, i] { order.push_back(i); }));
  work bad = q.submit([] { throw std::runtime_error("job failed"); });
  work after = q.submit([&order] { order.push_back(50); });
  EXPECT_THROW(bad.wait(), std::runtime_error);
  EXPECT_THROW(bad.wait(), std::runtime_error);  // every wait
  after.wait();
  ASSERT_EQ(order.size(), 51u);
  for (int i = 0; i <= 50; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
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
