#pragma once
// A p2p communicator over the processes of one node: each process allocates its workspace on
// its current CUDA device, and the processes trade CUDA IPC handles over MPI, then load from
// each other's workspaces as the threads of p2p::run do (weft/cuda/p2p.cuh).
//
//   weft::mpi::environment env(argc, argv);
//   MPI_Comm node;                                      // the processes of this node
//   MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
//   cudaSetDevice(local_rank % device_count);           // each process picks its GPU first
//   auto gpus = weft::cuda::p2p::from_mpi(node);
//   weft::all_reduce<weft::algo::direct>(gpus, std::span(grad_d, n));   // on gpus.stream()
//
// Destruction is collective: a communicator's destructor syncs with every rank on the device
// and frees its workspace once that sync shows no peer will read it again (destroy the
// communicators at the same point in every process, as with MPI_Comm_free). A communicator
// destroyed while an exception unwinds, or after it failed (a sync gave up, a host deadline,
// a failure of its family), leaves its workspace allocated instead: a peer may still use it,
// and such a process is ending anyway.
// Needs both weft::mpi and weft::cuda (link both targets).
#include <weft/comm/transport/detail/mpi_error.hpp>
#include <weft/comm/transport/mpi.hpp>
#include <weft/cuda/p2p.cuh>
#include <weft/topology/topology.hpp>

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>

namespace weft::cuda::detail {

/// on_failure::abort_job's end for a job of MPI processes: every process, not this one alone.
inline void p2p_mpi_end_job() noexcept { MPI_Abort(MPI_COMM_WORLD, 1); }

} // namespace weft::cuda::detail

namespace weft::cuda::p2p {

/// Ranks as processes, trading their host messages over MPI.
using mpi_communicator = basic_communicator<mpi::communicator>;

/// A communicator of the processes of `node_comm`, p2p rank r being its rank r, each on the
/// calling process's current CUDA device. Every process must be on this node (weft::error
/// otherwise: IPC handles do not cross nodes), and every device must have peer access to the
/// others' (or be the same device). Collective over `node_comm`, which is borrowed (never
/// freed); the MPI waits have opt.timeout as their deadline. Under on_failure::abort_job a
/// failure ends the job with MPI_Abort (unless opt.end_job says otherwise), after weft's message.
inline mpi_communicator from_mpi(MPI_Comm node_comm, options opt = {}) {
  constexpr std::string_view who = "cuda::p2p::from_mpi";
  detail::p2p_check_options(opt.workspace_bytes, opt.sync_timeout, opt.timeout, who);
  if (opt.end_job == nullptr) opt.end_job = detail::p2p_mpi_end_job;
  int rank = 0;
  int size = 0;
  WEFT_MPI_TRY(MPI_Comm_rank(node_comm, &rank), who);
  WEFT_MPI_TRY(MPI_Comm_size(node_comm, &size), who, rank);
  if (size > detail::p2p_max_ranks) {
    throw error(who, rank, error::unknown,
                std::to_string(size) + " processes; a p2p communicator has at most " +
                    std::to_string(detail::p2p_max_ranks));
  }
  MPI_Comm shared = MPI_COMM_NULL;
  WEFT_MPI_TRY(MPI_Comm_split_type(node_comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared),
               who, rank);
  int on_this_node = 0;
  const int rc = MPI_Comm_size(shared, &on_this_node);
  MPI_Comm_free(&shared);
  WEFT_MPI_TRY(rc, who, rank);
  if (on_this_node != size) { // the same answer on every process, so all of them throw
    throw error(who, rank, error::unknown,
                "the communicator spans several nodes (this one holds " +
                    std::to_string(on_this_node) + " of its " + std::to_string(size) +
                    " processes), and CUDA IPC works within a node: give the processes of one "
                    "node, e.g. from "
                    "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  }
  if (const std::string why = no_device_reason(); !why.empty())
    throw error(who, rank, error::unknown, why);
  int device = 0;
  WEFT_CUDA_TRY(cudaGetDevice(&device));
  // One node of NVLink-joined devices, rank r on device r, whatever WEFT_TOPOLOGY says.
  const topology::cluster node({size}, topology::default_link(topology::link_kind::nvlink),
                               topology::default_link(topology::link_kind::infiniband));
  auto host = std::make_unique<mpi::communicator>(
      mpi::communicator::borrow(node_comm, {.timeout = opt.timeout, .topology = node}));
  return detail::p2p_factory::make<mpi::communicator>(
      static_cast<mpi::communicator*>(nullptr), std::move(host), device, opt,
      std::shared_ptr<detail::p2p_world>(), cudaStream_t{}, who);
}

} // namespace weft::cuda::p2p
