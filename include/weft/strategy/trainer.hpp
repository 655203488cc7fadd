#pragma once
// The body of weft::strategy's trainer (weft/strategy.hpp), templated on everything but the
// mesh: one instance serves every mesh of the same schedule, sharding, recompute, sequence
// parallelism, model, rule and communicator.
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/broadcast.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/core/error.hpp>
#include <weft/io/safetensors.hpp>
#include <weft/layer/block.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/cross_entropy.hpp>
#include <weft/layer/embedding.hpp>
#include <weft/layer/gpt.hpp>
#include <weft/layer/layer_norm.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/model.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>
#include <weft/layer/recompute.hpp>
#include <weft/layer/weights.hpp>
#include <weft/mesh/make_comms.hpp>
#include <weft/mesh/mesh.hpp>
#include <weft/optim/data_parallel.hpp>
#include <weft/optim/optimizers.hpp>
#include <weft/optim/param_set.hpp>
#include <weft/optim/sharding.hpp>
#include <weft/pipeline/executor.hpp>
#include <weft/pipeline/generators.hpp>
#include <weft/pipeline/layout.hpp>
#include <weft/strategy/config.hpp>
#include <weft/strategy/snapshot.hpp>
#include <weft/strategy/traits.hpp>
#include <weft/strategy/weights.hpp>
#include <weft/topology/topology.hpp>

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

// The trainer's check of a train_step's batch (its size, every id inside the vocabulary),
// which depends on the model's configuration alone.
template <class Config>
void check_strategy_batch(const Config& config, int rank, std::span<const std::int32_t> ids,
                          std::span<const std::int32_t> targets) {
  const std::size_t want = config.global_batch * config.model.seq;
  if (ids.size() != want || targets.size() != want) {
    throw error("strategy", rank, error::unknown,
                "train_step: " + std::to_string(ids.size()) + " ids and " +
                    std::to_string(targets.size()) +
                    " targets, expected global_batch x seq = " + std::to_string(want) + " of each");
  }
  const auto vocab = static_cast<std::int64_t>(config.model.vocab);
  const auto bad = [&](std::span<const std::int32_t> v, const char* what, auto allowed) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if ((v[i] < 0 || v[i] >= vocab) && !allowed(v[i])) {
        throw error("strategy", rank, error::unknown,
                    std::string("train_step: ") + what + " " + std::to_string(i) + " (sequence " +
                        std::to_string(i / config.model.seq) + ") is " + std::to_string(v[i]) +
                        ", outside the vocabulary of " + std::to_string(vocab));
      }
    }
  };
  bad(ids, "token id", [](std::int32_t) { return false; });
  if constexpr (requires { config.model.ignore_index; }) {
    bad(targets, "target", [&](std::int32_t t) { return t == config.model.ignore_index; });
  }
}

// strategy<...>::trainer's body: everything but the split of the world by the mesh. Templated
// on what it uses, not on the mesh, so that the meshes a program names share one instance.
template <class Schedule, class Sharding, class Recompute, class SP, class Model, class Rule,
          communicator Comm>
