#pragma once
// A parameter set: named tensors (shape, offset) laid out in one flat buffer, split into
// buckets, and each bucket split into equal shards, one per rank of a sharding group.
//
//   flat (unpadded)   | a.w (6) | a.b (2) | b.w (6) | b.b (2) |
//   buckets (>= 8)    | bucket 0: a.w a.b     | bucket 1: b.w b.b     |
//   padded, N = 3     | 8 + 1 pad             | 8 + 1 pad             |
//   shard of rank r   | elements [3r, 3r+3) of every bucket, bucket after bucket
//
// Every bucket is padded to a multiple of N with zeros, so the shards are equal (balanced to
// within one element per bucket); padding() says how many elements that costs. A tensor is
// never split across buckets; a bucket closes once it holds at least bucket_elements. A set may
// group its tensors into units (param_set::end_unit: a model's blocks, which a trainer gathers and
// frees as one under zero<3>, as FSDP wraps them): buckets then close only between units, so a
// unit is never split, and bucket_elements = 1 makes one bucket per unit.
//
// Weight decay is per tensor (biases and norm weights are exempt, as Megatron, nanoGPT and
// Hugging Face group them), but a shard cuts through tensors anywhere: layout::decay_runs
// says, once per bucket and shard, which stretches of the shard decay, for every update
// loop (host and device) to follow.
#include <weft/core/error.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace weft::optim {

struct tensor_info {
  std::string name;
  std::vector<std::size_t> shape;
  std::size_t offset = 0; // in the unpadded flat layout (param_set order)
  std::size_t count = 0;
  std::size_t bucket = 0;
  std::size_t bucket_offset = 0; // position inside its bucket
  bool replicated = false;       // the same on every model-parallel rank (counted once in the norm)
  bool tied_copy = false;        // a second copy of a tied tensor (never counted in the norm)
  bool decay = true;             // the rule's weight decay applies (false: biases, norm weights)
  bool ends_unit = false;        // the last tensor of a unit (param_set::end_unit)
};

/// A stretch [begin, begin + count) of one bucket's shard, in elements from the shard's start,
/// whose elements all decay or all do not.
struct decay_run {
  std::size_t begin = 0;
  std::size_t count = 0;
  bool decay = true;
  friend constexpr bool operator==(const decay_run&, const decay_run&) = default;
};

/// Megatron-core DDP's default bucket size: max(4e7, 1e6 x data-parallel size) elements.
[[nodiscard]] constexpr std::size_t default_bucket_elements(int dp) noexcept {
  return std::max<std::size_t>(40'000'000, std::size_t{1'000'000} * static_cast<std::size_t>(dp));
}

/// The named tensors of a model, in registration order.
class param_set {
public:
  /// Adds a tensor; returns its index. Names must be unique and non-empty. `replicated`: the
  /// tensor is the same on every rank of the model-parallel group (a tensor-parallel layer's
  /// bias or norm), so a global gradient norm counts it once (see data_parallel::set_norm_group).
  /// `decay`: the rule's weight decay applies to it; false for biases and norm weights, whose
  /// decay pulls them towards 0 for no regularizing gain (the rule then updates them with
  /// weight_decay 0, under every sharding).
  std::size_t add(std::string name, std::vector<std::size_t> shape, bool replicated = false,
                  bool decay = true) {
    if (name.empty()) throw error("param_set::add: empty tensor name");
    for (const auto& t : tensors_) {
      if (t.name == name) throw error("param_set::add: tensor '" + name + "' added twice");
    }
    tensor_info t;
    t.count = std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>{});
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.offset = total_;
    t.replicated = replicated;
    t.decay = decay;
    total_ += t.count;
    tensors_.push_back(std::move(t));
    return tensors_.size() - 1;
  }
  /// Marks tensor `index` as the second copy of a tied tensor (a language-model head tied to the
  /// embedding table, on this or another rank): its gradient is the first copy's, summed over
  /// both, so a global gradient norm leaves it out and counts the first copy once.
  void mark_tied_copy(std::size_t index) {
    if (index >= tensors_.size()) {
      throw error("param_set::mark_tied_copy: no tensor " + std::to_string(index) +
                  " (the set has " + std::to_string(tensors_.size()) + ")");
    }
    tensors_[index].tied_copy = true;
  }
  /// Closes a unit: the tensors added since the last end_unit() (or the start) stay in one
  /// bucket, and buckets close only at such boundaries. No call: every tensor is a unit.
  void end_unit() {
    if (tensors_.empty()) throw error("param_set::end_unit: no tensor added yet");
    tensors_.back().ends_unit = true;
    units_ = true;
  }
  /// Whether end_unit() was called (the set is grouped into units).
  [[nodiscard]] bool has_units() const noexcept { return units_; }
  [[nodiscard]] const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  /// Elements of all tensors (Psi).
  [[nodiscard]] std::size_t elements() const noexcept { return total_; }
  [[nodiscard]] std::size_t index_of(std::string_view name) const {
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].name == name) return i;
    }
    throw error("param_set: no tensor named '" + std::string(name) + "'");
  }

private:
  std::vector<tensor_info> tensors_;
  std::size_t total_ = 0;
  bool units_ = false;
};

