#pragma once
// An NCCL communicator over the processes of an MPI communicator: MPI is the bootstrap
// (rank 0 makes the ncclUniqueId and broadcasts it) and tells which processes share a node.
//
//   weft::mpi::environment env(argc, argv);
//   cudaSetDevice(local_rank % device_count);        // each process picks its GPU first
//   auto gpus = weft::cuda::nccl::from_mpi(MPI_COMM_WORLD);
//   weft::all_reduce(gpus, std::span(grad_d, n));    // device buffers, on gpus.stream()
//
// Needs both weft::mpi and weft::cuda (link both targets).
#include <weft/comm/transport/mpi.hpp>
#include <weft/cuda/nccl.cuh>

#include <mpi.h>
#include <nccl.h>

#include <span>

namespace weft::cuda::detail {

/// on_failure::abort_job's end for a job of MPI processes: every process, not this one alone.
inline void nccl_mpi_end_job() noexcept { MPI_Abort(MPI_COMM_WORLD, 1); }

} // namespace weft::cuda::detail

namespace weft::cuda::nccl {

/// A communicator of the processes of `comm`, NCCL rank r being MPI rank r, each on the
/// calling process's current CUDA device (set it before the call: NCCL needs one device per
/// rank). `stream` is borrowed; nullptr makes one of the communicator's own. Nodes are the
/// real ones (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)) unless opt.topology or WEFT_TOPOLOGY
/// emulates others, or opt.node_of is given. Collective over `comm`; the MPI waits and the
/// (non-blocking) NCCL initialization have opt.timeout as their deadline. Under
/// on_failure::abort_job a failure ends the job with MPI_Abort (unless opt.end_job says
/// otherwise), after weft's message.
inline communicator from_mpi(MPI_Comm comm, cudaStream_t stream = nullptr, options opt = {}) {
  mpi::options mpi_options;
  mpi_options.timeout = opt.timeout;
  auto m = mpi::communicator::borrow(comm, mpi_options);
  ncclUniqueId id{};
  if (m.rank() == 0) {
    detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", "nccl::from_mpi", m.rank());
  }
  mpi::broadcast_bytes(m, std::as_writable_bytes(std::span(&id, 1)), 0);
  // Every rank holds the id before any blocks in ncclCommInitRank: the root's broadcast may
  // complete locally while an MPI that progresses only inside its calls has not delivered it.
  m.barrier();
  if (!opt.topology && opt.node_of.empty()) opt.node_of = m.node_of();
  if (opt.end_job == nullptr) opt.end_job = detail::nccl_mpi_end_job;
  return communicator::init_rank(id, m.rank(), m.size(), stream, opt);
}

} // namespace weft::cuda::nccl
