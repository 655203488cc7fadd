#pragma once
// Checkpoints of a data_parallel optimizer that load on another data-parallel size and ZeRO
// stage: one file per rank plus a small index, in a directory.
//
//   weft::optim::checkpoint::save(*opt, dp_comm, "ckpt/");   // collective
//   weft::optim::checkpoint::load(*opt, dp_comm, "ckpt/");   // any DP size, any policy
//
//   ckpt/index.json         {"format": "weft-checkpoint-index", "generation": 3, "world": 4,
//                            "step": 5, "rule": "adamw", "slots": ["exp_avg", "exp_avg_sq"],
//                            "files": ["g3-rank0-of4.weft", ...],
//                            "tensors": [{"name", "elements", "decay"}]}
//   ckpt/g3-rank0-of4.weft  "WEFTCKPT", u64 little-endian header length L, L bytes of JSON
//                           {"rank", "world", "entries": [{"name": "fc1.w/exp_avg", "dtype": "F32",
//                            "begin", "end" (elements of the tensor), "offset", "bytes" (in the
//                            data), "fnv1a64": "hex"}]}, then the raw little-endian data
//
// A rank file holds, for every tensor part in the rank's shard, the fp32 weights (master
// weights, or the float parameters) and each state slot of the rule; replicas of a shard
// (zero<0>, hybrid) write empty files. Saving writes each file under a temporary name, renames
// it when complete, waits for every rank, and only then replaces index.json (again by rename):
// a crash at any point leaves the previous index and the files it names intact. Loading
// reads each file's header and only the entries its shard needs, each checked against its
// checksum and the file's size; damage is a weft::error naming the file and the tensor. A load
// is all or nothing across ranks: each rank reads and checks its parts first, and none copies
// them in unless every rank could. A load checks the index's tensors against the optimizer's:
// names, sizes and whether weight decay applies (the state was built under that choice, and a
// model that changed it between runs is a model-definition mistake, not a resume); an index
// without "decay" flags is accepted.
#include <weft/core/error.hpp>
#include <weft/optim/data_parallel.hpp>
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

/// FNV-1a, 64 bits, over bytes.
[[nodiscard]] inline std::uint64_t fnv1a64(std::span<const std::byte> data) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (std::byte b : data)
    h = (h ^ static_cast<std::uint64_t>(b)) * 1099511628211ull;
  return h;
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

/// Where a save stops, to test what a crash leaves (none: a normal save).
enum class simulated_crash { none, while_writing_rank_files, before_index };

struct save_options {
  simulated_crash crash = simulated_crash::none;
};

namespace detail {

// Calls f(tensor index, tensor element lo, hi, bucket, index into the bucket's shard) for
// every part of a tensor inside this rank's shard.
template <class Opt, class F>
void for_each_shard_part(Opt& opt, F&& f) {
  const auto& l = opt.buckets();
  for (const auto& b : l.buckets()) {
    const std::size_t lo = opt.shard_begin(b), hi = lo + b.shard;
    for (std::size_t t = b.first_tensor; t < b.end_tensor; ++t) {
      const std::size_t p = l.padded_offset(t), n = l.tensors()[t].count;
      const std::size_t a = std::max(lo, p), z = std::min(hi, p + n);
      if (a < z) f(t, a - p, z - p, b, a - lo);
    }
  }
}

template <class Rule>
std::vector<std::string> slot_names(const Rule& r) {
  std::vector<std::string> v;
  for (int k = 0; k < r.slots(); ++k)
    v.emplace_back(Rule::slot_names[k]);
  return v;
}

inline std::optional<index> read_index(const std::filesystem::path& dir) {
  const auto p = dir / "index.json";
  if (!std::filesystem::exists(p)) return std::nullopt;
  const auto bytes = read_file(p);
  return parse_index(bytes, p.string());
}

} // namespace detail

