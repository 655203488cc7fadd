#pragma once
// weft::mpi::environment: MPI's lifetime (MPI_Init_thread ... MPI_Finalize, or MPI_Abort when
// an exception unwinds past it) for a program that wants weft to start and end MPI.
#include <weft/comm/transport/detail/mpi_comm_handle.hpp>
#include <weft/comm/transport/detail/mpi_error.hpp>

#include <mpi.h>

#include <exception>

namespace weft::mpi {

/// Owns MPI's lifetime for a program that wants weft to start and end it.
///
/// The constructor calls MPI_Init_thread asking for `required` (MPI_THREAD_SERIALIZED by
/// default: weft calls MPI from one thread at a time); thread_level() says what MPI
/// provided. If MPI is already initialized, this object neither initializes nor finalizes.
///
/// The destructor calls MPI_Finalize, except when it runs while an exception unwinds the
/// stack past it: then it calls MPI_Abort(MPI_COMM_WORLD, 1), because the other processes
/// are likely blocked in a collective with this one, and MPI_Finalize would hang with them.
/// The launcher then ends every process of the job with that errorcode as its exit status;
/// Open MPI's mpirun prints
///   "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD with errorcode 1"
/// (Open MPI 4.1 sometimes loses that text when its output is not a terminal, and prints
/// an "ORTE_ERROR_LOG ... show_help.c" line instead).
/// The exception's own message is not printed by anyone on that path: to see it, catch it
/// inside the environment's scope, print it, and call abort() yourself.
class environment {
public:
  environment() : environment(nullptr, nullptr, MPI_THREAD_SERIALIZED) {}
  environment(int& argc, char**& argv, int required = MPI_THREAD_SERIALIZED)
      : environment(&argc, &argv, required) {}
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    if (!owns_ || !detail::mpi_alive()) return;
    if (std::uncaught_exceptions() > uncaught_) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  }

  /// The thread support MPI provides (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  [[nodiscard]] int thread_level() const noexcept { return provided_; }
  /// Whether this object initialized MPI (and so finalizes it).
  [[nodiscard]] bool owns() const noexcept { return owns_; }
  /// Ends every process of the job with `code` (MPI_Abort on MPI_COMM_WORLD).
  void abort(int code = 1) const noexcept { MPI_Abort(MPI_COMM_WORLD, code); }

private:
  environment(int* argc, char*** argv, int required) : uncaught_(std::uncaught_exceptions()) {
    int initialized = 0;
    WEFT_MPI_TRY(MPI_Initialized(&initialized));
    if (initialized != 0) {
      WEFT_MPI_TRY(MPI_Query_thread(&provided_));
      return;
    }
    WEFT_MPI_TRY(MPI_Init_thread(argc, argv, required, &provided_));
    owns_ = true;
  }

  int uncaught_ = 0;
  int provided_ = MPI_THREAD_SINGLE;
  bool owns_ = false;
};

} // namespace weft::mpi
