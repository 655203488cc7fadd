// local::run when a rank's thread cannot start (a thread or pid limit below the rank count):
// a weft::error naming the rank and the count, at once, where the ranks already started used
// to wait for the others until the watchdog fired (5 minutes by default) or forever without
// it, and then a bare std::system_error escaped. Run with fail_pthread_create preloaded.
#include <weft/comm/transport/local.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>

namespace {

using namespace std::chrono_literals;

void expect_a_prompt_clear_error(weft::local::options opt) {
  const auto start = std::chrono::steady_clock::now();
  try {
    weft::local::run(
        8, [](weft::local::communicator& c) { c.barrier(); }, opt);
    ADD_FAILURE() << "local::run returned although ranks could not start";
  } catch (const weft::error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("could not start a thread for rank "), std::string::npos) << m;
    EXPECT_NE(m.find(" of 8 "), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

TEST(thread_start, a_rank_whose_thread_cannot_start_fails_the_run_at_once) {
  ASSERT_NE(std::getenv("WEFT_FAIL_THREADS_AFTER"), nullptr)
      << "run with fail_pthread_create preloaded";
  expect_a_prompt_clear_error({.timeout = 120s});
}

TEST(thread_start, also_without_the_watchdog) {
  expect_a_prompt_clear_error({.timeout = 120s, .watchdog = false});
}

} // namespace
