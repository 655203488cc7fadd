#pragma once
// What the MPI tests share: the world communicator of the test process, and the check that
// every process ended with bitwise identical output (the multi-process counterpart of
// test::expect_identical, which compares through shared memory).
#include <weft/comm/transport/mpi.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace weft::test {

/// Long enough for 8 processes on 2 cores, short enough that a broken plan fails the test
/// instead of stalling it.
inline constexpr std::chrono::milliseconds mpi_test_timeout = std::chrono::seconds(60);

/// The processes' world communicator (WEFT_TOPOLOGY applies, when ctest sets it).
inline mpi::communicator& mpi_world() {
  static mpi::communicator w = mpi::world({.timeout = mpi_test_timeout, .topology = {}});
  return w;
}

/// Every process of c compares a fingerprint of its output's bits with everyone's, through
/// plain MPI (not weft), and rank r != 0 fails if its differs from rank 0's.
template <class T>
void expect_identical_across_processes(mpi::communicator& c, const std::vector<T>& mine,
                                       const std::string& what) {
  std::uint64_t h = 1469598103934665603ull ^ mine.size();
  std::vector<unsigned char> bytes(mine.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), mine.data(), bytes.size());
  for (unsigned char b : bytes)
    h = (h ^ b) * 1099511628211ull;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(c.size()));
  ASSERT_EQ(MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, c.native()),
            MPI_SUCCESS);
  EXPECT_EQ(all[static_cast<std::size_t>(c.rank())], all[0])
      << what << ": rank " << c.rank() << " differs from rank 0";
}

} // namespace weft::test