class strategy_trainer {
public:
  using T = float;
  using config = basic_strategy_config<typename layer::detail::config_of<Model>::type>;
  static constexpr int chunks = schedule_chunks<Schedule>();
  static_assert(layer::detail::model_check<Model, T, Comm, layer::cblas, SP, Recompute>::value);
  using parts = typename Model::template parts<T, Comm, layer::cblas, SP, Recompute>;
  using block_type = typename parts::block;
  using embedding_type = typename parts::embedding;
  using head_type = typename parts::head;

protected:
  // `split` makes the tp, pp and dp communicators of `world` by the strategy's mesh, which
  // nothing else here depends on: one instantiation of this class serves every mesh.
  strategy_trainer(Comm& world, config cfg, Rule rule,
                   axis_comms<Comm> (*split)(Comm&, const config&))
      : config_(std::move(cfg)),
        comms_(split(world, config_)),
        tp_(comms_.tp()),
        pp_(comms_.pp()),
        dp_(comms_.dp()),
        rank_(world.rank()) {
    const weft::detail::tally_scope charged(tally_); // the layers' matrices count in memory()
    if constexpr (requires(Comm & c) {
                    c.set_axis(std::string());
                  }) { // weft::traced: name the axes
      tp_.set_axis("tp");
      pp_.set_axis("pp");
      dp_.set_axis("dp");
    }
    const auto& m = config_.model;
    const int p = pp_.size();
    const int dp = dp_.size();
    const int vstages = p * chunks;
    const auto fail = [&](const std::string& what) {
      throw error("strategy", rank_, error::unknown, what);
    };
    if (m.seq == 0 || m.hidden == 0 || m.vocab == 0 || m.layers == 0) {
      fail("the model needs a positive vocab, hidden, seq and layers");
    }
    if (config_.micro_batch == 0) fail("micro_batch must be at least 1");
    if (config_.prefetch) {
      if (Sharding::stage != 3) {
        fail("prefetch " + std::to_string(*config_.prefetch) +
             ": only zero<3> gathers parameters ahead of use; leave it unset for zero<" +
             std::to_string(Sharding::stage) + ">");
      }
      if (*config_.prefetch < 0)
        fail("prefetch must be 0 or more, not " + std::to_string(*config_.prefetch));
      prefetch_ = *config_.prefetch;
    }
    if (config_.gradient_sync == optim::gradient_sync::every) {
      if (Sharding::stage < 2) {
        fail("gradient_sync every: zero<" + std::to_string(Sharding::stage) +
             "> keeps whole gradients and reduces them once a step; reducing every microbatch "
             "into a shard is zero<2>/<3>'s (leave gradient_sync last)");
      }
      if (config_.optimizer.bucket_elements > 1) {
        fail(
            "gradient_sync every reduces each unit's bucket after its backward, so each unit "
            "is a bucket: leave optimizer.bucket_elements 0 (or 1), not " +
            std::to_string(config_.optimizer.bucket_elements));
      }
    }
    if (config_.optimizer.loss_scaling.value_or(false)) {
      fail(
          "optimizer.loss_scaling: the strategy trains in float and does not scale its losses; "
          "leave it unset");
    }
    const std::size_t per_step = config_.micro_batch * static_cast<std::size_t>(dp);
    if (config_.global_batch == 0 || config_.global_batch % per_step != 0) {
      fail("a global batch of " + std::to_string(config_.global_batch) +
           " sequences does not split into " + std::to_string(dp) +
           " data-parallel ranks x microbatches of " + std::to_string(config_.micro_batch));
    }
    microbatches_ = static_cast<int>(config_.global_batch / per_step);
    tokens_ = config_.micro_batch * m.seq;
    if (SP::enabled && tokens_ % static_cast<std::size_t>(tp_.size()) != 0) {
      fail("sequence parallelism: a microbatch of " + std::to_string(tokens_) +
           " tokens does not split over " + std::to_string(tp_.size()) + " tensor-parallel ranks");
    }
    rows_ = SP::enabled ? tokens_ / static_cast<std::size_t>(tp_.size()) : tokens_;
    layout_ = config_.layout.empty() ? pipeline::even_layout(static_cast<int>(m.layers), vstages)
                                     : config_.layout;
    pipeline::check_layout(layout_, static_cast<int>(m.layers), vstages);
    first_layer_.assign(layout_.size() + 1, 0);
    for (std::size_t v = 0; v < layout_.size(); ++v)
      first_layer_[v + 1] = first_layer_[v] + layout_[v];

    // This rank's layers: the blocks of its virtual stages, the embedding on the first, the rest on
    // the last.
    const int r = pp_.rank();
    chunks_.resize(chunks);
    for (int c = 0; c < chunks; ++c) {
      const auto v = static_cast<std::size_t>(c * p + r);
      for (int l = first_layer_[v]; l < first_layer_[v + 1]; ++l) {
        chunks_[static_cast<std::size_t>(c)].emplace_back(std::make_unique<block_type>(
            tp_, m, static_cast<std::size_t>(l), config_.seed, layer::cblas{}));
      }
    }
    if (r == 0) embedding_ = std::make_unique<embedding_type>(tp_, m, config_.seed, layer::cblas{});
    if (r == p - 1) head_ = std::make_unique<head_type>(tp_, m, config_.seed, layer::cblas{});
    tied_ = layer::tied<Model>(m);
    if (tied_ && p > 1) {
      // The embedding group: the first and the last pipeline stage of this TP and DP position.
      embedding_group_.emplace(pp_.split(r == 0 || r == p - 1 ? 0 : 1, r));
    }
    if (tied_) share_tied_weight();

    // The optimizer's tensors, unit by unit (the embedding stage, the head stage, then each
    // block: what zero<3> gathers and frees as one), each unit's tensors in the order of the
    // matrices they live in, so that every layer matrix is one stretch of a bucket.
    const T* tied_head = tied_ && head_ ? head_->tied_weight().value.data() : nullptr;
    const auto add_unit = [&](std::string prefix, auto* layer) {
      units_.push_back({});
      units_.back().prefix = prefix;
      units_.back().parameters = [layer, prefix] {
        auto qs = layer->parameters();
        for (auto& q : qs)
          q.name = prefix + q.name;
        return qs;
      };
      return units_.size() - 1;
    };
    if (embedding_) embedding_unit_ = add_unit("embedding.", embedding_.get());
    if (head_) head_unit_ = add_unit("head.", head_.get());
    chunk_units_.resize(chunks_.size());
    for (int c = 0; c < chunks; ++c) {
      const auto v = static_cast<std::size_t>(c * p + r);
      for (std::size_t k = 0; k < chunks_[static_cast<std::size_t>(c)].size(); ++k) {
        chunk_units_[static_cast<std::size_t>(c)].push_back(
            add_unit("block" + std::to_string(first_layer_[v] + static_cast<int>(k)) + ".",
                     chunks_[static_cast<std::size_t>(c)][k].get()));
      }
    }
    optim::param_set ps;
    std::vector<float> initial;
    for (auto& u : units_) {
      u.first_tensor = params_.size();
      for (auto& q : in_storage_order(u)) {
        const std::size_t index =
            ps.add(q.name, {q.value.rows(), q.value.cols()}, q.replicated, q.decay);
        if ((tied_head != nullptr && q.value.data() == tied_head) || q.duplicate) {
          ps.mark_tied_copy(index); // the embedding table, or the first replica, counts it
        }
        const std::size_t at = initial.size();
        initial.resize(at + q.value.size());
        copy_to_flat(q.value, std::span<float>(initial).subspan(at, q.value.size()));
        q.value = {nullptr, q.value.rows(), q.value.cols()}; // the shape only: the values move
        q.grad = {nullptr, q.grad.rows(), q.grad.cols()};
        params_.push_back(std::move(q));
      }
      for (auto& mx :
           u.matrices) { // the layer's own copies go now: the optimizer's take their place
        mx.value.bind(mx.value.owner, nullptr);
        mx.grad.bind(mx.grad.owner, nullptr);
      }
      u.end_tensor = params_.size();
      if (u.end_tensor > u.first_tensor) ps.end_unit();
      // A tied model's embedding table and the head's copy are made ready after the pipeline,
      // once their gradients are summed.
      const auto index = static_cast<std::size_t>(&u - units_.data());
      u.deferred = tied_ && (index == embedding_unit_ || index == head_unit_);
    }
    auto options = config_.optimizer;
    if ((Sharding::stage == 3 || every_microbatch()) && options.bucket_elements == 0)
      options.bucket_elements = 1; // a bucket per unit
    optimizer_ = std::make_unique<optimizer_type>(dp_, ps, rule, options);
    if (tp_.size() * p > 1) {
      // The global gradient norm (clipping, overflow) over the whole model: every rank that holds
      // this rank's replica of the optimizer's shards (zero<0>: this DP index; zero<k>: all),
      // tensor-replicated parameters counted on TP rank 0 only.
      Comm model_group = world.split(optimizer_->replica_rank(), world.rank());
      optimizer_->set_norm_group(model_group, tp_.rank());
    }
    optimizer_->set_parameters(initial);
    std::vector<float>().swap(initial);
    const auto& ts = optimizer_->buckets().tensors();
    for (auto& u : units_) {
      if (u.end_tensor == u.first_tensor) continue;
      u.first_bucket = ts[u.first_tensor].bucket;
      u.end_bucket = ts[u.end_tensor - 1].bucket + 1;
      // The layers compute in the optimizer's buffers from now on; their own copies are freed.
      bind_values(u, Sharding::stage < 3);
      bind_gradients(u, Sharding::stage < 2);
    }
    executor_.emplace(pp_, microbatches_, rows_ * m.hidden);
    // The order this rank uses its units in a step, for zero<3>'s prefetch.
    for (const auto& a : executor_->schedule().ranks[static_cast<std::size_t>(r)]) {
      const int v = a.chunk * p + r;
      const auto& blocks = chunk_units_[static_cast<std::size_t>(a.chunk)];
      if (a.kind == pipeline::action_kind::forward) {
        if (v == 0) sequence_.push_back(embedding_unit_);
        sequence_.insert(sequence_.end(), blocks.begin(), blocks.end());
        if (v == vstages - 1) sequence_.push_back(head_unit_);
      } else if (a.kind == pipeline::action_kind::backward) {
        sequence_.insert(sequence_.end(), blocks.rbegin(), blocks.rend());
        if (v == 0) sequence_.push_back(embedding_unit_);
      }
    }
  }

public:
  strategy_trainer(const strategy_trainer&) = delete;
  strategy_trainer& operator=(const strategy_trainer&) = delete;

