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
#include <weft/optim/checkpoint/format.hpp>
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
