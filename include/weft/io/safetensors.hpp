#pragma once
// safetensors files, read and written with plain POSIX file descriptors, so that every rank
// of a sharded model reads or writes only its own slice of each tensor.
//
//   | N: u64, little-endian | UTF-8 JSON, padded with spaces | data buffer             |
//   |<------ 8 bytes ------>|<-- N bytes (writers: 8 | N) -->|<- the tensors' bytes ->|
//
//   {"__metadata__": {"format": "pt"},                       (optional, string -> string)
//    "wte": {"dtype": "F32", "shape": [50257, 768], "data_offsets": [0, 154389504]}, ...}
//
// data_offsets are [begin, end) in bytes from the start of the data buffer; tensors are
// row-major, little-endian, and tile the buffer exactly (no overlap, no hole, nothing after
// the last one). read_header enforces every rule the reference implementation does, and the
// file's exact size, so a truncated or padded file is refused before any tensor is read.
//
// Saving a model sharded over ranks, and loading it back:
//
//   namespace st = weft::safetensors;
//   const st::header h = st::plan({{"wte", st::dtype::bf16, {vocab, hidden}}, ...},
//                                 {{"format", "pt"}});                // same on every rank
//   if (rank == 0) st::create(path, h);                               // header, sized file
//   barrier();
//   st::write_block(path, h, "wte", row0, 0, my_rows_view);           // each rank its slice
//
//   const st::header g = st::read_header(path);                       // every rank validates
//   const st::tensor_info& t = g.at("wte");                           // check names, shapes
//   st::read_block(path, g, "wte", row0, 0, rows, hidden, out, ld);   // each rank its slice
#include <weft/core/detail/json.hpp>
#include <weft/core/error.hpp>
#include <weft/core/half.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
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

// --- internals ---------------------------------------------------------------------------------
namespace weft::detail::safetensors {

namespace st = weft::safetensors;

// Beyond the reference implementation's limit a length field is damage, not a header, and is
// refused before it sizes an allocation.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
// Bounds the staging memory a block of any size uses; large enough that a pwrite per chunk
// costs nothing beside the conversion.
inline constexpr std::size_t staging_bytes = std::size_t{8} << 20;

[[noreturn]] WEFT_COLD inline void fail(std::string_view source, const std::string& what) {
  throw error("safetensors: " + std::string(source) + ": " + what);
}
[[noreturn]] WEFT_COLD inline void fail(std::string_view source, std::string_view tensor,
                                        const std::string& what) {
  fail(source, "tensor '" + std::string(tensor) + "': " + what);
}

inline std::string range(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}
inline std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  return s + "]";
}

/// The index of the first byte of s that does not begin a well-formed UTF-8 sequence
/// (overlong forms, surrogates and code points past U+10FFFF are not), or npos.
[[nodiscard]] constexpr std::size_t invalid_utf8_at(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t more = 0;
    std::uint32_t cp = 0;
    std::uint32_t least = 0;
    if ((c & 0xe0) == 0xc0) {
      more = 1, cp = c & 0x1fu, least = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      more = 2, cp = c & 0x0fu, least = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      more = 3, cp = c & 0x07u, least = 0x10000;
    } else {
      return i;
    }
    if (i + more >= s.size()) return i;
    for (std::size_t k = 1; k <= more; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (b & 0x3fu);
    }
    if (cp < least || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += more + 1;
  }
  return std::string_view::npos;
}

/// Checked a * b and a + b: header numbers come from files that may be damaged.
inline bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return __builtin_mul_overflow(a, b, &out);
}
inline bool add_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t& out) noexcept {
  return __builtin_add_overflow(a, b, &out);
}

// --- JSON --------------------------------------------------------------------------------------
// weft's one JSON reader, in RFC 8259's full grammar (UTF-8 names, \u escapes with surrogate
// pairs), with no bound on keys: a file holds thousands of tensors. Offsets and dimensions
// read its exact unsigned integers (the reference refuses 1.0 and 1e2 there too).
using weft::detail::json;

