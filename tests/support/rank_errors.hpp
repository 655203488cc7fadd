#pragma once
// Runs a body on the ranks of weft::local::run, where the run is meant to fail, and keeps what
// each rank's weft::error said: the tests of desync detection, the watchdog and failure
// propagation check that every rank (or every waiting rank) names the culprit.
#include <weft/comm/transport/local.hpp>
#include <weft/core/error.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace weft::test {

/// Runs body(communicator&) on p ranks with options opt; the run must throw weft::error (a
/// failed expectation otherwise). Returns each rank's message: what the weft::error that left
/// its body said, empty where its body returned (or threw something else). The timeout bounds
/// a test that would otherwise hang; a body may set its own.
template <class Body>
std::vector<std::string> rank_errors(int p, Body body,
                                     local::options opt = {.timeout = std::chrono::seconds(30)}) {
  std::vector<std::string> seen(static_cast<std::size_t>(p));
  EXPECT_THROW(local::run(
                   p,
                   [&](local::communicator& c) {
                     try {
                       body(c);
                     } catch (const error& e) {
                       seen[static_cast<std::size_t>(c.rank())] = e.what();
                       throw;
                     }
                   },
                   opt),
               error);
  return seen;
}

} // namespace weft::test
