// main() of the MPI test programs: every process runs the same GoogleTest tests; only rank 0
// prints the usual output, the other ranks print only their failures, prefixed with their
// rank; and every process exits non-zero when any rank had a failure, so mpirun and ctest
// see it whichever rank it was.
#include <weft/comm/transport/mpi.hpp>

#include <gtest/gtest.h>

#include <cstdio>

namespace {

class failures_only : public ::testing::EmptyTestEventListener {
public:
  explicit failures_only(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[ rank %d ] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() != nullptr ? r.file_name() : "?", r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[ rank %d ] FAILED %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

private:
  int rank_;
};

} // namespace

int main(int argc, char** argv) {
  weft::mpi::environment env(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new failures_only(rank));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any != 0 && failed == 0) {
    std::fprintf(stderr, "[weft] tests failed on another rank (see its [ rank N ] lines)\n");
  }
  return any;
}
