#pragma once
// An MPI_Comm that is freed on destruction when weft owns it, and never when it is the
// user's. Freeing is skipped once MPI is finalized: a communicator that outlives
// MPI_Finalize has nothing left to release.
#include <mpi.h>

#include <utility>

namespace weft::detail {

/// Whether MPI calls may be made now: initialized and not yet finalized.
inline bool mpi_alive() noexcept {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

class mpi_comm_handle {
public:
  mpi_comm_handle() = default;
  mpi_comm_handle(MPI_Comm comm, bool owned) noexcept : comm_(comm), owned_(owned) {}
  mpi_comm_handle(mpi_comm_handle&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), owned_(std::exchange(o.owned_, false)) {}
  mpi_comm_handle& operator=(mpi_comm_handle&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      owned_ = std::exchange(o.owned_, false);
    }
    return *this;
  }
  mpi_comm_handle(const mpi_comm_handle&) = delete;
  mpi_comm_handle& operator=(const mpi_comm_handle&) = delete;
  ~mpi_comm_handle() { release(); }

  [[nodiscard]] MPI_Comm get() const noexcept { return comm_; }
  [[nodiscard]] bool owned() const noexcept { return owned_; }
  /// Never frees the communicator from now on (a failed family's: see mpi_family.hpp).
  void keep() noexcept { owned_ = false; }

private:
  void release() noexcept {
    if (owned_ && comm_ != MPI_COMM_NULL && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF &&
        mpi_alive()) {
      MPI_Comm_free(&comm_);
    }
    comm_ = MPI_COMM_NULL;
    owned_ = false;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
};

} // namespace weft::detail
