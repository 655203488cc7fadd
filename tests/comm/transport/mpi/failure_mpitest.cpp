// A job in which one process fails inside a collective must end, promptly and saying why,
// instead of leaving the other processes waiting until CI's limit. ctest runs each mode
// under mpirun with a 60 s limit and looks for the message the user would see.
//
//   failure_mpitest throw    rank 1's reduction throws inside all_reduce, under
//                            on_failure::throw_error; main catches the weft::error, prints it
//                            and calls environment::abort (the pattern weft documents)
//   failure_mpitest stall    rank 1 never joins the collective; the others' 2 s deadline
//                            passes, and under the default on_failure::abort_job weft prints
//                            their error naming the peer and the culprit, then ends the job
//   failure_mpitest unwind   rank 1's exception leaves the environment's scope uncaught;
//                            its destructor calls MPI_Abort, and the launcher ends the job
//   failure_mpitest die      rank 1's process dies inside the second all_reduce (_Exit, no
//                            MPI_Finalize, as a crash or the OOM killer would end it): the
//                            launcher or the others' 2 s deadline ends the job, never a hang
#include <weft/comm/transport/mpi.hpp>
#include <weft/weft.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

// A sum that throws on the rank told to fail.
struct failing_sum {
  int rank = -1;
  bool fail = false;
  template <class A>
  A operator()(A a, A b) const {
    if (fail)
      throw weft::error("all_reduce", rank, weft::error::unknown,
                        "the reduction failed on purpose");
    return a + b;
  }
};

void steps(weft::mpi::communicator& world, const std::string& mode) {
  std::vector<float> grad(std::size_t{1} << 16, 1.0f);
  for (int step = 0; step < 3; ++step) {
    const bool culprit = world.rank() == 1 && step == 1;
    if (mode == "stall" && culprit) {
      std::this_thread::sleep_for(60s); // never joins; the job is over long before this ends
      continue;
    }
    if (mode == "die" && culprit) {
      std::fflush(nullptr);
      std::_Exit(7);
    }
    weft::all_reduce<weft::algo::ring>(
        world, std::span(grad),
        failing_sum{world.rank(), (mode == "throw" || mode == "unwind") && culprit});
  }
}

} // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "throw" && mode != "stall" && mode != "unwind" && mode != "die") {
    std::fprintf(stderr, "usage: failure_mpitest throw|stall|unwind|die\n");
    return 2;
  }
  if (mode == "unwind") {
    try {
      weft::mpi::environment env(argc, argv);
      auto world = weft::mpi::world({.timeout = 20s, .topology = {}});
      steps(world, mode);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "not reached: the environment aborts the job first (%s)\n", e.what());
      return 3;
    }
    return 0;
  }
  weft::mpi::environment env(argc, argv);
  try {
    auto world = weft::mpi::world({.timeout = 2s,
                                   .topology = {},
                                   .on_failure = mode == "throw" ? weft::on_failure::throw_error
                                                                 : weft::on_failure::abort_job});
    steps(world, mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stderr);
    env.abort(3);
  }
  return 0;
}