  /// One optimizer step on the global batch: ids and targets of global_batch sequences of seq
  /// tokens each, the same on every rank. Returns the mean token loss, on every rank.
  /// A batch that is not the right size or holds a token outside the vocabulary is refused before
  /// anything changes. A step that fails part-way (a peer's failure, a timeout) leaves the
  /// gradients and stashes of a half-run pipeline behind: every later train_step throws that
  /// first error (make a new trainer, or load weights into one).
  double train_step(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets) {
    if (!broken_.empty()) {
      throw error("strategy", rank_, error::unknown,
                  "train_step: an earlier train_step failed part-way and left this trainer's state "
                  "undefined: " +
                      broken_);
    }
    check_strategy_batch(config_, rank_, ids, targets);
    try {
      return run_step(ids, targets);
    } catch (const std::exception& e) {
      broken_ = e.what();
      throw;
    }
  }

private:
  double run_step(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets) {
    const std::size_t want = ids.size();
    // This DP rank's samples.
    const std::size_t mine = want / static_cast<std::size_t>(dp_.size());
    ids_ = ids.subspan(static_cast<std::size_t>(dp_.rank()) * mine, mine);
    targets_ = targets.subspan(static_cast<std::size_t>(dp_.rank()) * mine, mine);
    // Every microbatch's loss is its counted tokens' sum over the whole batch's count: the sums
    // over microbatches and replicas are then the batch's mean, however unevenly the ignored
    // targets fall (a mean per microbatch, averaged, would weigh their tokens unequally).
    if (head_) {
      const std::size_t counted =
          layer::vocab_parallel_cross_entropy<T, Comm>::counted(targets, head_->ignore_index());
      divisor_ = static_cast<double>(std::max<std::size_t>(counted, 1));
    }
    const weft::detail::tally_scope charged(tally_);
    timeline_.clear();
    optimizer_->reset_peaks();
    tally_->reset_peak();
    activations_.peak = activations_.current;
    for (auto& u : units_)
      u.backwards = 0;
    cursor_ = 0;
    for (std::size_t k = 0; k < sequence_.size() && k < static_cast<std::size_t>(prefetch_); ++k) {
      prefetch(units_[sequence_[k]]);
    }
    const auto t0 = clock::now();
    stage st{*this};
    const std::vector<double> losses = executor_->run(st);
    const auto t1 = clock::now();
    finish_tied();
    optimizer_->step(1.0f); // the losses are divided by the batch's count already
    const auto t2 = clock::now();
    timeline_.push_back({"optimizer", t1, t2});
    pipeline_seconds_ = std::chrono::duration<double>(t1 - t0).count();
    optimizer_seconds_ = std::chrono::duration<double>(t2 - t1).count();
    // The mean over the global batch: the last stage's sums, reduced over pp and dp.
    double loss[1] = {0.0};
    for (double l : losses)
      loss[0] += l;
    if (pp_.size() > 1) all_reduce(pp_, std::span<double>(loss));
    if (dp_.size() > 1) all_reduce(dp_, std::span<double>(loss));
    return loss[0];
  }

public:
  [[nodiscard]] int microbatches() const noexcept { return microbatches_; }
  /// Blocks per virtual stage.
  [[nodiscard]] const std::vector<int>& layout() const noexcept { return layout_; }
  [[nodiscard]] const axis_comms<Comm>& comms() const noexcept { return comms_; }
  [[nodiscard]] axis_comms<Comm>& comms() noexcept { return comms_; }
  [[nodiscard]] optim::memory_report optimizer_memory() const { return optimizer_->memory(); }
  /// What this rank holds, by category, now and at most during the last step (memory_account).
  [[nodiscard]] memory_account memory() const {
    const optim::memory_report r = optimizer_->memory();
    const auto fixed = [](std::size_t bytes) { return memory_account::amount{bytes, bytes}; };
    const auto held = [](optim::memory_report::amount a) {
      return memory_account::amount{a.current, a.peak};
    };
    memory_account m;
    m.weights = fixed(r.parameters);
    m.gathered_weights = held(r.gathered_weights);
    m.gradients = fixed(r.gradients);
    m.gradient_buckets = held(r.gradient_buckets);
    m.optimizer_state = fixed(r.optimizer_state + r.slot_gap);
    m.master_weights = fixed(r.master_weights);
    m.activations = activations_;
    m.activations_counted = layer::detail::counts_bytes<typename block_type::activations>;
    m.scratch = held(r.scratch);
    const auto bytes = [](std::int64_t b) {
      return static_cast<std::size_t>(std::max<std::int64_t>(b, 0));
    };
    m.workspace = {bytes(tally_->current.load()), bytes(tally_->peak.load())};
    return m;
  }
  [[nodiscard]] const pipeline::schedule& schedule() const noexcept {
    return executor_->schedule();
  }
  /// Seconds of the last step in the pipeline (forward, backward and their communication) and
  /// in the gradient reduction and update.
  [[nodiscard]] double pipeline_seconds() const noexcept { return pipeline_seconds_; }
  [[nodiscard]] double optimizer_seconds() const noexcept { return optimizer_seconds_; }

