#pragma once
// The safetensors format's vocabulary (weft/io/safetensors.hpp reads and writes the files):
// element types and their names, a tensor's entry, a file's header, and the matrices that
// blocks move between memory and a file.
#include <weft/core/error.hpp>

#include <sys/types.h>

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::safetensors {

// Tensor bytes are copied to and from memory as they are: the file is little-endian.
static_assert(std::endian::native == std::endian::little,
              "weft::safetensors needs a little-endian host");
// Offsets in files beyond 4 GiB.
static_assert(sizeof(std::size_t) >= 8 && sizeof(off_t) >= 8,
              "weft::safetensors needs 64-bit sizes and offsets");

/// The element types of the reference implementation's stable set.
enum class dtype : std::uint8_t {
  f64,
  f32,
  f16,
  bf16,
  i64,
  i32,
  i16,
  i8,
  u8,
  boolean,
  u64,
  u32,
  u16,
  f8_e5m2,
  f8_e4m3
};

/// Bytes per element.
[[nodiscard]] constexpr std::size_t element_size(dtype t) noexcept {
  switch (t) {
    case dtype::f64:
    case dtype::i64:
    case dtype::u64: return 8;
    case dtype::f32:
    case dtype::i32:
    case dtype::u32: return 4;
    case dtype::f16:
    case dtype::bf16:
    case dtype::i16:
    case dtype::u16: return 2;
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean:
    case dtype::f8_e5m2:
    case dtype::f8_e4m3: return 1;
  }
  return 0;
}

/// The name the JSON header spells: "F32", "BF16", "BOOL", ...
[[nodiscard]] constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f64: return "F64";
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::i64: return "I64";
    case dtype::i32: return "I32";
    case dtype::i16: return "I16";
    case dtype::i8: return "I8";
    case dtype::u8: return "U8";
    case dtype::boolean: return "BOOL";
    case dtype::u64: return "U64";
    case dtype::u32: return "U32";
    case dtype::u16: return "U16";
    case dtype::f8_e5m2: return "F8_E5M2";
    case dtype::f8_e4m3: return "F8_E4M3";
  }
  return "?";
}

/// The dtype a header name denotes, or nothing for a name this reader does not know.
[[nodiscard]] constexpr std::optional<dtype> parse_dtype(std::string_view name) noexcept {
  for (int i = 0; i <= static_cast<int>(dtype::f8_e4m3); ++i) {
    if (dtype_name(static_cast<dtype>(i)) == name) return static_cast<dtype>(i);
  }
  return std::nullopt;
}

/// The types read_block and write_block convert from and to float.
[[nodiscard]] constexpr bool converts_to_float(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f64 || t == dtype::f16 || t == dtype::bf16;
}

/// What a writer knows of a tensor before it has a place in the file.
struct tensor_spec {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::size_t> shape;
};

/// A tensor of a file: its bytes are [begin, end) of the data buffer.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::size_t> shape;
  std::size_t begin = 0;
  std::size_t end = 0;

  [[nodiscard]] std::size_t elements() const noexcept {
    return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>{});
  }
};

/// A file's layout. tensors are in the order of their offsets (which is plan()'s order).
struct header {
  std::vector<tensor_info> tensors;
  std::map<std::string, std::string> metadata;
  std::size_t data_start = 0; // 8 + the header JSON's length
  std::size_t file_size = 0;  // data_start + the data buffer's length

  /// The tensor named `name`, or nullptr. A linear search: it runs once per parameter at
  /// load and save, and an index beside `tensors` could fall out of step with it.
  [[nodiscard]] const tensor_info* find(std::string_view name) const noexcept {
    for (const tensor_info& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  [[nodiscard]] const tensor_info& at(std::string_view name) const {
    if (const tensor_info* t = find(name)) return *t;
    throw error("safetensors: no tensor '" + std::string(name) + "' in the header (it has " +
                std::to_string(tensors.size()) + " tensors)");
  }
};

/// A host matrix of floats as weft::matrix_view has it: element (r, c) at data()[r * ld() + c].
template <class M>
concept float_matrix = requires(const M& m) {
  { m.rows() } -> std::convertible_to<std::size_t>;
  { m.cols() } -> std::convertible_to<std::size_t>;
  { m.ld() } -> std::convertible_to<std::size_t>;
  { m.data() } -> std::convertible_to<const float*>;
};
template <class M>
concept mutable_float_matrix = float_matrix<M> && requires(M& m) {
  { m.data() } -> std::convertible_to<float*>;
};

} // namespace weft::safetensors
