#pragma once
// weft's element types on the device: weft::half and weft::bfloat16 have the layouts of
// CUDA's __half and __nv_bfloat16, so device buffers convert by reinterpretation, and NCCL
// sees each type as its own ncclDataType_t.
#include <weft/core/types.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <nccl.h>

#include <cstdint>
#include <type_traits>

namespace weft::cuda {

/// The CUDA type with T's layout: __half for weft::half, __nv_bfloat16 for weft::bfloat16,
/// T itself otherwise.
template <class T>
struct device_type {
  using type = T;
};
template <>
struct device_type<half> {
  using type = __half;
};
template <>
struct device_type<bfloat16> {
  using type = __nv_bfloat16;
};
template <class T>
using device_type_t = typename device_type<T>::type;

static_assert(sizeof(__half) == sizeof(half) && alignof(__half) >= alignof(half));
static_assert(sizeof(__nv_bfloat16) == sizeof(bfloat16) &&
              alignof(__nv_bfloat16) >= alignof(bfloat16));

/// NCCL's name for a weft element type.
constexpr ncclDataType_t nccl_type(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
    case dtype::int32: return ncclInt32;
    case dtype::int64: return ncclInt64;
  }
  return ncclFloat32;
}

template <element T>
inline constexpr ncclDataType_t nccl_type_of = nccl_type(dtype_of<T>);

} // namespace weft::cuda