/// Parses the header JSON (checked for UTF-8 first); every error names the byte, and the
/// tensor whose entry holds it.
inline json parse_json(std::string_view text, std::string_view source) {
  // The schema nests three deep; the bound keeps a hostile header off the stack's end.
  static constexpr json_grammar grammar{.max_depth = 16};
  try {
    return weft::detail::parse_json(text, grammar);
  } catch (const json_parse_error& e) {
    if (e.duplicate_key && e.depth == 0) {
      fail(source, *e.duplicate_key == "__metadata__"
                       ? std::string("\"__metadata__\" appears twice")
                       : "tensor '" + *e.duplicate_key + "' appears twice in the header");
    }
    std::string where = "header JSON, byte " + std::to_string(e.at);
    if (!e.top_key.empty()) where += " (in the entry of '" + e.top_key + "')";
    fail(source, where + ": " + e.what);
  }
}

/// The header JSON a writer puts in the file, padded with spaces to a multiple of 8 bytes so
/// that the data buffer starts 8-aligned.
inline std::string encode(const st::header& h) {
  std::string s = "{";
  if (!h.metadata.empty()) {
    s += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : h.metadata) {
      s += (first ? "" : ",") + json_string(k) + ":" + json_string(v);
      first = false;
    }
    s += "}";
  }
  for (const st::tensor_info& t : h.tensors) {
    if (s.size() > 1) s += ",";
    s += json_string(t.name) + ":{\"dtype\":\"" + std::string(st::dtype_name(t.type)) +
         "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i)
      s += (i == 0 ? "" : ",") + std::to_string(t.shape[i]);
    s += "],\"data_offsets\":[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]}";
  }
  s += "}";
  s.append((8 - s.size() % 8) % 8, ' ');
  return s;
}

// --- layout ------------------------------------------------------------------------------------

/// The bytes a tensor of this type and shape holds, refusing a count past 64 bits.
inline std::uint64_t tensor_bytes(st::dtype type, const std::vector<std::size_t>& shape,
                                  std::string_view source, std::string_view name) {
  std::uint64_t n = st::element_size(type);
  for (const std::size_t d : shape) {
    if (mul_overflows(n, d, n)) {
      fail(source, name,
           std::string(st::dtype_name(type)) + " " + shape_text(shape) +
               " holds more than 2^64 bytes");
    }
  }
  return n;
}

/// One entry against its own shape and the buffer: the size matches, and it lies inside.
inline void check_entry(const st::tensor_info& t, std::uint64_t buffer_bytes,
                        std::uint64_t file_size, std::string_view source) {
  if (t.end < t.begin)
    fail(source, t.name,
         "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] end before they begin");
  const std::uint64_t need = tensor_bytes(t.type, t.shape, source, t.name);
  if (t.end - t.begin != need) {
    fail(source, t.name,
         "data_offsets " + range(t.begin, t.end) + " hold " + std::to_string(t.end - t.begin) +
             " bytes, but " + std::string(st::dtype_name(t.type)) + " " + shape_text(t.shape) +
             " needs " + std::to_string(need));
  }
  if (t.end > buffer_bytes) {
    fail(source, t.name,
         "data_offsets " + range(t.begin, t.end) + " reach past the end of the " +
             std::to_string(buffer_bytes) + "-byte data buffer (the file is " +
             std::to_string(file_size) + " bytes: truncated, or the header is wrong)");
  }
}

