#pragma once
// weft::two_level<Intra, Inter>: one group of ranks as two communicators, possibly of two
// transports: Intra joins the ranks of each node, Inter the ranks of the same local index
// across nodes. On GPUs that is the fast path hierarchical<> describes with one transport,
// but with each level on the transport that suits its link: peer loads over NVLink
// (weft::cuda::p2p) inside a node and NCCL over InfiniBand across nodes.
//
//   // p2p + NCCL (cuda/two_level_mpi.cuh), queued on world.stream():
//   auto world = weft::cuda::two_level_from_mpi(MPI_COMM_WORLD);
//   weft::all_reduce(world, std::span(d_grad, n));
//   using weft::algo::direct, weft::algo::vendor;
//   weft::all_reduce<weft::algo::levels<direct, vendor>>(world, std::span(d_grad, n));
//   auto host = weft::make_two_level(local_world);  // one transport, split by node
//
// The pieces, one concept each, under comm/two_level/:
//   levels.hpp        algo::levels<IntraAlgo, InterAlgo>: the tag naming each level's algorithm
//   scratch_pool.hpp  host working memory kept between calls
//   host_runtime.hpp    host_runtime: level order, working memory, copies and op::avg's division
//                     on the host (cuda/two_level.cuh's stream_runtime on GPUs)
//   communicator.hpp  the two_level class (its protocol described), and make_two_level
//   chunked.hpp       its all_reduce, broadcast and reduce by chunks cut into blocks
//   rank_blocks.hpp   its reduce_scatter and all_gather by rank blocks
//   uniform_nodes.hpp its one-call-per-level paths where every node holds as many ranks
//   collectives.hpp   all_reduce, reduce_scatter, all_gather, broadcast and reduce on it
#include <weft/comm/two_level/chunked.hpp>
#include <weft/comm/two_level/collectives.hpp>
#include <weft/comm/two_level/communicator.hpp>
#include <weft/comm/two_level/host_runtime.hpp>
#include <weft/comm/two_level/levels.hpp>
#include <weft/comm/two_level/rank_blocks.hpp>
#include <weft/comm/two_level/scratch_pool.hpp>
#include <weft/comm/two_level/uniform_nodes.hpp>