  /// The compute of the last step on this rank: "F3.1" (microbatch 3's forward of chunk 1),
  /// "B3.1", "loss3", "optimizer" (gradients into the optimizer, its step, parameters back).
  struct span {
    std::string name;
    std::chrono::steady_clock::time_point begin, end;
  };
  [[nodiscard]] const std::vector<span>& timeline() const noexcept { return timeline_; }
  /// This rank's parameters as of the last step (its TP slice of its stages' layers), named as
  /// in layer::sequential with the block's global index: a copy the caller owns (movable, not
  /// copyable: the views point into it), each parameter's value a view into it, its grad empty.
  /// Collective over the data-parallel group under every ZeRO stage (zero<3> gathers the shards).
  using snapshot = strategy_snapshot;
  [[nodiscard]] snapshot parameter_values() {
    snapshot out;
    out.values_ = optimizer_->gather_parameters();
    out.parameters_ = params_;
    const auto& ts = optimizer_->buckets().tensors();
    for (std::size_t k = 0; k < out.parameters_.size(); ++k) {
      auto& q = out.parameters_[k];
      q.value = {out.values_.data() + ts[k].offset, params_[k].value.rows(),
                 params_[k].value.cols()};
      q.grad = {};
      q.value_home = q.grad_home = {};
    }
    return out;
  }

