// A check of mpi_peer::time_calls (run under mpirun with 2 or more processes): a run lasts until
// its slowest rank is done, so the time reported must cover that rank, on every rank. The last
// rank sleeps in each call while the others return at once, as a broadcast's root does; no
// collective ties them inside the timed loop.
#include "peers/mpi_peer.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    std::fprintf(stderr, "mpi_peer_test: needs 2 or more processes, has %d\n", size);
    MPI_Finalize();
    return 1;
  }
  constexpr double nap_s = 0.02;
  const double s = weft::bench::mpi_peer::time_calls(MPI_COMM_WORLD, 2, 2, [&] {
    if (rank == size - 1) std::this_thread::sleep_for(std::chrono::duration<double>(nap_s));
  });
  int failures = 0;
  if (s < nap_s) {
    std::fprintf(stderr,
                 "mpi_peer_test: rank %d: time_calls gave %.3f ms per call, but rank %d slept %.0f "
                 "ms in each\n",
                 rank, s * 1e3, size - 1, nap_s * 1e3);
    ++failures;
  }
  double lo = s;
  double hi = s;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && lo != hi) {
    std::fprintf(stderr, "mpi_peer_test: the ranks disagree: %.3f to %.3f ms per call\n", lo * 1e3,
                 hi * 1e3);
    ++failures;
  }
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && failures == 0) {
    std::printf("mpi_peer_test: time_calls reports the slowest rank (%.1f ms per call): OK\n",
                s * 1e3);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
