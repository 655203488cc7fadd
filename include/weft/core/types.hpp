#pragma once
// Element types weft moves and reduces, and their traits. Plans are not templated on the
// element type (they count elements); only the kernels that touch data are.
#include <weft/core/half.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace weft {

enum class dtype : std::uint8_t { float32, float64, float16, bfloat16, int32, int64 };

template <class T>
struct dtype_traits; // defined only for the element types weft supports

template <>
struct dtype_traits<float> {
  static constexpr dtype id = dtype::float32;
  static constexpr std::string_view name = "float";
  using accumulate = float;
};
template <>
struct dtype_traits<double> {
  static constexpr dtype id = dtype::float64;
  static constexpr std::string_view name = "double";
  using accumulate = double;
};
template <>
struct dtype_traits<half> {
  static constexpr dtype id = dtype::float16;
  static constexpr std::string_view name = "half";
  using accumulate = float; // low precision accumulates in float
};
template <>
struct dtype_traits<bfloat16> {
  static constexpr dtype id = dtype::bfloat16;
  static constexpr std::string_view name = "bfloat16";
  using accumulate = float;
};
template <>
struct dtype_traits<std::int32_t> {
  static constexpr dtype id = dtype::int32;
  static constexpr std::string_view name = "int32";
  using accumulate = std::int32_t;
};
template <>
struct dtype_traits<std::int64_t> {
  static constexpr dtype id = dtype::int64;
  static constexpr std::string_view name = "int64";
  using accumulate = std::int64_t;
};

/// An element type weft can move and reduce.
template <class T>
concept element = requires {
  dtype_traits<std::remove_cv_t<T>>::id;
};

template <element T>
using accumulate_t = typename dtype_traits<std::remove_cv_t<T>>::accumulate;

template <element T>
inline constexpr dtype dtype_of = dtype_traits<std::remove_cv_t<T>>::id;

constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return 4;
    case dtype::float64: return 8;
    case dtype::float16: return 2;
    case dtype::bfloat16: return 2;
    case dtype::int32: return 4;
    case dtype::int64: return 8;
  }
  return 0;
}

constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float";
    case dtype::float64: return "double";
    case dtype::float16: return "half";
    case dtype::bfloat16: return "bfloat16";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
  }
  return "?";
}

static_assert(size_of(dtype::float16) == sizeof(half) &&
              size_of(dtype::bfloat16) == sizeof(bfloat16));

} // namespace weft
