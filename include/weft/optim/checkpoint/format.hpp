#pragma once
// The on-disk format of weft::optim::checkpoint (weft/optim/checkpoint.hpp has the layout):
// a rank file's header and its entries, the index, their parsing with every failure named, the
// checksums, and reading a rank file entry by entry. Nothing here knows an optimizer.
#include <weft/core/detail/fnv1a.hpp>
#include <weft/core/error.hpp>
#include <weft/optim/detail/json.hpp>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weft::optim::checkpoint {

inline constexpr std::string_view magic = "WEFTCKPT";

struct entry {
  std::string name;        // "<tensor>/weight" or "<tensor>/<slot>"
  std::uint64_t begin = 0; // element range of the tensor
  std::uint64_t end = 0;
  std::uint64_t offset = 0; // bytes from the start of the data section
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
};

struct header {
  int rank = 0, world = 0;
  std::vector<entry> entries;
  std::uint64_t data_start = 0; // offset of the data section in the file
};

struct index_tensor {
  std::string name;
  std::uint64_t elements = 0;
  std::optional<bool> decay; // whether weight decay applied (absent before 2026-12)
};

struct index {
  std::uint64_t generation = 0;
  int world = 0;
  long step = 0;
  std::string rule;
  std::vector<std::string> slots;
  float loss_scale = 1.0f;
  std::optional<bool> loss_scaling; // whether the run scaled its loss (absent before 2026-12)
  int good_steps = 0;
  std::vector<std::string> files;
  std::vector<index_tensor> tensors;
};

/// FNV-1a, 64 bits, over bytes: the checksum of every tensor in the index.
[[nodiscard]] inline std::uint64_t fnv1a64(std::span<const std::byte> data) noexcept {
  return weft::detail::fnv1a(data);
}

namespace detail {

[[noreturn]] inline void fail(std::string_view source, const std::string& what) {
  throw error("checkpoint: " + std::string(source) + ": " + what);
}
inline std::uint64_t read_u64le(const std::byte* p) noexcept {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | static_cast<std::uint64_t>(p[i]);
  return v;
}
inline void append_u64le(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i)
    out += static_cast<char>((v >> (8 * i)) & 0xFF);
}
inline const weft::detail::json& field(const weft::detail::json& o, std::string_view key,
                                       weft::detail::json::kind k, std::string_view source,
                                       std::string_view where) {
  const auto* v = o.find(key);
  if (v == nullptr || v->type != k) {
    fail(source,
         "malformed header: " + std::string(where) + " has no valid \"" + std::string(key) + "\"");
  }
  return *v;
}
inline std::uint64_t count(const weft::detail::json& o, std::string_view key,
                           std::string_view source, std::string_view where) {
  const double d = field(o, key, weft::detail::json::kind::number, source, where).num;
  if (!(d >= 0 && d <= 9007199254740992.0) ||
      d != static_cast<double>(static_cast<std::uint64_t>(d))) {
    fail(source, "malformed header: " + std::string(where) + " \"" + std::string(key) +
                     "\" is not a count");
  }
  return static_cast<std::uint64_t>(d);
}
// A count stored in an int: refuses what does not fit instead of wrapping.
inline int count_int(const weft::detail::json& o, std::string_view key, std::string_view source,
                     std::string_view where) {
  const std::uint64_t v = count(o, key, source, where);
  if (v > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    fail(source, "malformed header: " + std::string(where) + " \"" + std::string(key) + "\" is " +
                     std::to_string(v) + ", more than an int holds");
  }
  return static_cast<int>(v);
}
inline std::uint64_t parse_hex64(const std::string& s, std::string_view source,
                                 std::string_view where) {
  if (s.empty() || s.size() > 16)
    fail(source, "malformed header: bad checksum of " + std::string(where));
  std::uint64_t v = 0;
  for (char c : s) {
    const int d = c >= '0' && c <= '9' ? c - '0' : (c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1);
    if (d < 0) fail(source, "malformed header: bad checksum of " + std::string(where));
    v = v * 16 + static_cast<std::uint64_t>(d);
  }
  return v;
}
inline std::string shortest(float v) { // round-trips exactly
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return {buf, r.ptr};
}
inline std::string hex64(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4)
    s[static_cast<std::size_t>(i)] = digits[v & 15];
  return s;
}
inline std::vector<std::byte> read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) throw error("checkpoint: cannot open " + p.string());
  f.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(f.tellg());
  f.seekg(0);
  std::vector<std::byte> data(size);
  if (size > 0 &&
      !f.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(size))) {
    throw error("checkpoint: cannot read " + p.string());
  }
  return data;
}
// Whether `name` is a rank file save() writes, "g<gen>-rank<r>-of<world>.weft", or its
// temporary, the same with ".tmp" after it: the only files a save removes.
inline bool is_rank_file_name(std::string_view name) {
  if (name.ends_with(".tmp")) name.remove_suffix(4);
  if (!name.ends_with(".weft")) return false;
  name.remove_suffix(5);
  const auto digits = [&](std::string_view prefix) {
    if (!name.starts_with(prefix)) return false;
    name.remove_prefix(prefix.size());
    std::size_t n = 0;
    while (n < name.size() && name[n] >= '0' && name[n] <= '9')
      ++n;
    name.remove_prefix(n);
    return n > 0;
  };
  return digits("g") && digits("-rank") && digits("-of") && name.empty();
}
// Writes `bytes` under `final_name + ".tmp"`, then renames it. stop_after: simulate a crash
// after that many bytes (the temporary file is left behind, as a killed process leaves it).
inline void write_then_rename(const std::filesystem::path& final_name, std::string_view bytes,
                              std::size_t stop_after = static_cast<std::size_t>(-1)) {
  auto tmp = final_name;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw error("checkpoint: cannot create " + tmp.string());
    const std::size_t n = std::min(bytes.size(), stop_after);
    f.write(bytes.data(), static_cast<std::streamsize>(n));
    f.flush();
    if (!f) throw error("checkpoint: cannot write " + tmp.string());
    if (n < bytes.size()) throw error("checkpoint: simulated crash while writing " + tmp.string());
  }
  std::filesystem::rename(tmp, final_name);
}

} // namespace detail

