#pragma once
// vendor: no plan of weft's own; the call goes to the transport's own collective (NCCL's
// ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast, ncclReduce, and grouped
// ncclSend/ncclRecv for all_to_all; MPI's MPI_Iallreduce and its kin), so a program can
// compare weft's schedules with the library it would otherwise call, or fall back to it, by
// changing one tag:
//
//   weft::all_reduce<weft::algo::ring>(nccl_comm, std::span(grad));     // weft's plan on NCCL p2p
//   weft::all_reduce<weft::algo::vendor>(nccl_comm, std::span(grad));   // ncclAllReduce itself
//
// A communicator offers it with a member template
//   comm.template vendor<C>(in, in_n, out, out_n, count, root, op)
// (buffers and counts as plan.hpp's table gives them): weft::cuda::nccl's is NCCL's,
// weft::mpi's MPI's own nonblocking collectives (MPI_Iallreduce, ...; MPI's built-in types
// and operators only). A call without one (weft::local; weft::mpi with half or a user
// functor) fails to compile with a message naming what to use instead. The vendor call
// finishes op::avg itself (NCCL's ncclAvg; MPI_SUM then a division on weft::mpi), so the
// operation does not divide again. Its operators are the vendor's: user functors do not
// compile, and results follow the vendor's reduction order, not weft's fixed one.
#include <weft/comm/algorithm/capabilities.hpp>

#include <string_view>

namespace weft::algo {

struct vendor {
  static constexpr std::string_view name = "vendor";
  /// No plan of weft's: what it needs is the communicator's own collective (vendor_collective).
  static constexpr capabilities caps{.serves = every_collective, .messages = false};

  static constexpr bool serves(collective c) { return caps.serves.contains(c); }
};

} // namespace weft::algo