/// Saves opt's model and optimizer state into dir. Collective over dp (the communicator opt
/// was made from).
template <class Opt, communicator Comm>
void save(Opt& opt, Comm& dp, const std::filesystem::path& dir, save_options so = {}) {
  namespace fs = std::filesystem;
  const int rank = dp.rank(), world = dp.size();
  opt.synchronize();
  fs::create_directories(dir);
  const auto old = detail::read_index(dir);
  dp.barrier(); // every rank has read the old index before rank 0 can replace it
  const std::uint64_t gen = (old ? old->generation : 0) + 1;
  const auto file_name = [&](int r) {
    return "g" + std::to_string(gen) + "-rank" + std::to_string(r) + "-of" + std::to_string(world) +
           ".weft";
  };
  const auto slots = detail::slot_names(opt.rule());
  const std::size_t k = opt.slots();
  std::string json = "{\"rank\": " + std::to_string(rank) +
                     ", \"world\": " + std::to_string(world) + ", \"entries\": [";
  std::string data;
  bool first = true;
  const auto add = [&](const std::string& name, std::size_t lo, std::size_t hi,
                       const std::vector<float>& values) {
    std::string bytes(values.size() * 4, '\0');
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto u = std::bit_cast<std::uint32_t>(values[i]);
      for (int j = 0; j < 4; ++j)
        bytes[i * 4 + static_cast<std::size_t>(j)] = static_cast<char>((u >> (8 * j)) & 0xFF);
    }
    const auto sum = fnv1a64(std::as_bytes(std::span(bytes.data(), bytes.size())));
    json += std::string(first ? "" : ", ") + "{\"name\": " + weft::detail::json_quote(name) +
            ", \"dtype\": \"F32\", \"begin\": " + std::to_string(lo) +
            ", \"end\": " + std::to_string(hi) + ", \"offset\": " + std::to_string(data.size()) +
            ", \"bytes\": " + std::to_string(bytes.size()) + ", \"fnv1a64\": \"" +
            detail::hex64(sum) + "\"}";
    first = false;
    data += bytes;
  };
  if (opt.replica_rank() == 0) {
    const auto& ts = opt.buckets().tensors();
    detail::for_each_shard_part(opt, [&](std::size_t t, std::size_t lo, std::size_t hi,
                                         const bucket_info& b, std::size_t at) {
      const auto w = opt.shard_weights(b);
      add(ts[t].name + "/weight", lo, hi,
          std::vector<float>(w.begin() + static_cast<std::ptrdiff_t>(at),
                             w.begin() + static_cast<std::ptrdiff_t>(at + hi - lo)));
      for (std::size_t j = 0; j < k; ++j) {
        const auto s = opt.shard_state(b, j);
        add(ts[t].name + "/" + slots[j], lo, hi,
            std::vector<float>(s.begin() + static_cast<std::ptrdiff_t>(at),
                               s.begin() + static_cast<std::ptrdiff_t>(at + hi - lo)));
      }
    });
  }
  json += "]}";
  std::string file(magic);
  detail::append_u64le(file, json.size());
  file += json;
  file += data;
  detail::write_then_rename(dir / file_name(rank), file,
                            so.crash == simulated_crash::while_writing_rank_files
                                ? file.size() / 2
                                : static_cast<std::size_t>(-1));
  dp.barrier(); // every rank file is complete and renamed
  if (so.crash == simulated_crash::before_index)
    throw error("checkpoint: simulated crash before the index was replaced");
  if (rank == 0) {
    std::string idx = "{\"format\": \"weft-checkpoint-index\", \"version\": 1, \"generation\": " +
                      std::to_string(gen) + ", \"world\": " + std::to_string(world) +
                      ", \"step\": " + std::to_string(opt.steps()) + ", \"rule\": " +
                      weft::detail::json_quote(std::decay_t<decltype(opt.rule())>::name) +
                      ", \"loss_scale\": " + detail::shortest(opt.loss_scale()) +
                      ", \"loss_scaling\": " + (opt.loss_scaling() ? "true" : "false") +
                      ", \"good_steps\": " + std::to_string(opt.good_steps()) + ", \"slots\": [";
    for (std::size_t j = 0; j < slots.size(); ++j)
      idx += (j ? ", " : "") + weft::detail::json_quote(slots[j]);
    idx += "], \"files\": [";
    for (int r = 0; r < world; ++r)
      idx += (r ? ", " : "") + weft::detail::json_quote(file_name(r));
    idx += "], \"tensors\": [";
    const auto& ts = opt.buckets().tensors();
    for (std::size_t t = 0; t < ts.size(); ++t) {
      idx += (t ? ", " : "") + std::string("{\"name\": ") + weft::detail::json_quote(ts[t].name) +
             ", \"elements\": " + std::to_string(ts[t].count) +
             ", \"decay\": " + (ts[t].decay ? "true" : "false") + "}";
    }
    idx += "]}\n";
    detail::write_then_rename(dir / "index.json", idx);
    // The previous generation's files (and what crashed saves left) are no longer named; only
    // names this function writes are removed, never a user's file that looks alike.
    for (const auto& f : fs::directory_iterator(dir)) {
      const auto name = f.path().filename().string();
      bool current = false;
      for (int r = 0; r < world; ++r)
        current = current || name == file_name(r);
      if (!current && detail::is_rank_file_name(name)) {
        std::error_code ec;
        fs::remove(f.path(), ec);
      }
    }
  }
  dp.barrier();
}