/// Sorts tensors by offset and demands that they tile [0, buffer_bytes): each begins where the
/// one before ends. Zero-byte tensors may sit at any boundary.
inline void check_tiling(std::vector<st::tensor_info>& tensors, std::uint64_t buffer_bytes,
                         std::string_view source) {
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const st::tensor_info& a, const st::tensor_info& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  std::uint64_t at = 0;
  const st::tensor_info* last = nullptr; // the tensor that ends at `at`
  for (const st::tensor_info& t : tensors) {
    if (t.begin < at) {
      fail(source, t.name,
           "data_offsets " + range(t.begin, t.end) + " overlap tensor '" + last->name + "' " +
               range(last->begin, last->end));
    }
    if (t.begin > at) {
      fail(source,
           "bytes " + range(at, t.begin) + " of the data buffer, " +
               (last ? "between tensor '" + last->name + "' and " : std::string("before ")) +
               "tensor '" + t.name + "', belong to no tensor (a hole)");
    }
    if (t.end > t.begin || last == nullptr) last = &t;
    at = t.end;
  }
  if (at != buffer_bytes) {
    fail(source, "the data buffer holds " + std::to_string(buffer_bytes) +
                     " bytes, but the tensors end at byte " + std::to_string(at) + ": bytes " +
                     range(at, buffer_bytes) + " belong to no tensor (trailing bytes" +
                     (last ? " after tensor '" + last->name + "')" : ")"));
  }
}

inline std::uint64_t as_offset(const json& v, std::string_view source, std::string_view name,
                               std::string_view key) {
  if (v.type != json::kind::number || !v.uint_ok) {
    fail(source, name,
         "\"" + std::string(key) + "\" holds " + v.describe() + ", not an integer in [0, 2^64)");
  }
  return v.uint;
}

inline st::tensor_info decode_entry(const std::string& name, const json& v,
                                    std::string_view source) {
  if (v.type != json::kind::object)
    fail(source, name, "the entry is " + v.describe() + ", not an object");
  const json* fields[3] = {nullptr, nullptr, nullptr};
  static constexpr std::string_view keys[3] = {"dtype", "shape", "data_offsets"};
  for (std::size_t i = 0; i < v.keys.size(); ++i) {
    const std::string& k = v.keys[i];
    const json& item = v.values[i];
    const auto* pos = std::find(std::begin(keys), std::end(keys), k);
    if (pos == std::end(keys)) {
      fail(source, name,
           "unexpected key '" + k + "' (an entry holds \"dtype\", \"shape\" and \"data_offsets\")");
    }
    fields[pos - std::begin(keys)] = &item;
  }
  for (int i = 0; i < 3; ++i) {
    if (fields[i] == nullptr) fail(source, name, "missing key \"" + std::string(keys[i]) + "\"");
  }
  st::tensor_info t;
  t.name = name;
  if (fields[0]->type != json::kind::string) {
    fail(source, name, "\"dtype\" is " + fields[0]->describe() + ", not a string");
  }
  const std::optional<st::dtype> type = st::parse_dtype(fields[0]->str);
  if (!type) fail(source, name, "unknown dtype '" + fields[0]->str + "'");
  t.type = *type;
  if (fields[1]->type != json::kind::array) {
    fail(source, name, "\"shape\" is " + fields[1]->describe() + ", not an array");
  }
  for (const json& d : fields[1]->items)
    t.shape.push_back(as_offset(d, source, name, "shape"));
  const json& off = *fields[2];
  if (off.type != json::kind::array || off.items.size() != 2) {
    fail(source, name,
         "\"data_offsets\" is " +
             (off.type == json::kind::array ? "an array of " + std::to_string(off.items.size())
                                            : off.describe()) +
             ", not [begin, end]");
  }
  t.begin = as_offset(off.items[0], source, name, "data_offsets");
  t.end = as_offset(off.items[1], source, name, "data_offsets");
  return t;
}

// --- files -------------------------------------------------------------------------------------

