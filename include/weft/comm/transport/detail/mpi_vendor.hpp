#pragma once
// What weft::mpi's algo::vendor hands MPI: which element types and operators MPI reduces with
// its own datatypes and MPI_Ops, and how a call's buffers map onto MPI's collective (in place
// where MPI can run it in place, through a copy of weft's own where the buffers overlap
// otherwise).
#include <weft/comm/detail/argument_checks.hpp>
#include <weft/core/ops.hpp>
#include <weft/core/types.hpp>

#include <mpi.h>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace weft::detail {

/// The element types MPI reduces itself (half and bfloat16 have no MPI datatype that MPI's
/// operators reduce: weft's plans reduce them).
template <class T>
concept mpi_vendor_type = std::same_as < std::remove_cv_t<T>,
float > || std::same_as<std::remove_cv_t<T>, double> ||
    std::same_as<std::remove_cv_t<T>, std::int32_t> ||
    std::same_as<std::remove_cv_t<T>, std::int64_t>;

/// The operators MPI has built in: sum, prod, min, max; avg as MPI_SUM, then divided by the
/// ranks (in the accumulation type, as weft's plans finish it). A user functor has no MPI_Op.
template <class Op>
concept mpi_vendor_op = std::same_as<Op, op::sum> || std::same_as<Op, op::prod> ||
    std::same_as<Op, op::min> || std::same_as<Op, op::max> || std::same_as<Op, op::avg>;

/// MPI's operator for a weft operator.
template <mpi_vendor_op Op>
MPI_Op mpi_op_of() noexcept {
  // A function, not a constant: MPI's handles need not be constant expressions.
  if constexpr (std::same_as<Op, op::prod>) {
    return MPI_PROD;
  } else if constexpr (std::same_as<Op, op::min>) {
    return MPI_MIN;
  } else if constexpr (std::same_as<Op, op::max>) {
    return MPI_MAX;
  } else {
    return MPI_SUM; // sum, and avg before its division
  }
}

/// How a vendor call's buffers go to MPI.
enum class mpi_vendor_buffers {
  apart,    // the caller's input and output, as they are
  in_place, // MPI_IN_PLACE: the input already sits where MPI expects it in the output
  staged,   // the input overlaps the output otherwise: copied to weft's memory first
};

/// The way for collective C with `in` of in_bytes and `out` of out_bytes on `rank` (as the
/// vendor call gives them; block_bytes: one rank's block of an all_gather's output).
/// MPI runs in place only where the input is the output (all_reduce, reduce at the root) or
/// the rank's own block of it (all_gather); broadcast has one buffer and needs neither.
inline mpi_vendor_buffers mpi_vendor_layout(collective c, const void* in, std::size_t in_bytes,
                                            const void* out, std::size_t out_bytes, int rank,
                                            int root, std::size_t block_bytes) noexcept {
  const auto* i = static_cast<const std::byte*>(in);
  const auto* o = static_cast<const std::byte*>(out);
  if (c == collective::broadcast) return mpi_vendor_buffers::apart;
  if (c == collective::reduce && rank != root) return mpi_vendor_buffers::apart; // no output
  if ((c == collective::all_reduce || c == collective::reduce) && i == o)
    return mpi_vendor_buffers::in_place;
  if (c == collective::all_gather && i == o + static_cast<std::size_t>(rank) * block_bytes)
    return mpi_vendor_buffers::in_place;
  return overlap(in, in_bytes, out, out_bytes) ? mpi_vendor_buffers::staged
                                               : mpi_vendor_buffers::apart;
}

} // namespace weft::detail
