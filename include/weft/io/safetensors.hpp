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
#include <weft/core/error.hpp>
#include <weft/io/safetensors/file_io.hpp>
#include <weft/io/safetensors/header_rules.hpp>
#include <weft/io/safetensors/types.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

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