/// An open file descriptor, closed on scope exit; every failure names the file and errno.
class file {
public:
  file(const std::string& path, int flags, mode_t mode = 0) : path_(path) {
    do {
      fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) fail_errno("cannot open");
  }
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() {
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] std::uint64_t size() const {
    struct stat sb {};
    if (::fstat(fd_, &sb) != 0) fail_errno("cannot stat");
    return static_cast<std::uint64_t>(sb.st_size);
  }
  void read_at(void* buf, std::size_t n, std::uint64_t offset) const {
    auto* p = static_cast<char*>(buf);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, checked_offset(offset, n));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0)
        fail_errno("cannot read " + std::to_string(n) + " bytes at byte " + std::to_string(offset));
      if (got == 0) fail(path_, "unexpected end of file at byte " + std::to_string(offset));
      p += got, n -= static_cast<std::size_t>(got), offset += static_cast<std::uint64_t>(got);
    }
  }
  void write_at(const void* buf, std::size_t n, std::uint64_t offset) const {
    const auto* p = static_cast<const char*>(buf);
    while (n > 0) {
      const ssize_t put = ::pwrite(fd_, p, n, checked_offset(offset, n));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0)
        fail_errno("cannot write " + std::to_string(n) + " bytes at byte " +
                   std::to_string(offset));
      p += put, n -= static_cast<std::size_t>(put), offset += static_cast<std::uint64_t>(put);
    }
  }
  void resize(std::uint64_t size) const {
    int rc = 0;
    do {
      rc = ::ftruncate(fd_, checked_offset(size, 0));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) fail_errno("cannot size the file to " + std::to_string(size) + " bytes");
  }
  /// Closes now, reporting what the kernel defers to close (on NFS, write errors).
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) fail_errno("cannot close");
  }

private:
  [[noreturn]] void fail_errno(const std::string& what) const {
    const int e = errno;
    fail(path_, what + ": " + std::generic_category().message(e));
  }
  [[nodiscard]] off_t checked_offset(std::uint64_t offset, std::size_t n) const {
    if (offset > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max()) - n) {
      fail(path_, "byte " + std::to_string(offset) + " is beyond what off_t addresses");
    }
    return static_cast<off_t>(offset);
  }

  std::string path_;
  int fd_ = -1;
};

/// A 1-D or 2-D tensor seen as rows x cols (1-D as one row, a scalar as 1 x 1).
struct grid {
  std::size_t rows = 1;
  std::size_t cols = 1;
};
inline grid as_grid(const st::tensor_info& t, std::string_view source) {
  if (t.shape.size() > 2) {
    fail(source, t.name,
         "shape " + shape_text(t.shape) + " has " + std::to_string(t.shape.size()) +
             " dimensions; blocks address 1-D and 2-D tensors");
  }
  if (t.shape.size() == 2) return {t.shape[0], t.shape[1]};
  return {1, t.shape.empty() ? 1 : t.shape[0]};
}

/// The tensor a block names, checked: a float type, the block inside its bounds, a file of
/// the header's size. Returns the tensor's grid.
inline grid check_block(const st::header& h, const st::tensor_info*& t, const std::string& path,
                        std::string_view tensor, std::size_t row0, std::size_t col0,
                        std::size_t rows, std::size_t cols, const void* data, std::size_t ld,
                        std::string_view what) {
  t = h.find(tensor);
  if (t == nullptr) fail(path, "no tensor '" + std::string(tensor) + "' in the header");
  if (!st::converts_to_float(t->type)) {
    fail(path, t->name,
         std::string(what) + " converts F32, F64, F16 and BF16 only, not " +
             std::string(st::dtype_name(t->type)));
  }
  const grid g = as_grid(*t, path);
  if (row0 > g.rows || rows > g.rows - row0 || col0 > g.cols || cols > g.cols - col0) {
    fail(path, t->name,
         std::string(what) + " rows " + range(row0, row0 + rows) + ", cols " +
             range(col0, col0 + cols) + " lie outside its " + std::to_string(g.rows) + " x " +
             std::to_string(g.cols));
  }
  if (rows > 1 && ld < cols) {
    fail(path, t->name,
         std::string(what) + ": leading dimension " + std::to_string(ld) + " < " +
             std::to_string(cols) + " columns");
  }
  if (rows > 0 && cols > 0 && data == nullptr)
    fail(path, t->name, std::string(what) + ": null data");
  return g;
}