/// Parses a rank file's header from `head` (the file's first bytes: at least the 16-byte
/// preamble and the JSON header) and checks that every entry lies inside a file of
/// `file_size` bytes. Throws weft::error naming `source` (and the entry) on anything
/// malformed or truncated. Does not verify checksums (see verify()).
[[nodiscard]] inline header parse_header(std::span<const std::byte> head, std::uint64_t file_size,
                                         std::string_view source) {
  using weft::detail::json;
  if (head.size() > file_size) detail::fail(source, "header bytes beyond the file size");
  if (head.size() < 16)
    detail::fail(source, "truncated: " + std::to_string(head.size()) + " bytes, no header");
  if (std::memcmp(head.data(), magic.data(), magic.size()) != 0)
    detail::fail(source, "not a weft checkpoint file");
  const std::uint64_t len = detail::read_u64le(head.data() + 8);
  if (len > head.size() - 16) {
    detail::fail(source, "truncated: header of " + std::to_string(len) + " bytes, file of " +
                             std::to_string(file_size));
  }
  const std::string_view text(reinterpret_cast<const char*>(head.data() + 16),
                              static_cast<std::size_t>(len));
  const json root = weft::detail::parse_checkpoint_json(text, source);
  if (root.type != json::kind::object) detail::fail(source, "malformed header: not a JSON object");
  header h;
  h.data_start = 16 + len;
  h.rank = detail::count_int(root, "rank", source, "the file");
  h.world = detail::count_int(root, "world", source, "the file");
  const std::uint64_t data_size = file_size - h.data_start;
  for (const json& e :
       detail::field(root, "entries", json::kind::array, source, "the file").items) {
    if (e.type != json::kind::object)
      detail::fail(source, "malformed header: an entry is not an object");
    entry x;
    x.name = detail::field(e, "name", json::kind::string, source, "an entry").str;
    const auto& dtype = detail::field(e, "dtype", json::kind::string, source, x.name).str;
    if (dtype != "F32") detail::fail(source, "tensor " + x.name + ": unsupported dtype " + dtype);
    x.begin = detail::count(e, "begin", source, x.name);
    x.end = detail::count(e, "end", source, x.name);
    x.offset = detail::count(e, "offset", source, x.name);
    x.bytes = detail::count(e, "bytes", source, x.name);
    x.checksum = detail::parse_hex64(
        detail::field(e, "fnv1a64", json::kind::string, source, x.name).str, source, x.name);
    if (x.end < x.begin || x.bytes != (x.end - x.begin) * 4) {
      detail::fail(source, "tensor " + x.name + ": element range and byte count disagree");
    }
    if (x.offset > data_size || x.bytes > data_size - x.offset) {
      detail::fail(source, "truncated: tensor " + x.name + " needs bytes up to " +
                               std::to_string(h.data_start + x.offset + x.bytes) + ", file has " +
                               std::to_string(file_size));
    }
    h.entries.push_back(std::move(x));
  }
  return h;
}

/// The same over a whole file in memory (what a fuzz target calls).
[[nodiscard]] inline header parse_header(std::span<const std::byte> file,
                                         std::string_view source = "<memory>") {
  return parse_header(file, file.size(), source);
}

/// Throws unless `data` (entry e's bytes) matches e's checksum.
inline void verify(std::span<const std::byte> data, const entry& e, std::string_view source) {
  if (data.size() != e.bytes || fnv1a64(data) != e.checksum) {
    detail::fail(source, "tensor " + e.name + ": checksum mismatch (the file is damaged)");
  }
}