  /// Writes the whole model, unsplit, to `path` in the safetensors format under the model's
  /// stored names (weft/layer/weights.hpp: Hugging Face's for GPT-2 and Llama), as float32.
  /// Collective over every rank of the mesh: each writes its own slices (data-parallel rank 0;
  /// a tensor-replicated parameter from TP rank 0), into path + ".tmp", renamed to `path` once
  /// every rank has written. A rank's failure fails the call on every rank, naming it.
  void save_weights(const std::string& path) {
    weights().save(path, [&] { return parameter_values(); });
  }

  /// Reads the whole model from `path` (as save_weights writes it, or any safetensors file with
  /// the model's stored names and shapes in F32, F64, F16 or BF16; GPT-2's names may lack the
  /// "transformer." prefix), every rank only its own slices, at any mesh and ZeRO stage; then
  /// the layers, the optimizer's parameters and its fp32 master copy all hold the loaded values
  /// (the optimizer's moments are left as they are: they live in optim checkpoints). Collective.
  /// A file that cannot be read, a tensor missing or extra, a wrong shape or dtype is a weft::error
  /// naming the tensor, on every rank, before anything changes; so is a file whose recorded
  /// configuration ("weft.heads", "weft.rope_theta", ... in its metadata) differs from the model's.
  /// Tensors the model calls buffers (GPT-2's causal masks) are skipped.
  void load_weights(const std::string& path) {
    // which the layers compute in (zero<3>: from the next gather)
    optimizer_->set_parameters(weights().load(path));
  }

private:
  using clock = std::chrono::steady_clock;

  strategy_weights<Model, Comm> weights() { return {config_.model, params_, tp_, pp_, dp_, rank_}; }

  // Tied: the head's copy of the table starts as the table (the first stage's, sent to the last).
  void share_tied_weight() {
    const int p = pp_.size();
    const int r = pp_.rank();
    if (p == 1) {
      const auto e = embedding_->tied_weight();
      const auto h = head_->tied_weight();
      for (std::size_t i = 0; i < e.value.rows(); ++i)
        for (std::size_t j = 0; j < e.value.cols(); ++j)
          h.value(i, j) = e.value(i, j);
    } else if (r == 0 || r == p - 1) {
      auto w = (r == 0 ? embedding_->tied_weight() : head_->tied_weight()).value;
      std::vector<T> buf(w.size());
      copy_to_flat(w, std::span(buf));
      broadcast(*embedding_group_, std::span(buf), 0);
      copy_from_flat(std::span<const T>(buf), w);
    }
  }

  // A tied model after the pipeline: the embedding table's gradient and the head's copy's summed
  // (over the embedding group, or here when one rank holds both), then both made ready.
  void finish_tied() {
    if (!tied_) return;
    const int p = pp_.size();
    const int r = pp_.rank();
    if (p == 1) { // both copies here: each gets the sum
      auto e = embedding_->tied_weight().grad;
      auto h = head_->tied_weight().grad;
      for (std::size_t i = 0; i < e.rows(); ++i)
        for (std::size_t j = 0; j < e.cols(); ++j)
          e(i, j) = h(i, j) = e(i, j) + h(i, j);
    } else if (r == 0 || r == p - 1) {
      auto g = (r == 0 ? embedding_->tied_weight() : head_->tied_weight()).grad;
      all_reduce(*embedding_group_, g.flat());
    }
    if (embedding_) gradients_complete(units_[embedding_unit_]);
    if (head_) gradients_complete(units_[head_unit_]);
  }

  // --- the layers in the optimizer's buffers -------------------------------------------------
  // A unit (the embedding stage, the head stage, a block) is what zero<3> gathers before use and
  // frees after; its parameters' matrices are bound (matrix::bind) to their stretch of a bucket.