inline void check_file_size(const file& f, const st::header& h, const std::string& path) {
  const std::uint64_t size = f.size();
  if (size != h.file_size) {
    fail(path, "the file is " + std::to_string(size) + " bytes, but the header describes " +
                   std::to_string(h.file_size) +
                   " (create() it with this header, or read_header() it)");
  }
}

inline void to_bytes(st::dtype type, const float* src, std::size_t n, unsigned char* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    switch (type) {
      case st::dtype::f32: std::memcpy(dst + 4 * i, &src[i], 4); break;
      case st::dtype::f64: {
        const double d = src[i];
        std::memcpy(dst + 8 * i, &d, 8);
        break;
      }
      case st::dtype::f16: {
        const std::uint16_t b = half(src[i]).bits();
        std::memcpy(dst + 2 * i, &b, 2);
        break;
      }
      default: {
        const std::uint16_t b = bfloat16(src[i]).bits();
        std::memcpy(dst + 2 * i, &b, 2);
        break;
      }
    }
  }
}

inline void from_bytes(st::dtype type, const unsigned char* src, std::size_t n, float* dst) {
  for (std::size_t i = 0; i < n; ++i) {
    switch (type) {
      case st::dtype::f32: std::memcpy(&dst[i], src + 4 * i, 4); break;
      case st::dtype::f64: {
        double d = 0;
        std::memcpy(&d, src + 8 * i, 8);
        dst[i] = static_cast<float>(d);
        break;
      }
      case st::dtype::f16: {
        std::uint16_t b = 0;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = half::from_bits(b);
        break;
      }
      default: {
        std::uint16_t b = 0;
        std::memcpy(&b, src + 2 * i, 2);
        dst[i] = bfloat16::from_bits(b);
        break;
      }
    }
  }
}

/// Calls io(first_row, row_count, file_offset) over the block in runs of rows that lie back to
/// back in the file (all of them when the block spans whole rows), each run at most
/// staging_bytes long (one row at least).
template <class F>
void for_each_run(const st::header& h, const st::tensor_info& t, grid g, std::size_t row0,
                  std::size_t col0, std::size_t rows, std::size_t cols, F&& io) {
  const std::size_t es = st::element_size(t.type);
  const std::size_t per_run =
      cols == g.cols ? std::max<std::size_t>(1, staging_bytes / (cols * es)) : 1;
  for (std::size_t r = 0; r < rows; r += per_run) {
    const std::size_t n = std::min(per_run, rows - r);
    io(r, n, h.data_start + t.begin + ((row0 + r) * g.cols + col0) * es);
  }
}

} // namespace weft::detail::safetensors