struct bucket_info {
  std::size_t first_tensor = 0, end_tensor = 0; // [first, end) of the tensors
  std::size_t elements = 0;                     // unpadded
  std::size_t offset = 0;                       // in the padded flat layout
  std::size_t padded = 0;                       // elements, a multiple of shards
  std::size_t shard = 0;                        // padded / shards
  std::size_t shard_offset = 0; // where this bucket's shard starts in a rank's shard buffer
};

/// The bucket and shard layout of a param_set for a group of `shards` ranks.
class layout {
public:
  layout() = default;
  layout(const param_set& ps, std::size_t bucket_elements, int shards) : shards_(shards) {
    if (shards < 1)
      throw error("optim::layout: the number of shards must be >= 1, got " +
                  std::to_string(shards));
    if (bucket_elements == 0) throw error("optim::layout: bucket size must be > 0 elements");
    tensors_ = ps.tensors();
    const auto n = static_cast<std::size_t>(shards);
    bucket_info b;
    const auto close = [&](std::size_t end) {
      b.end_tensor = end;
      b.padded = (b.elements + n - 1) / n * n;
      b.shard = b.padded / n;
      b.offset = padded_total_;
      b.shard_offset = shard_total_;
      padded_total_ += b.padded;
      shard_total_ += b.shard;
      buckets_.push_back(b);
      b = bucket_info{};
      b.first_tensor = end;
    };
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      tensors_[i].bucket = buckets_.size();
      tensors_[i].bucket_offset = b.elements;
      b.elements += tensors_[i].count;
      const bool boundary = !ps.has_units() || tensors_[i].ends_unit || i + 1 == tensors_.size();
      if (boundary && b.elements >= bucket_elements) close(i + 1);
    }
    if (b.elements > 0 || buckets_.empty()) {
      close(tensors_.size());
    } else if (b.first_tensor < tensors_.size()) {
      // Only empty tensors after the last bucket closed: they join it (a bucket of their own
      // would have no elements to reduce).
      bucket_info& last = buckets_.back();
      for (std::size_t i = b.first_tensor; i < tensors_.size(); ++i) {
        tensors_[i].bucket = buckets_.size() - 1;
        tensors_[i].bucket_offset = last.elements;
      }
      last.end_tensor = tensors_.size();
    }
    elements_ = ps.elements();
  }

  [[nodiscard]] int shards() const noexcept { return shards_; }
  [[nodiscard]] const std::vector<bucket_info>& buckets() const noexcept { return buckets_; }
  [[nodiscard]] const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] std::size_t elements() const noexcept { return elements_; }
  /// Elements of the padded flat buffer (a multiple of shards per bucket).
  [[nodiscard]] std::size_t padded_elements() const noexcept { return padded_total_; }
  /// Zero elements added so that every bucket divides by the number of shards.
  [[nodiscard]] std::size_t padding() const noexcept { return padded_total_ - elements_; }
  /// Elements of one rank's shard (the same on every rank).
  [[nodiscard]] std::size_t shard_elements() const noexcept { return shard_total_; }
  /// Where tensor t starts in the padded flat layout.
  [[nodiscard]] std::size_t padded_offset(std::size_t t) const {
    const auto& ti = tensors_.at(t);
    return buckets_[ti.bucket].offset + ti.bucket_offset;
  }
  /// The runs of equal decay that cover shard `shard` (0 <= shard < shards()) of bucket
  /// `bucket`, in order, from the shard's first element to its last: neighbouring tensors of
  /// the same decay share a run, and the bucket's padding joins the run before it (padding is
  /// zero and stays zero under any rule, decayed or not), so a shard whose tensors all decay
  /// is one run. A shard of padding only is one decaying run; an empty shard has none.
  [[nodiscard]] std::vector<decay_run> decay_runs(std::size_t bucket, int shard) const {
    const bucket_info& b = buckets_.at(bucket);
    if (shard < 0 || shard >= shards_) {
      throw error("optim::layout::decay_runs: shard " + std::to_string(shard) + " of " +
                  std::to_string(shards_));
    }
    std::vector<decay_run> runs;
    if (b.shard == 0) return runs;
    const std::size_t lo = static_cast<std::size_t>(shard) * b.shard,
                      hi = lo + b.shard; // in the bucket
    for (std::size_t t = b.first_tensor; t < b.end_tensor; ++t) {
      const tensor_info& ti = tensors_[t];
      const std::size_t from = std::max(lo, ti.bucket_offset),
                        to = std::min(hi, ti.bucket_offset + ti.count);
      if (from >= to) continue;
      if (!runs.empty() && runs.back().decay == ti.decay) {
        runs.back().count = to - lo - runs.back().begin;
      } else {
        runs.push_back({from - lo, to - from, ti.decay});
      }
    }
    if (runs.empty()) runs.push_back({0, 0, true});
    runs.back().count = b.shard - runs.back().begin; // the padding, if any
    return runs;
  }
  /// Calls f(unpadded_offset, padded_offset, count) for each tensor: for copying between layouts.
  template <class F>
  void for_each_tensor(F&& f) const {
    for (std::size_t t = 0; t < tensors_.size(); ++t)
      f(tensors_[t].offset, padded_offset(t), tensors_[t].count);
  }

private:
  int shards_ = 1;
  std::vector<tensor_info> tensors_;
  std::vector<bucket_info> buckets_;
  std::size_t elements_ = 0, padded_total_ = 0, shard_total_ = 0;
};

} // namespace weft::optim