  // A matrix of a unit and where it starts in the optimizer's tensors (its first tensor).
  struct storage {
    layer::storage_home value, grad;
    std::size_t tensor = 0;
  };
  struct unit {
    std::string prefix;
    std::function<std::vector<layer::parameter<T>>()> parameters; // the layer's, with this prefix
    std::vector<storage> matrices;
    std::size_t first_tensor = 0, end_tensor = 0; // in the optimizer's set
    std::size_t first_bucket = 0, end_bucket = 0;
    int backwards = 0;     // this step's
    bool deferred = false; // tied: made ready after the pipeline (finish_tied)
    bool grads_bound = false;
  };

  // Unit u's parameters grouped by the matrix they live in (in the order of the matrices' first
  // parameter), each group in its offset order, after checking that they tile the matrix: the
  // order the optimizer holds them in, so that a matrix is one stretch of its bucket. Records
  // the matrices in u.
  std::vector<layer::parameter<T>> in_storage_order(unit& u) {
    std::vector<layer::parameter<T>> qs = u.parameters(), out;
    std::vector<char> taken(qs.size(), 0);
    const auto fail = [&](const std::string& name, const std::string& what) {
      throw error("strategy", rank_, error::unknown,
                  "parameter '" + name + "' " + what +
                      ": the strategy's layers compute in the optimizer's buffers, so every "
                      "parameter must name "
                      "the matrices its value and gradient live in (layer::parameter::value_home "
                      "and grad_home, "
                      "made by layer::home_of) and the parameters of a matrix must cover it");
    };
    for (std::size_t k = 0; k < qs.size(); ++k) {
      if (taken[k] != 0) continue;
      if (!qs[k].value_home || !qs[k].grad_home) fail(qs[k].name, "has no storage home");
      std::vector<std::size_t> group;
      for (std::size_t j = k; j < qs.size(); ++j) {
        if (taken[j] == 0 && qs[j].value_home.owner == qs[k].value_home.owner) group.push_back(j);
      }
      std::sort(group.begin(), group.end(), [&](std::size_t a, std::size_t b) {
        return qs[a].value_home.offset < qs[b].value_home.offset;
      });
      std::size_t at = 0;
      for (std::size_t j : group) {
        const auto& q = qs[j];
        if (q.value_home.offset != at || q.grad_home.offset != at ||
            q.grad_home.owner != qs[group[0]].grad_home.owner ||
            q.grad_home.elements != q.value_home.elements || !q.value.contiguous() ||
            q.grad.size() != q.value.size()) {
          fail(q.name, "does not continue its matrix where the one before it ends");
        }
        if (q.value.data() != static_cast<const T*>(q.value_home.base) + at ||
            q.grad.data() != static_cast<const T*>(q.grad_home.base) + at) {
          fail(q.name, "is not where its storage home says (layer::home_of(matrix, offset))");
        }
        at += q.value.size();
        taken[j] = 1;
      }
      if (at != qs[k].value_home.elements)
        fail(qs[k].name, "and its neighbours do not cover their matrix");
      u.matrices.push_back(
          {qs[group[0]].value_home, qs[group[0]].grad_home, params_.size() + out.size()});
      for (std::size_t j : group)
        out.push_back(std::move(qs[j]));
    }
    return out;
  }

  // Points unit u's parameter matrices at their stretch of its buckets (zero<0..2>: the
  // parameter buffer; zero<3>: the gathered buckets), or at nothing.
  void bind_values(unit& u, bool on) {
    const auto& ts = optimizer_->buckets().tensors();
    for (auto& m : u.matrices) {
      const auto& t = ts[m.tensor];
      m.value.bind(m.value.owner,
                   on ? optimizer_->bucket_parameters(t.bucket).data() + t.bucket_offset : nullptr);
    }
  }
  // The same for the gradients: zero<0>/<1> the gradient buffer; zero<2>/<3> each bucket's
  // gradients, from the unit's first backward of a step until its reduction.
  void bind_gradients(unit& u, bool on) {
    const auto& ts = optimizer_->buckets().tensors();
    for (auto& m : u.matrices) {
      const auto& t = ts[m.tensor];
      m.grad.bind(m.grad.owner,
                  on ? optimizer_->bucket_gradients(t.bucket).data() + t.bucket_offset : nullptr);
    }
    u.grads_bound = on;
  }

  void prefetch(const unit& u) {
    for (std::size_t b = u.first_bucket; b < u.end_bucket; ++b)
      optimizer_->prefetch(b);
  }