namespace detail {

// One part of a tensor that a rank loads: elements [lo, hi) of the weights or of one state slot,
// read into `got` (`have` marks the elements found) and copied to `dst` only once every rank
// has read and checked all of its parts.
struct part_to_load {
  std::size_t lo, hi;
  float* dst;
  std::vector<float> got = {};
  std::vector<char> have = {};
};

struct checkpoint_read {
  index idx;
  std::vector<std::vector<part_to_load>> parts; // per (tensor, kind): tensor * (slots + 1) + kind
};

// Reads and checks, from dir, every part of opt's shard, each exactly once; changes nothing in
// opt. Throws weft::error naming the file and the tensor on anything wrong.
template <class Opt>
checkpoint_read read_parts(Opt& opt, const std::filesystem::path& dir) {
  auto idx = read_index(dir);
  if (!idx) throw error("checkpoint: no index.json in " + dir.string());
  const auto index_name = (dir / "index.json").string();
  const auto& rule = opt.rule();
  if (idx->rule != std::decay_t<decltype(rule)>::name || idx->slots != slot_names(rule)) {
    throw error("checkpoint: " + index_name + " holds the state of rule '" + idx->rule +
                "', the optimizer's is '" + std::string(std::decay_t<decltype(rule)>::name) + "'");
  }
  const auto& ts = opt.buckets().tensors();
  if (idx->tensors.size() != ts.size()) {
    throw error("checkpoint: " + index_name + " has " + std::to_string(idx->tensors.size()) +
                " tensors, the model " + std::to_string(ts.size()));
  }
  for (std::size_t t = 0; t < ts.size(); ++t) {
    const index_tensor& it = idx->tensors[t];
    if (it.name != ts[t].name || it.elements != ts[t].count) {
      throw error("checkpoint: " + index_name + ": tensor " + std::to_string(t) + " is " + it.name +
                  " of " + std::to_string(it.elements) + " elements, the model's " + ts[t].name +
                  " of " + std::to_string(ts[t].count));
    }
    if (it.decay && *it.decay != ts[t].decay) {
      const auto says = [](bool d) {
        return d ? std::string("decays") : std::string("is exempt from weight decay");
      };
      throw error("checkpoint: " + index_name + ": tensor " + it.name + " " + says(*it.decay) +
                  " in the checkpoint, but " + says(ts[t].decay) +
                  " in the model (param_set::add's decay)");
    }
  }
  const std::size_t k = opt.slots();
  std::vector<std::vector<part_to_load>> needs(ts.size() * (k + 1));
  for_each_shard_part(opt, [&](std::size_t t, std::size_t lo, std::size_t hi, const bucket_info& b,
                               std::size_t at) {
    needs[t * (k + 1)].push_back({lo, hi, opt.shard_weights(b).data() + at});
    for (std::size_t j = 0; j < k; ++j)
      needs[t * (k + 1) + 1 + j].push_back({lo, hi, opt.shard_state(b, j).data() + at});
  });
  const auto slots = slot_names(rule);
  const auto which = [&](const std::string& name, std::string_view source) -> std::size_t {
    const auto slash = name.rfind('/');
    if (slash == std::string::npos) fail(source, "tensor " + name + ": not <tensor>/<kind>");
    const auto tensor = name.substr(0, slash), kind = name.substr(slash + 1);
    std::size_t t = 0;
    while (t < ts.size() && ts[t].name != tensor)
      ++t;
    if (t == ts.size()) fail(source, "tensor " + name + ": not in the model");
    if (kind == "weight") return t * (k + 1);
    for (std::size_t j = 0; j < k; ++j) {
      if (slots[j] == kind) return t * (k + 1) + 1 + j;
    }
    fail(source, "tensor " + name + ": unknown kind " + kind);
  };
  for (std::size_t r = 0; r < idx->files.size(); ++r) {
    rank_file file(dir /
                   idx->files[r]); // reads the header; entries only where this rank needs them
    const auto& source = file.source();
    if (file.head().rank != static_cast<int>(r) || file.head().world != idx->world) {
      fail(source, "holds rank " + std::to_string(file.head().rank) + " of " +
                       std::to_string(file.head().world) + ", but " + index_name +
                       " lists it as rank " + std::to_string(r) + " of " +
                       std::to_string(idx->world));
    }
    for (const auto& e : file.head().entries) {
      const std::size_t w = which(e.name, source);
      if (e.end > ts[w / (k + 1)].count)
        fail(source, "tensor " + e.name + ": range beyond the tensor");
      std::vector<std::byte> data;
      for (auto& n : needs[w]) {
        const auto a = std::max<std::uint64_t>(n.lo, e.begin),
                   z = std::min<std::uint64_t>(n.hi, e.end);
        if (a >= z) continue;
        if (data.empty()) data = file.read(e);
        if (n.got.empty()) {
          n.got.resize(n.hi - n.lo);
          n.have.resize(n.hi - n.lo, 0);
        }
        const std::byte* src = data.data() + (a - e.begin) * 4;
        for (std::uint64_t i = a; i < z; ++i, src += 4) {
          std::uint32_t u = 0;
          for (int j = 3; j >= 0; --j)
            u = (u << 8) | static_cast<std::uint32_t>(src[j]);
          if (n.have[i - n.lo] != 0) {
            fail(source, "tensor " + e.name + ": element " + std::to_string(i) +
                             " is given twice (here and in an earlier file)");
          }
          n.have[i - n.lo] = 1;
          n.got[i - n.lo] = std::bit_cast<float>(u);
        }
      }
    }
  }
  for (std::size_t i = 0; i < needs.size(); ++i) {
    for (const auto& n : needs[i]) {
      const auto have = static_cast<std::size_t>(std::count(n.have.begin(), n.have.end(), char{1}));
      if (have != n.hi - n.lo) {
        throw error("checkpoint: " + index_name + ": tensor " + ts[i / (k + 1)].name + "/" +
                    (i % (k + 1) == 0 ? std::string("weight") : slots[i % (k + 1) - 1]) + ": " +
                    std::to_string(n.hi - n.lo - have) + " of elements [" + std::to_string(n.lo) +
                    ", " + std::to_string(n.hi) + ") are in no file");
      }
    }
  }
  return {std::move(*idx), std::move(needs)};
}

} // namespace detail

