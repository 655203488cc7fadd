#pragma once
// weft::strategy's weights files (save_weights, load_weights): safetensors under the model's
// names, each rank writing and reading its own slices, at any mesh.
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/core/error.hpp>
#include <weft/io/safetensors.hpp>
#include <weft/layer/model.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/weights.hpp>
#include <weft/strategy/snapshot.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::detail {

// A trainer's weights files (save_weights, load_weights), which depend on the model and the
// communicator alone: one instance serves every mesh, schedule, sharding and optimizer.
template <class Model, communicator Comm>
class strategy_weights {
public:
  using model_config = typename layer::detail::config_of<Model>::type;
  strategy_weights(const model_config& model, const std::vector<layer::parameter<float>>& params,
                   Comm& tp, Comm& pp, Comm& dp, int rank)
      : model_(model), params_(params), tp_(tp), pp_(pp), dp_(dp), rank_(rank) {}

  // The trainer's save_weights; parameter_values is its snapshot, taken collectively.
  void save(const std::string& path, const std::function<strategy_snapshot()>& parameter_values) {
    std::vector<layer::stored_tensor> stored;
    std::string listing;
    agree("save_weights", [&] {
      stored = stored_parameters();
      listing = file_listing(stored);
    });
    const weft::safetensors::header h = file_plan(listing);
    const std::string tmp = path + ".tmp";
    const bool first = tp_.rank() == 0 && pp_.rank() == 0 && dp_.rank() == 0;
    agree("save_weights", [&] {
      if (first) weft::safetensors::create(tmp, h);
    });
    const strategy_snapshot values = parameter_values();
    agree("save_weights", [&] {
      if (dp_.rank() != 0) return;
      for (std::size_t k = 0; k < values.size(); ++k) {
        const auto& q = values[k];
        if (!stored[k].written || q.duplicate || (q.replicated && tp_.rank() != 0)) continue;
        layer::write_slice(tmp, h, stored[k], q);
      }
    });
    agree("save_weights", [&] {
      if (first) durable_rename(tmp, path);
    });
  }

  // The trainer's load_weights up to the values, which it returns in the optimizer's order.
  std::vector<float> load(const std::string& path) {
    std::vector<layer::stored_tensor> stored;
    std::string listing;
    agree("load_weights", [&] {
      stored = stored_parameters();
      listing = file_listing(stored);
    });
    const weft::safetensors::header expected = file_plan(listing);
    std::vector<matrix<float>> values(params_.size());
    agree("load_weights", [&] {
      const weft::safetensors::header h = weft::safetensors::read_header(path);
      for (const auto& [key, value] : h.metadata) {
        const auto mine = expected.metadata.find(key);
        if (key.rfind("weft.", 0) == 0 && mine != expected.metadata.end() &&
            mine->second != value) {
          throw error(path + ": the file's model has " + key.substr(5) + " " + value +
                      ", this one " + mine->second);
        }
      }
      const std::map<std::string, std::string> names = file_names(expected, h, path);
      for (std::size_t k = 0; k < params_.size(); ++k) {
        auto s = stored[k];
        s.name = names.at(s.name);
        layer::read_slice(path, h, s, params_[k], values[k]);
      }
    });
    std::vector<float> flat;
    for (std::size_t k = 0; k < params_.size(); ++k)
      flat.insert(flat.end(), values[k].flat().begin(), values[k].flat().end());
    return flat;
  }

private:
  // Runs f; if it throws on any rank, every rank throws: the failed ranks their own error, the
  // others one that names the first failed rank. Collective (reductions over tp, pp and dp).
  template <class F>
  void agree(const char* what, F&& f) {
    std::string failure;
    try {
      f();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    std::int32_t failed[1] = {failure.empty() ? 0 : rank_ + 1};
    all_reduce(tp_, std::span<std::int32_t>(failed), op::max{});
    all_reduce(pp_, std::span<std::int32_t>(failed), op::max{});
    all_reduce(dp_, std::span<std::int32_t>(failed), op::max{});
    if (!failure.empty())
      throw error("strategy", rank_, error::unknown, std::string(what) + ": " + failure);
    if (failed[0] != 0) {
      throw error("strategy", rank_, error::unknown,
                  std::string(what) + ": rank " + std::to_string(failed[0] - 1) +
                      " failed (its error says why)");
    }
  }

  // How each of this rank's parameters is stored (layer/weights.hpp).
  std::vector<layer::stored_tensor> stored_parameters() const {
    std::vector<layer::stored_tensor> out;
    for (const auto& q : params_)
      out.push_back(layer::stored_as<Model>(model_, q.name));
    return out;
  }

  // This rank's tensors of the file, a line each: name, then the shape, tab-separated.
  std::string file_listing(const std::vector<layer::stored_tensor>& stored) const {
    std::string mine;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      if (!stored[k].written) continue;
      const auto shape = layer::stored_shape(stored[k], params_[k].full_rows, params_[k].full_cols);
      mine += stored[k].name;
      for (std::size_t n : shape)
        mine += '\t' + std::to_string(n);
      mine += '\n';
    }
    return mine;
  }