  // Before unit u runs (a forward; backward: also its backward): its parameters in place
  // (zero<3>: gathered, or waited for when prefetched; zero<1>/<2>: the all-gather after the
  // last step waited for), its gradients bound, and the next units in this rank's order
  // prefetched.
  void enter(std::size_t index, bool backward) {
    unit& u = units_[index];
    if (u.end_tensor == u.first_tensor) return;
    if constexpr (Sharding::stage == 3) {
      bind_values(u, true);
    } else {
      for (std::size_t b = u.first_bucket; b < u.end_bucket; ++b)
        (void)optimizer_->bucket_parameters(b);
    }
    if (backward && !u.grads_bound) bind_gradients(u, true);
    auto at =
        std::find(sequence_.begin() + static_cast<std::ptrdiff_t>(cursor_), sequence_.end(), index);
    if (at != sequence_.end()) {
      cursor_ = static_cast<std::size_t>(at - sequence_.begin()) + 1;
      for (std::size_t k = cursor_;
           k < sequence_.size() && k < cursor_ + static_cast<std::size_t>(prefetch_); ++k) {
        prefetch(units_[sequence_[k]]);
      }
    }
  }
  // After unit u ran: zero<3> frees its gathered parameters; after its last backward of the step
  // its gradients are complete (gradient_sync every: after each backward, its microbatch's).
  void leave(std::size_t index, bool backward) {
    unit& u = units_[index];
    if (u.end_tensor == u.first_tensor) return;
    if constexpr (Sharding::stage == 3) {
      bind_values(u, false);
      for (std::size_t b = u.first_bucket; b < u.end_bucket; ++b)
        optimizer_->release_bucket(b);
    }
    if (!backward) return;
    ++u.backwards;
    // A tied unit's are whole over the step, made ready after the pipeline (finish_tied).
    if (!u.deferred && (every_microbatch() || u.backwards == microbatches_)) gradients_complete(u);
  }
  // Unit u's gradients are final (gradient_sync every, but for a tied unit: its microbatch's
  // are): the sequence-parallel partial sums reduced over TP, then each tensor marked ready (a
  // bucket's reduction starts once all its tensors are), or under every each of its buckets (the
  // unit's own) reduce-scattered into the shard; zero<2>/<3> unbind the buckets, freed once
  // reduced (the next backward binds fresh ones).
  void gradients_complete(unit& u) {
    if (u.end_tensor == u.first_tensor) return;
    if constexpr (SP::enabled) {
      auto qs = u.parameters();
      layer::reduce_sequence_parallel_grads(tp_, std::span(qs));
    }
    if (every_microbatch() && !u.deferred) {
      for (std::size_t b = u.first_bucket; b < u.end_bucket; ++b)
        optimizer_->reduce_bucket(b);
    } else {
      for (std::size_t t = u.first_tensor; t < u.end_tensor; ++t)
        optimizer_->grad_ready(t);
    }
    if constexpr (Sharding::stage >= 2) bind_gradients(u, false);
  }
  // config.gradient_sync every (refused at construction below zero<2>).
  [[nodiscard]] bool every_microbatch() const noexcept {
    return config_.gradient_sync == optim::gradient_sync::every;
  }

  // Adds a span to the timeline when it goes out of scope.
  struct timed {
    strategy_trainer& t;
    std::string name;
    clock::time_point begin = clock::now();
    timed(strategy_trainer& tr, const char* what, int i, int chunk)
        : t(tr),
          name(what + std::to_string(i) +
               (chunk >= 0 ? "." + std::to_string(chunk) : std::string())) {}
    timed(const timed&) = delete;
    timed& operator=(const timed&) = delete;
    ~timed() { t.timeline_.push_back({std::move(name), begin, clock::now()}); }
  };

  // The executor's stage functions (pipeline/executor.hpp) over this rank's chunks.
  struct stage {
    strategy_trainer& t;

    std::vector<T> input(int) { return {}; } // the first stage reads the token ids itself

    std::vector<T> forward(int i, int chunk, std::span<const T> in) {
      const timed scope(t, "F", i, chunk);
      const auto v = static_cast<std::size_t>(chunk * t.pp_.size() + t.pp_.rank());
      const std::size_t hidden = t.config_.model.hidden;
      auto& saved = t.saved_[{i, chunk}];
      matrix<T> x(t.rows_, hidden), y(t.rows_, hidden);
      if (v == 0) {
        t.enter(t.embedding_unit_, false);
        t.embedding_->forward(t.microbatch(t.ids_, i), x.view());
        saved.embedding = t.embedding_->stash();
        t.leave(t.embedding_unit_, false);
        saved.bytes += layer::detail::bytes_of(saved.embedding);
      } else {
        std::copy(in.begin(), in.end(), x.flat().begin());
      }
      auto& blocks = t.chunks_[static_cast<std::size_t>(chunk)];
      for (std::size_t k = 0; k < blocks.size(); ++k) {
        const std::size_t u = t.chunk_units_[static_cast<std::size_t>(chunk)][k];
        t.enter(u, false);
        blocks[k]->forward(layer::detail::cview(x.view()), y.view());
        saved.blocks.push_back(blocks[k]->stash());
        t.leave(u, false);
        saved.bytes += layer::detail::bytes_of(saved.blocks.back());
        std::swap(x, y);
      }
      t.tally_->take(
          static_cast<std::int64_t>(saved.bytes)); // from the workspace into the activations
      t.activations_.current += saved.bytes;
      t.activations_.peak = std::max(t.activations_.peak, t.activations_.current);
      return {x.flat().begin(), x.flat().end()};
    }