namespace weft::safetensors {

/// Validates a header's JSON (the N bytes after the length field) against a file of file_size
/// bytes and returns the layout; read_header calls it, and so can a fuzzer. Every error names
/// `source` and, where one is involved, the tensor.
[[nodiscard]] inline header parse_header(std::string_view json_text, std::uint64_t file_size,
                                         std::string_view source) {
  namespace d = weft::detail::safetensors;
  if (file_size < 8 || json_text.size() > file_size - 8) {
    d::fail(source, "a " + std::to_string(json_text.size()) + "-byte header does not fit a " +
                        std::to_string(file_size) + "-byte file");
  }
  if (const std::size_t bad = d::invalid_utf8_at(json_text); bad != std::string_view::npos) {
    d::fail(source, "the header is not UTF-8 (byte " + std::to_string(bad) + ")");
  }
  if (json_text.empty() || json_text[0] != '{')
    d::fail(source, "the header JSON does not start with '{'");
  const d::json root = d::parse_json(json_text, source);
  header h;
  h.data_start = 8 + json_text.size();
  h.file_size = file_size;
  const std::uint64_t buffer_bytes = file_size - h.data_start;
  for (std::size_t i = 0; i < root.keys.size(); ++i) {
    const std::string& name = root.keys[i];
    const d::json& v = root.values[i];
    if (name == "__metadata__") {
      if (v.type != d::json::kind::object)
        d::fail(source, "\"__metadata__\" is " + v.describe() + ", not an object");
      for (std::size_t j = 0; j < v.keys.size(); ++j) {
        const std::string& k = v.keys[j];
        const d::json& s = v.values[j];
        if (s.type != d::json::kind::string) {
          d::fail(source,
                  "\"__metadata__\" maps '" + k + "' to " + s.describe() + ", not a string");
        }
        h.metadata.emplace(k, s.str);
      }
      continue;
    }
    h.tensors.push_back(d::decode_entry(name, v, source));
    d::check_entry(h.tensors.back(), buffer_bytes, file_size, source);
  }
  d::check_tiling(h.tensors, buffer_bytes, source);
  return h;
}

/// Reads and validates a file's header: the length field, the JSON, every entry, the tiling of
/// the data buffer and the file's exact size.
[[nodiscard]] inline header read_header(const std::string& path) {
  namespace d = weft::detail::safetensors;
  const d::file f(path, O_RDONLY);
  const std::uint64_t size = f.size();
  if (size < 8)
    d::fail(path,
            "the file is " + std::to_string(size) + " bytes, too short for the header length");
  unsigned char len[8];
  f.read_at(len, 8, 0);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | len[i];
  if (n > size - 8) {
    d::fail(path, "the header length " + std::to_string(n) + " runs past the end of the file (" +
                      std::to_string(size - 8) + " bytes follow the length field)");
  }
  if (n > d::max_header_bytes) {
    d::fail(path, "the header length " + std::to_string(n) + " exceeds the " +
                      std::to_string(d::max_header_bytes) + "-byte limit");
  }
  std::string text(n, '\0');
  f.read_at(text.data(), text.size(), 8);
  return parse_header(text, size, path);
}

/// Lays the tensors out back to back in the order given, so that every rank computes the same
/// offsets. Names must be unique, UTF-8, and not "__metadata__".
[[nodiscard]] inline header plan(const std::vector<tensor_spec>& tensors,
                                 const std::map<std::string, std::string>& metadata = {}) {
  namespace d = weft::detail::safetensors;
  constexpr std::string_view source = "plan";
  auto utf8 = [&](const std::string& s, std::string_view what) {
    if (d::invalid_utf8_at(s) != std::string_view::npos)
      d::fail(source, std::string(what) + " is not UTF-8");
  };
  for (const auto& [k, v] : metadata) {
    utf8(k, "a metadata key");
    utf8(v, "the metadata value of '" + k + "'");
  }
  header h;
  h.metadata = metadata;
  std::set<std::string_view> seen;
  std::uint64_t at = 0;
  for (const tensor_spec& s : tensors) {
    utf8(s.name, "a tensor name");
    if (s.name == "__metadata__")
      d::fail(source, "\"__metadata__\" is reserved and cannot name a tensor");
    if (!seen.insert(s.name).second) d::fail(source, s.name, "named twice");
    std::uint64_t end = 0;
    if (d::add_overflows(at, d::tensor_bytes(s.type, s.shape, source, s.name), end)) {
      d::fail(source, s.name, "ends past 2^64 bytes");
    }
    h.tensors.push_back({s.name, s.type, s.shape, at, end});
    at = end;
  }
  h.data_start = 8 + d::encode(h).size();
  h.file_size = h.data_start + at;
  return h;
}

/// Writes the length field and header JSON, and sizes the file to h.file_size: the data reads
/// as zeros (and takes no disk) until write_block fills it. One rank calls it; an existing file
/// is replaced. h is checked as read_header would check it.
inline void create(const std::string& path, const header& h) {
  namespace d = weft::detail::safetensors;
  const std::string text = d::encode(h);
  if (h.data_start != 8 + text.size() || h.file_size < h.data_start) {
    d::fail(path, "the header's data_start " + std::to_string(h.data_start) + " and file_size " +
                      std::to_string(h.file_size) + " do not match its JSON of " +
                      std::to_string(text.size()) +
                      " bytes (use a header from plan() or read_header())");
  }
  std::vector<tensor_info> tensors = h.tensors;
  for (const tensor_info& t : tensors)
    d::check_entry(t, h.file_size - h.data_start, h.file_size, path);
  d::check_tiling(tensors, h.file_size - h.data_start, path);

  d::file f(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  f.write_at(len, 8, 0);
  f.write_at(text.data(), text.size(), 8);
  f.resize(h.file_size);
  f.close();
}

/// Writes rows [row0, row0 + rows) x cols [col0, col0 + cols) of a 1-D (one row) or 2-D
/// tensor from src (element (r, c) at src[r * ld + c]), rounding float to the tensor's F32,
/// F64, F16 or BF16. Ranks may write disjoint blocks of one file at the same time.
inline void write_block(const std::string& path, const header& h, std::string_view tensor,
                        std::size_t row0, std::size_t col0, std::size_t rows, std::size_t cols,
                        const float* src, std::size_t ld) {
  namespace d = weft::detail::safetensors;
  const tensor_info* t = nullptr;
  const d::grid g =
      d::check_block(h, t, path, tensor, row0, col0, rows, cols, src, ld, "write_block");
  if (rows == 0 || cols == 0) return;
  d::file f(path, O_WRONLY);
  d::check_file_size(f, h, path);
  const std::size_t es = element_size(t->type);
  std::vector<unsigned char> staging;
  d::for_each_run(
      h, *t, g, row0, col0, rows, cols, [&](std::size_t r, std::size_t n, std::uint64_t offset) {
        staging.resize(n * cols * es);
        for (std::size_t i = 0; i < n; ++i)
          d::to_bytes(t->type, src + (r + i) * ld, cols, staging.data() + i * cols * es);
        f.write_at(staging.data(), staging.size(), offset);
      });
  f.close();
}

/// write_block from a host matrix view (weft::matrix_view<const float> or alike).
template <float_matrix M>
void write_block(const std::string& path, const header& h, std::string_view tensor,
                 std::size_t row0, std::size_t col0, const M& block) {
  write_block(path, h, tensor, row0, col0, block.rows(), block.cols(),
              static_cast<const float*>(block.data()), block.ld());
}

/// Reads rows [row0, row0 + rows) x cols [col0, col0 + cols) of a 1-D (one row) or 2-D tensor
/// into out (element (r, c) at out[r * ld + c]), widening F32, F64 (rounded), F16 or BF16 to
/// float. h comes from read_header of this file.
inline void read_block(const std::string& path, const header& h, std::string_view tensor,
                       std::size_t row0, std::size_t col0, std::size_t rows, std::size_t cols,
                       float* out, std::size_t ld) {
  namespace d = weft::detail::safetensors;
  const tensor_info* t = nullptr;
  const d::grid g =
      d::check_block(h, t, path, tensor, row0, col0, rows, cols, out, ld, "read_block");
  if (rows == 0 || cols == 0) return;
  const d::file f(path, O_RDONLY);
  d::check_file_size(f, h, path);
  const std::size_t es = element_size(t->type);
  std::vector<unsigned char> staging;
  d::for_each_run(
      h, *t, g, row0, col0, rows, cols, [&](std::size_t r, std::size_t n, std::uint64_t offset) {
        staging.resize(n * cols * es);
        f.read_at(staging.data(), staging.size(), offset);
        for (std::size_t i = 0; i < n; ++i)
          d::from_bytes(t->type, staging.data() + i * cols * es, cols, out + (r + i) * ld);
      });
}

/// read_block into a host matrix view (weft::matrix_view<float> or alike), whose shape is the
/// block's.
template <class M>
requires mutable_float_matrix<std::remove_reference_t<M>>
void read_block(const std::string& path, const header& h, std::string_view tensor, std::size_t row0,
                std::size_t col0, M&& block) {
  read_block(path, h, tensor, row0, col0, block.rows(), block.cols(),
             static_cast<float*>(block.data()), block.ld());
}

} // namespace weft::safetensors