namespace detail {

// A rank file opened for reading: its header, then the entries a rank needs, one at a time.
class rank_file {
public:
  explicit rank_file(const std::filesystem::path& p)
      : source_(p.string()), f_(p, std::ios::binary) {
    if (!f_) throw error("checkpoint: cannot open " + source_);
    std::error_code ec;
    size_ = std::filesystem::file_size(p, ec);
    if (ec) throw error("checkpoint: cannot stat " + source_ + ": " + ec.message());
    std::vector<std::byte> head(static_cast<std::size_t>(std::min<std::uint64_t>(16, size_)));
    read_at(0, head);
    if (head.size() == 16 && std::memcmp(head.data(), magic.data(), magic.size()) == 0) {
      const std::uint64_t len = read_u64le(head.data() + 8);
      head.resize(static_cast<std::size_t>(16 + std::min<std::uint64_t>(len, size_ - 16)));
      read_at(0, head);
    }
    header_ = parse_header(head, size_, source_);
  }
  [[nodiscard]] const header& head() const noexcept { return header_; }
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  /// Entry e's bytes, checked against its checksum.
  [[nodiscard]] std::vector<std::byte> read(const entry& e) {
    std::vector<std::byte> data(static_cast<std::size_t>(e.bytes));
    read_at(header_.data_start + e.offset, data);
    verify(data, e, source_);
    return data;
  }

private:
  void read_at(std::uint64_t at, std::vector<std::byte>& out) {
    f_.seekg(static_cast<std::streamoff>(at));
    if (!out.empty() &&
        !f_.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()))) {
      throw error("checkpoint: " + source_ + ": cannot read " + std::to_string(out.size()) +
                  " bytes at " + std::to_string(at));
    }
  }
  std::string source_;
  std::ifstream f_;
  std::uint64_t size_ = 0;
  header header_;
};

} // namespace detail

/// Parses index.json.
[[nodiscard]] inline index parse_index(std::span<const std::byte> bytes,
                                       std::string_view source = "<memory>") {
  using weft::detail::json;
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const json root = weft::detail::parse_checkpoint_json(text, source);
  if (root.type != json::kind::object) detail::fail(source, "malformed index: not a JSON object");
  if (detail::field(root, "format", json::kind::string, source, "the index").str !=
      "weft-checkpoint-index") {
    detail::fail(source, "not a weft checkpoint index");
  }
  index x;
  x.generation = detail::count(root, "generation", source, "the index");
  x.world = detail::count_int(root, "world", source, "the index");
  x.step = static_cast<long>(detail::count(root, "step", source, "the index"));
  x.rule = detail::field(root, "rule", json::kind::string, source, "the index").str;
  const double scale =
      detail::field(root, "loss_scale", json::kind::number, source, "the index").num;
  if (!(scale > 0.0 && scale <= static_cast<double>(std::numeric_limits<float>::max()))) {
    detail::fail(source, "malformed index: loss_scale must be a positive float");
  }
  x.loss_scale = static_cast<float>(scale);
  if (const json* ls = root.find("loss_scaling")) {
    if (ls->type != json::kind::boolean)
      detail::fail(source, "malformed index: loss_scaling must be true or false");
    x.loss_scaling = ls->b;
  }
  x.good_steps = detail::count_int(root, "good_steps", source, "the index");
  for (const json& s : detail::field(root, "slots", json::kind::array, source, "the index").items) {
    if (s.type != json::kind::string)
      detail::fail(source, "malformed index: a slot name is not a string");
    x.slots.push_back(s.str);
  }
  for (const json& f : detail::field(root, "files", json::kind::array, source, "the index").items) {
    if (f.type != json::kind::string || f.str.empty() || f.str.find('/') != std::string::npos ||
        f.str.find("..") != std::string::npos) {
      detail::fail(source, "malformed index: bad file name");
    }
    x.files.push_back(f.str);
  }
  for (const json& t :
       detail::field(root, "tensors", json::kind::array, source, "the index").items) {
    if (t.type != json::kind::object)
      detail::fail(source, "malformed index: a tensor is not an object");
    index_tensor it{detail::field(t, "name", json::kind::string, source, "a tensor").str,
                    detail::count(t, "elements", source, "a tensor"), std::nullopt};
    if (const json* d = t.find("decay")) {
      if (d->type != json::kind::boolean) {
        detail::fail(source,
                     "malformed index: tensor " + it.name + ": decay must be true or false");
      }
      it.decay = d->b;
    }
    x.tensors.push_back(std::move(it));
  }
  if (x.world < 1 || x.files.size() != static_cast<std::size_t>(x.world)) {
    detail::fail(source, "malformed index: " + std::to_string(x.files.size()) +
                             " files for a world of " + std::to_string(x.world));
  }
  return x;
}

} // namespace weft::optim::checkpoint