    pipeline::loss_result<T> loss(int i, std::span<const T> out) {
      const timed scope(t, "loss", i, -1);
      const std::size_t hidden = t.config_.model.hidden;
      const matrix_view<const T> y(out.data(), t.rows_, hidden);
      t.enter(t.head_unit_, true);
      pipeline::loss_result<T> r{t.head_->forward(y, t.microbatch(t.targets_, i), t.divisor_),
                                 std::vector<T>(t.rows_ * hidden)};
      t.head_->backward(matrix_view<T>(r.gradient.data(), t.rows_, hidden));
      t.leave(t.head_unit_, true);
      return r;
    }

    std::vector<T> backward(int i, int chunk, std::span<const T> gout) {
      const timed scope(t, "B", i, chunk);
      const auto v = static_cast<std::size_t>(chunk * t.pp_.size() + t.pp_.rank());
      const std::size_t hidden = t.config_.model.hidden;
      auto node = t.saved_.extract({i, chunk});
      auto& saved = node.mapped();
      matrix<T> dy(t.rows_, hidden), dx(t.rows_, hidden);
      std::copy(gout.begin(), gout.end(), dy.flat().begin());
      t.activations_.current -= saved.bytes;
      t.tally_->give(static_cast<std::int64_t>(saved.bytes));
      auto& blocks = t.chunks_[static_cast<std::size_t>(chunk)];
      for (std::size_t k = blocks.size(); k-- > 0;) {
        const std::size_t u = t.chunk_units_[static_cast<std::size_t>(chunk)][k];
        t.enter(u, true);
        blocks[k]->restore(std::move(saved.blocks[k]));
        blocks[k]->backward(layer::detail::cview(dy.view()), dx.view());
        t.leave(u, true);
        std::swap(dx, dy);
      }
      if (v == 0) {
        t.enter(t.embedding_unit_, true);
        t.embedding_->restore(std::move(saved.embedding));
        t.embedding_->backward(layer::detail::cview(dy.view()));
        t.leave(t.embedding_unit_, true);
        return {};
      }
      return {dy.flat().begin(), dy.flat().end()};
    }
  };

  [[nodiscard]] std::span<const std::int32_t> microbatch(std::span<const std::int32_t> all,
                                                         int i) const {
    return all.subspan(static_cast<std::size_t>(i) * tokens_, tokens_);
  }

  struct saved_activations {
    typename embedding_type::activations embedding;
    std::vector<typename block_type::activations> blocks;
    std::size_t bytes = 0; // what the account counts (the stashes' bytes(), where they say)
  };

  // The host matrices the layers allocate (memory_account::workspace); shared with them.
  std::shared_ptr<weft::detail::byte_tally> tally_ = std::make_shared<weft::detail::byte_tally>();
  config config_;
  axis_comms<Comm> comms_;
  Comm& tp_;
  Comm& pp_;
  Comm& dp_;
  int rank_ = 0;
  int microbatches_ = 0;
  std::size_t tokens_ = 0; // per microbatch
  std::size_t rows_ = 0;   // per microbatch on this rank (tokens / tp under sequence parallelism)
  std::vector<int> layout_;
  std::vector<int> first_layer_;
  std::vector<std::vector<std::unique_ptr<block_type>>> chunks_;
  std::unique_ptr<embedding_type> embedding_;
  std::unique_ptr<head_type> head_;
  bool tied_ = false;
  std::optional<Comm> embedding_group_;
  double divisor_ = 1; // the global batch's counted targets
  std::vector<layer::parameter<T>>
      params_; // the optimizer's tensors in its order: names and shapes (no data)
  using optimizer_type = optim::data_parallel<Sharding, Rule, float, Comm>;
  std::unique_ptr<optimizer_type> optimizer_;
  std::vector<unit> units_;
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::size_t embedding_unit_ = none, head_unit_ = none;
  std::vector<std::vector<std::size_t>> chunk_units_; // per chunk, per block: its unit
  std::vector<std::size_t> sequence_; // this rank's units in the order a step uses them
  std::size_t cursor_ = 0;            // where in sequence_ the step is
  std::string broken_;                // the error of a train_step that failed part-way
  int prefetch_ = 1;
  memory_account::amount activations_;
  std::optional<pipeline::executor<Schedule, Comm, T>> executor_;
  std::map<std::pair<int, int>, saved_activations> saved_;
  std::span<const std::int32_t> ids_, targets_;
  double pipeline_seconds_ = 0, optimizer_seconds_ = 0;
  std::vector<span> timeline_;
};

} // namespace weft::detail
