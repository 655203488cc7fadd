#pragma once
// weft::cuda::two_level_from_mpi: one process per GPU, the GPUs of each node joined by
// weft::cuda::p2p (peer loads over NVLink, CUDA IPC between the processes) and the GPUs of the
// same local index across nodes by NCCL, as one weft::cuda::two_level (cuda/two_level.cuh).
//
//   MPI_Init(&argc, &argv);
//   cudaSetDevice(local_rank);                               // each process on its GPU first
//   auto world = weft::cuda::two_level_from_mpi(MPI_COMM_WORLD);
//   weft::all_reduce(world, std::span(d_grad, n));           // automatic at both levels
//   weft::all_reduce<weft::algo::levels<weft::algo::direct, weft::algo::vendor>>(
//       world, std::span(d_grad, n));
//
// Nodes are MPI's shared-memory domains (MPI_Comm_split_type). The p2p level runs peer-access
// plans only: give IntraAlgo = direct or automatic (which picks direct there). Collective over
// `comm`, which is borrowed; the node and local-index communicators split from it are kept by
// the result and freed after its transports. Needs weft::mpi and weft::cuda.
#include <weft/comm/transport/mpi.hpp>
#include <weft/cuda/nccl_mpi.cuh>
#include <weft/cuda/p2p_mpi.cuh>
#include <weft/cuda/two_level.cuh>

#include <mpi.h>

#include <memory>
#include <utility>
#include <vector>

namespace weft::cuda {

using mpi_two_level = two_level<p2p::mpi_communicator, nccl::communicator>;

inline mpi_two_level two_level_from_mpi(MPI_Comm comm, two_level_options opt = {},
                                        p2p::options intra = {}, nccl::options inter = {}) {
  mpi::options world_options;
  world_options.timeout = inter.timeout;
  auto world = mpi::communicator::borrow(comm, world_options);
  const int rank = world.rank();
  const std::vector<int> node_of = world.node_of(); // the shared-memory domains
  // Nodes numbered by their first rank, ranks inside a node in world order.
  const int color = weft::detail::node_color(node_of, rank);
  struct held_comms {
    mpi::communicator node;
    mpi::communicator local;
  };
  auto node = world.split(color, rank);
  auto local = world.split(node.rank(), color);
  auto held = std::make_shared<held_comms>(held_comms{std::move(node), std::move(local)});
  auto p2p_comm = p2p::from_mpi(held->node.native(), intra);
  // One NCCL rank per node at this local index; NCCL's stream is its own (made by init_rank).
  std::vector<int> one_per_node(static_cast<std::size_t>(held->local.size()));
  for (std::size_t i = 0; i < one_per_node.size(); ++i)
    one_per_node[i] = static_cast<int>(i);
  if (!inter.topology && inter.node_of.empty()) inter.node_of = one_per_node;
  auto nccl_comm = nccl::from_mpi(held->local.native(), nullptr, inter);
  return mpi_two_level(std::move(p2p_comm), std::move(nccl_comm), node_of, rank, opt,
                       stream_runtime{}, std::shared_ptr<const void>(held, held.get()));
}

} // namespace weft::cuda