/// Loads dir into opt (any DP size and sharding policy, the same tensors and rule).
/// Collective over dp. All or nothing: if any rank cannot read or check its part, every rank
/// throws and every rank's optimizer stays as it was.
template <class Opt, communicator Comm>
void load(Opt& opt, Comm& dp, const std::filesystem::path& dir) {
  opt.synchronize();
  std::optional<detail::checkpoint_read> read;
  std::exception_ptr failed;
  try {
    read = detail::read_parts(opt, dir);
  } catch (...) {
    failed = std::current_exception();
  }
  std::int32_t first_failed = failed ? dp.rank() : dp.size();
  all_reduce(dp, std::span(&first_failed, 1), op::min{});
  if (failed) std::rethrow_exception(failed);
  if (first_failed < dp.size()) {
    throw error("checkpoint: rank " + std::to_string(first_failed) +
                " could not load its part of " + (dir / "index.json").string() +
                " (its error says why); no rank loaded anything");
  }
  for (auto& per_kind : read->parts) {
    for (auto& n : per_kind)
      std::copy(n.got.begin(), n.got.end(), n.dst);
  }
  const auto& idx = read->idx;
  opt.restore_counters(idx.step, idx.loss_scale, idx.good_steps, idx.loss_scaling.value_or(true));
  opt.refresh_parameters_from_shards();
  dp.barrier();
}

} // namespace weft::optim::checkpoint