  // The file every rank agrees on: the tensors written by every pipeline stage (the listings
  // gathered over pp; TP and DP ranks of a stage hold the same names), in name order, float32,
  // the model's facts as metadata. Collective over pp.
  weft::safetensors::header file_plan(const std::string& mine) {
    std::int32_t longest[1] = {static_cast<std::int32_t>(mine.size())};
    all_reduce(pp_, std::span<std::int32_t>(longest), op::max{});
    std::vector<std::int32_t> text(static_cast<std::size_t>(longest[0]), 0);
    std::copy(mine.begin(), mine.end(), text.begin());
    std::vector<std::int32_t> all(text.size() * static_cast<std::size_t>(pp_.size()));
    all_gather(pp_, std::span<const std::int32_t>(text), std::span<std::int32_t>(all));
    std::map<std::string, std::vector<std::size_t>> tensors;
    std::string line;
    for (std::int32_t ch : all) {
      if (ch == 0) continue;
      if (ch != '\n') {
        line += static_cast<char>(ch);
        continue;
      }
      std::vector<std::size_t> shape;
      std::size_t tab = line.find('\t');
      const std::string name = line.substr(0, tab);
      while (tab != std::string::npos) {
        const std::size_t next = line.find('\t', tab + 1);
        shape.push_back(std::stoull(line.substr(tab + 1, next - tab - 1)));
        tab = next;
      }
      tensors.emplace(name, std::move(shape));
      line.clear();
    }
    std::vector<weft::safetensors::tensor_spec> specs;
    for (auto& [name, shape] : tensors)
      specs.push_back({name, weft::safetensors::dtype::f32, shape});
    auto metadata = layer::stored_facts<Model>(model_);
    metadata.emplace("format", "pt");
    return weft::safetensors::plan(specs, metadata);
  }

  // Renames the written file into place once its bytes, and then the rename, are on disk: a
  // crash leaves the old file or the whole new one.
  static void durable_rename(const std::string& from, const std::string& to) {
    const auto sync = [](const std::string& p, int flags) {
      const int fd = ::open(p.c_str(), flags);
      if (fd < 0 || ::fsync(fd) != 0) {
        const int e = errno;
        if (fd >= 0) ::close(fd);
        throw error(p + ": cannot sync to disk: " + std::strerror(e));
      }
      ::close(fd);
    };
    sync(from, O_RDONLY);
    std::filesystem::rename(from, to);
    const auto dir = std::filesystem::absolute(to).parent_path();
    sync(dir.string(), O_RDONLY | O_DIRECTORY);
  }

  // The file's name of each expected tensor (GPT-2's may lack "transformer."), after checking
  // that the file holds exactly the expected tensors, with their shapes, in a float dtype.
  static std::map<std::string, std::string> file_names(const weft::safetensors::header& expected,
                                                       const weft::safetensors::header& file,
                                                       const std::string& path) {
    std::map<std::string, std::string> names;
    const std::string prefix = "transformer.";
    for (const auto& t : expected.tensors) {
      const auto* f = file.find(t.name);
      if (f == nullptr && t.name.rfind(prefix, 0) == 0) f = file.find(t.name.substr(prefix.size()));
      const auto shape = [](const std::vector<std::size_t>& v) {
        std::string s = "[";
        for (std::size_t i = 0; i < v.size(); ++i)
          s += (i ? ", " : "") + std::to_string(v[i]);
        return s + "]";
      };
      if (f == nullptr)
        throw error(path + ": tensor '" + t.name + "' of the model is not in the file");
      if (f->shape != t.shape) {
        throw error(path + ": tensor '" + f->name + "' is " + shape(f->shape) +
                    ", the model's is " + shape(t.shape));
      }
      if (!weft::safetensors::converts_to_float(f->type)) {
        throw error(path + ": tensor '" + f->name + "' is " +
                    std::string(weft::safetensors::dtype_name(f->type)) +
                    "; weights load from F32, F64, F16 or BF16");
      }
      names.emplace(t.name, f->name);
    }
    for (const auto& f : file.tensors) {
      bool used = false;
      for (const auto& [want, have] : names)
        used = used || have == f.name;
      if (!used && !layer::stored_buffer<Model>(f.name)) {
        throw error(path + ": tensor '" + f.name + "' is not a parameter of the model");
      }
    }
    return names;
  }

  const model_config& model_;
  const std::vector<layer::parameter<float>>& params_; // names and shapes, in the optimizer's order
  Comm& tp_;
  Comm& pp_;
  Comm& dp_;
  int rank_;
};

} // namespace weft::detail
