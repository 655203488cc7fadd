#pragma once
// The MPI datatype that carries each weft element type. half and bfloat16 travel as
// 2-byte integers: MPI only moves them, weft's kernels reduce them (in float), so no MPI
// datatype or MPI_Op for them is needed.
#include <weft/core/half.hpp>
#include <weft/core/types.hpp>

#include <mpi.h>

#include <cstdint>
#include <type_traits>

namespace weft::detail {

template <element T>
MPI_Datatype mpi_datatype() noexcept {
  using U = std::remove_cv_t<T>;
  // Functions, not constants: MPI's datatype handles need not be constant expressions.
  if constexpr (std::is_same_v<U, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<U, double>) {
    return MPI_DOUBLE;
  } else if constexpr (std::is_same_v<U, std::int32_t>) {
    return MPI_INT32_T;
  } else if constexpr (std::is_same_v<U, std::int64_t>) {
    return MPI_INT64_T;
  } else {
    static_assert(std::is_same_v<U, half> || std::is_same_v<U, bfloat16>,
                  "weft::mpi: no MPI datatype for this element type");
    static_assert(sizeof(U) == 2);
    return MPI_UINT16_T;
  }
}

} // namespace weft::detail
