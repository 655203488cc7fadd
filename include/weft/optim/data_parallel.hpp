#pragma once
// data_parallel: one optimizer over the data-parallel group, with the sharding chosen by a
// policy type (zero<0..3>, hybrid<zero<k>, zero<0>>) and the update by a rule (sgd, adam,
// adamw); P is the parameter and gradient type (float, or half/bfloat16 with fp32 master
// weights and, for half, dynamic loss scaling).
//
//   weft::optim::param_set ps;  ps.add("fc1.w", {64, 32});  ...
//   auto opt = weft::optim::make_data_parallel<weft::optim::zero<2>>(
//       dp_comm, ps, weft::optim::adamw{.lr = 1e-3f});
//   opt->set_parameters(initial);                // the full model, the same on every rank
//   auto w = opt->param("fc1.w");                 // zero<3>: gathers fc1.w's bucket, prefetches
//                                                 // the next
//   auto g = opt->grad("fc1.w");  ... g[i] = ...;
//   opt->grad_ready("fc1.w");                    // a complete bucket's reduction starts now,
//                                                // on the progress thread
//   opt->step(1.0f / global_batch);              // waits, clips, updates, queues the all-gathers
//
// A step of several micro-batches accumulates into the gradients as they are; zero<2>/<3> may
// instead reduce a bucket after each micro-batch (reduce_bucket: each reduce-scatter added into
// the shard, the full-size bucket freed), keeping only the shard between micro-batches.
//
// Collectives run on a progress thread (options::overlap) over private splits of the
// communicator: the shard group S (size N: the ranks a bucket is sharded over) and the
// replica group R (ranks holding the same shard). zero<0>: N = 1, R = all; zero<k>: N = all,
// R = 1; hybrid: N = a node (or options::inner_size), R = the nodes.
//
// Gradients are summed over the group; step(multiplier) multiplies the sum by
// multiplier / loss_scale and, with max_grad_norm, by min(1, max / (norm + 1e-6)). The global
// norm is computed from the raw summed shards (squared partials in double, all-reduced once
// over S, or over the group set_norm_group names to span tensor and pipeline parallelism; so
// replicas count once) and multiplied by |multiplier| / loss_scale after the square root: with
// integer-valued gradients it does not depend on the reduction order. A non-finite norm (an
// overflow on any rank) skips the step on every rank.
//
// Memory: the communicator decides (detail::dp_memory, optim/detail/memory.hpp). Over a host
// transport the buffers are host vectors and the collectives run on the progress thread; over
// a device communicator (include <weft/cuda/data_parallel.cuh>) they are device memory, the
// updates and norms are kernels, and the collectives are queued on a side stream: the same
// code, each buffer operation labelled with the lane (the caller's order, or the queued
// collectives') it runs in (tests/optim/lanes_test.cpp checks the labels on the host).
//
// Weight decay: tensors added with decay = false (biases, norm weights) are updated with the
// rule's weight_decay at 0. The runs of equal decay in this rank's shard of each bucket
// (layout::decay_runs) are computed once, here, and every update, host or device, walks them
// (decay_groups, optim/optimizers.hpp); a shard of one run, as every shard is when every
// tensor decays, is the rule's plain loop.
#include <weft/comm/all_gather.hpp>
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/async.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/comm/reduce_scatter.hpp>
#include <weft/core/error.hpp>
#include <weft/core/types.hpp>
#include <weft/optim/detail/memory.hpp>
#include <weft/optim/loss_scale.hpp>
#include <weft/optim/optimizers.hpp>
#include <weft/optim/param_set.hpp>
#include <weft/optim/sharding.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace weft::optim {

/// Per-rank bytes of what data_parallel allocated, by kind.
struct memory_report {
  std::size_t parameters = 0; // the parameter buffer (full, or the shard under zero<3>)
  std::size_t gradients = 0;  // the persistent gradient buffer (full, or the shard from zero<2>)
  std::size_t optimizer_state =
      0; // the rule's state (Adam: two fp32 words per element of the shard)
  std::size_t master_weights = 0;   // fp32 copies of half/bfloat16 parameters (the shard)
  std::size_t padding_elements = 0; // elements added to make every bucket divide by the shard group
  std::size_t transient_peak =
      0; // most bytes of short-lived buffers at once (the three below together)
  std::size_t slot_gap =
      0; // bytes between the state's slots (optim::slot_stride), not counted above
  /// Short-lived buffers by kind: now, and the most at once since the last reset_peaks().
  struct amount {
    std::size_t current = 0;
    std::size_t peak = 0;
  };
  amount gathered_weights; // zero<3>: full buckets of parameters gathered for use or prefetched
  amount gradient_buckets; // zero<2>/<3>: full buckets of gradients written until reduced
  amount scratch;          // the collectives' staging (a shard being reduced or gathered)
  [[nodiscard]] std::size_t total() const noexcept {
    return parameters + gradients + optimizer_state + master_weights + slot_gap;
  }
};

struct step_result {
  bool skipped = false;    // the gradients overflowed: nothing was updated
  double grad_norm = 0.0;  // the global norm of multiplier x gradient / loss scale (when computed)
  float loss_scale = 1.0f; // the scale used for this step's gradients
};

struct data_parallel_options {
  std::size_t bucket_elements = 0; // 0: default_bucket_elements(data-parallel size)
  bool overlap = true;             // collectives on a progress thread; false: on the caller's
  float max_grad_norm = 0.0f;      // > 0: clip by the global norm
  int inner_size = 0;              // hybrid: ranks per shard group (0: the ranks of a node)
  int update_threads =
      0; // host threads for the update (0: all cores, for shards of 128K elements or more)
  std::optional<bool> loss_scaling = std::nullopt; // default: on for half parameters
  loss_scale_options scaling = {};
};

template <sharding_policy Policy, update_rule Rule, class P, communicator Comm>
class data_parallel {
  static_assert(
      std::is_same_v<P, float> || std::is_same_v<P, half> || std::is_same_v<P, bfloat16>,
      "weft::optim::data_parallel<Policy, Rule, P>: P (parameters and gradients) must be float, "
      "weft::half or weft::bfloat16");

  using space = detail::dp_memory<Comm>;
  template <class T>
  using buffer = typename space::template buffer<T>;
  using work_t = typename space::work;
  using lane = detail::lane;

public:
  static constexpr int stage = Policy::stage;
  static constexpr bool mixed = !std::is_same_v<P, float>;
  /// Whether the buffers are device memory (a CUDA communicator; <weft/cuda/data_parallel.cuh>).
  static constexpr bool on_device = space::on_device;
  using options = data_parallel_options;

  data_parallel(Comm& dp, const param_set& ps, Rule rule, options o = {})
      : rule_(checked(rule)),
        opt_(checked(o)),
        dp_rank_(dp.rank()),
        dp_size_(dp.size()),
        mem_(dp),
        shard_(mem_.split(dp, shard_color(dp, o), dp.rank())),
        replica_(mem_.split(dp, replica_color(dp, o), dp.rank())),
        layout_(ps, o.bucket_elements != 0 ? o.bucket_elements : default_bucket_elements(dp.size()),
                shard_.size()),
        scaler_(o.scaling),
        queue_(mem_.make_queue(o.overlap)) {
    update_threads_ = o.update_threads > 0
                          ? o.update_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    scaling_ = o.loss_scaling.value_or(std::is_same_v<P, half>);
    if (!scaling_) scaler_ = loss_scaler(loss_scale_options{.initial = 1.0f});
    const auto padded = layout_.padded_elements();
    const auto shard = layout_.shard_elements();
    mem_.zeros(params_, stage == 3 ? shard : padded, lane::main);
    mem_.zeros(grads_, stage >= 2 ? shard : padded, lane::main);
    if constexpr (mixed) mem_.zeros(master_, shard, lane::main);
    mem_.zeros(state_,
               rule_.slots() > 0 ? slot_stride(shard) * static_cast<std::size_t>(rule_.slots()) : 0,
               lane::main);
    mem_.zeros(norm_partial_, 1, lane::main);
    const auto nb = layout_.buckets().size();
    ready_.assign(nb, 0);
    marked_.assign(layout_.tensors().size(), 0);
    submitted_.assign(nb, false);
    rounds_.assign(nb, 0);
    last_round_ = nb;
    unlaunched_ = nb;
    reductions_.assign(nb, work_t{});
    staging_.resize(nb);
    gathered_.resize(nb);
    gathers_.assign(nb, work_t{});
    gather_started_.assign(nb, false);
    resident_.assign(nb, false);
    squares_ = mem_.prepare_squares(norm_ranges());
    decay_run_first_.push_back(0);
    for (std::size_t b = 0; b < nb; ++b) {
      const auto runs = layout_.decay_runs(b, shard_.rank());
      decay_runs_.insert(decay_runs_.end(), runs.begin(), runs.end());
      decay_run_first_.push_back(decay_runs_.size());
    }
  }
  data_parallel(const data_parallel&) = delete; // queued jobs point into this object
  data_parallel& operator=(const data_parallel&) = delete;
  ~data_parallel() {
    try {
      wait_all();
      mem_.synchronize();
    } catch (...) { // NOLINT(bugprone-empty-catch): already reported by the call that waited, or
                    // the rank is failing
    }
  }

  [[nodiscard]] const layout& buckets() const noexcept { return layout_; }
  [[nodiscard]] int shard_rank() const noexcept { return shard_rank_cached(); }
  [[nodiscard]] int shard_size() const noexcept { return layout_.shards(); }
  [[nodiscard]] int replica_size() const noexcept { return dp_size_ / layout_.shards(); }
  /// This rank's index among the ranks holding the same shard (0: the one that saves it).
  [[nodiscard]] int replica_rank() const noexcept { return replica_.rank(); }
  [[nodiscard]] int dp_rank() const noexcept { return dp_rank_; }
  [[nodiscard]] int dp_size() const noexcept { return dp_size_; }
  [[nodiscard]] long steps() const noexcept { return step_; }
  [[nodiscard]] float loss_scale() const noexcept { return scaler_.scale(); }
  /// Whether this optimizer scales the loss (options::loss_scaling; by default for half).
  [[nodiscard]] bool loss_scaling() const noexcept { return scaling_; }
  [[nodiscard]] const Rule& rule() const noexcept { return rule_; }

  /// Sets every parameter from the full model (unpadded, param_set order; the same on every rank).
  void set_parameters(std::span<const float> full) {
    check_full(full.size(), "set_parameters");
    wait_all();
    drop_host_copy();
    std::vector<float> padded(layout_.padded_elements(), 0.0f);
    layout_.for_each_tensor([&](std::size_t u, std::size_t p, std::size_t n) {
      std::copy_n(full.begin() + static_cast<std::ptrdiff_t>(u), n,
                  padded.begin() + static_cast<std::ptrdiff_t>(p));
    });
    // Built on the host, then copied into params_ and master_ (the same on a device).
    std::vector<P> params(params_.size(), P(0.0f));
    std::vector<float> master(master_.size(), 0.0f);
    if constexpr (stage < 3) {
      for (std::size_t i = 0; i < padded.size(); ++i)
        params[i] = static_cast<P>(padded[i]);
    }
    for_each_shard([&](const bucket_info& b, std::size_t from) {
      for (std::size_t i = 0; i < b.shard; ++i) {
        if constexpr (stage == 3) params[b.shard_offset + i] = static_cast<P>(padded[from + i]);
        if constexpr (mixed) master[b.shard_offset + i] = padded[from + i];
      }
    });
    mem_.upload(params_.data(), params.data(), params.size());
    if constexpr (mixed) mem_.upload(master_.data(), master.data(), master.size());
    drop_gathers();
  }

  /// The full model as float (unpadded). Collective under zero<3>.
  [[nodiscard]] std::vector<float> gather_parameters() {
    wait_all();
    std::vector<P> src(layout_.padded_elements(), P(0.0f));
    if constexpr (stage == 3) {
      buffer<P> padded;
      mem_.zeros(padded, layout_.padded_elements(), lane::main);
      queue_
          ->submit([&] {
            const auto& bs = layout_.buckets();
            for (const auto& b : bs) {
              gather_into(std::span<const P>(params_.data() + b.shard_offset, b.shard),
                          std::span<P>(padded.data() + b.offset, b.padded));
            }
          })
          .wait();
      mem_.download(src.data(), padded.data(), src.size());
      mem_.release(padded, lane::main);
    } else {
      mem_.download(src.data(), params_.data(), src.size());
    }
    std::vector<float> full(layout_.elements());
    layout_.for_each_tensor([&](std::size_t u, std::size_t p, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i)
        full[u + i] = static_cast<float>(src[p + i]);
    });
    return full;
  }

  /// Tensor `name`'s parameters. Under zero<3> this gathers its bucket (waiting for a
  /// prefetch already started) and starts gathering the next one in the pass's direction
  /// (forward: the next bucket; after the first grad() of the step: the previous one).
  /// Under zero<1>/<2> step() refreshes the parameters by an all-gather that may still run
  /// when it returns (on a device, on the side stream): call param() again each step rather
  /// than keeping the span, whose address does not change, since the call is what orders
  /// later reads after that all-gather.
  [[nodiscard]] std::span<const P> param(std::string_view name) {
    const auto& ti = layout_.tensors()[layout_index(name)];
    const std::span<const P> bucket = bucket_parameters(ti.bucket);
    if constexpr (stage == 3) {
      const auto nb = layout_.buckets().size();
      if (!backward_ && ti.bucket + 1 < nb) start_gather(ti.bucket + 1);
      if (backward_ && ti.bucket > 0) start_gather(ti.bucket - 1);
    }
    return bucket.subspan(ti.bucket_offset, ti.count);
  }

  /// zero<3>: frees the gathered parameters of `name`'s bucket (no-op otherwise).
  void release(std::string_view name) {
    release_bucket(layout_.tensors()[layout_index(name)].bucket);
  }

  /// Tensor `name`'s gradient, zero at the start of a step (and after reduce_bucket reduced its
  /// bucket); write (or add) it, then call grad_ready.
  [[nodiscard]] std::span<P> grad(std::string_view name) {
    const auto& ti = layout_.tensors()[layout_index(name)];
    backward_ = true;
    if (submitted_[ti.bucket]) {
      throw error("data_parallel::grad: the bucket of tensor '" + ti.name +
                  "' is already being reduced this step");
    }
    return bucket_gradients(ti.bucket).subspan(ti.bucket_offset, ti.count);
  }

  /// Marks `name`'s gradient complete; the bucket's reduction starts once all its tensors are
  /// and every later bucket's has started. Buckets reduce in one order on every rank, the last
  /// first (the order a backward completes them when tensors are added in the forward's order,
  /// as PyTorch DDP orders its buckets), so ranks that mark tensors in different orders, or
  /// leave a tensor unmarked until step(), still reduce the same buckets together.
  void grad_ready(std::string_view name) { grad_ready(layout_index(name)); }
  /// grad_ready of tensor t (its index in the param_set).
  void grad_ready(std::size_t t) {
    if (t >= layout_.tensors().size()) {
      throw error("data_parallel::grad_ready", dp_rank_, error::unknown,
                  "no tensor " + std::to_string(t) + " (the set has " +
                      std::to_string(layout_.tensors().size()) + ")");
    }
    const auto& ti = layout_.tensors()[t];
    if (marked_[t] != 0) {
      throw error("data_parallel::grad_ready: tensor '" + ti.name +
                  "' marked ready twice in one step");
    }
    if (submitted_[ti.bucket]) {
      throw error("data_parallel::grad_ready: tensor '" + ti.name +
                  "' marked ready after its bucket's reduction started (reduce_gradients() or "
                  "step() was called)");
    }
    marked_[t] = 1;
    ++ready_[ti.bucket];
    launch_in_order(false);
  }

  /// Starts the reductions of every bucket not yet started (last bucket first, as grad_ready):
  /// what step() does first; call it to reduce after the backward instead of during it. A bucket
  /// reduce_bucket has reduced this step is not reduced again (hybrid: its shard is all-reduced
  /// across the replicas now, once).
  void reduce_gradients() { launch_in_order(true, "reduce_gradients"); }

  /// zero<2>/<3>, for a step of several micro-batches: starts reducing what was written into
  /// bucket b since its last reduction (its reduce-scatter over the shard group is added into
  /// this rank's gradient shard, in P; the full-size bucket is freed once reduced) and opens b
  /// for the next micro-batch, whose bucket_gradients(b) is a fresh one of zeros. Marks of its
  /// tensors since then are cleared. At most one such reduction runs behind the caller: the one
  /// before is waited for first, so the caller holds its own bucket and at most one being
  /// reduced. Hybrid sharding all-reduces the shard across the replicas once, at step().
  /// Once reduce_bucket has reduced b in a step, step() reduces b only through it: call it after
  /// the last micro-batch too. Every rank calls it for the same buckets in the same order, and
  /// the buckets grad_ready completes in the same place among those calls: grad_ready's pairing
  /// of buckets completed in different orders does not reach across reduce_bucket.
  void reduce_bucket(std::size_t b) {
    if constexpr (stage < 2) {
      throw error("data_parallel::reduce_bucket", dp_rank_, error::unknown,
                  "zero<" + std::to_string(stage) +
                      "> keeps whole gradients and reduces them once a step (grad_ready, "
                      "step()); reducing every micro-batch is zero<2>/<3>'s");
    } else {
      check_bucket(b, "reduce_bucket");
      if (closed_) {
        throw error("data_parallel::reduce_bucket", dp_rank_, error::unknown,
                    "bucket " + std::to_string(b) +
                        ": reduce_gradients() already started this step's last reductions");
      }
      if (submitted_[b]) {
        throw error("data_parallel::reduce_bucket", dp_rank_, error::unknown,
                    "bucket " + std::to_string(b) +
                        " is already being reduced as the step's last (grad_ready completed it, "
                        "or reduce_gradients() or step() was called)");
      }
      if (last_round_ < reductions_.size())
        reductions_[last_round_].wait(); // one reduction in flight behind the caller, no more
      reductions_[b].wait();
      submit_reduction(b, true);
      last_round_ = b;
      ++rounds_[b];
      submitted_[b] = false;
      ready_[b] = 0;
      const bucket_info& bi = layout_.buckets()[b];
      std::fill(marked_.begin() + static_cast<std::ptrdiff_t>(bi.first_tensor),
                marked_.begin() + static_cast<std::ptrdiff_t>(bi.end_tensor), 0);
      launch_in_order(false); // the buckets grad_ready completed below it may start now
    }
  }

  /// Reduces what is left, then updates: see the header comment for `multiplier`.
  step_result step(float multiplier = 1.0f) {
    drop_host_copy();
    launch_in_order(true, "step");
    wait_all(); // the reductions, and any zero<3> gather still reading the parameters
    step_result r;
    r.loss_scale = scaler_.scale();
    const bool clip = opt_.max_grad_norm > 0.0f;
    float mul = multiplier;
    if (scaling_) mul = mul / scaler_.scale();
    if (clip || scaling_) {
      const std::span<double> partial(norm_partial_.data(), 1);
      mem_.sum_squares(squares_, partial.data());
      if (norm_) {
        queue_->submit([&] { mem_.run(*norm_, [&](Comm& c) { all_reduce(c, partial); }); }).wait();
      } else if (shard_.size() > 1) {
        queue_->submit([&] { mem_.run(shard_, [&](Comm& c) { all_reduce(c, partial); }); }).wait();
      }
      double sq = 0.0;
      mem_.download(&sq, partial.data(), 1);
      r.grad_norm = std::sqrt(sq) * std::fabs(static_cast<double>(mul));
      const bool overflow = !std::isfinite(r.grad_norm);
      if (scaling_) scaler_.update(overflow);
      if (overflow) {
        r.skipped = true;
        finish_step();
        return r;
      }
      if (clip) {
        const auto coef =
            static_cast<float>(static_cast<double>(opt_.max_grad_norm) / (r.grad_norm + 1e-6));
        if (coef < 1.0f) mul = mul * coef;
      }
    }
    ++step_;
    const auto k = rule_.at(step_, mul);
    using kernel = std::remove_const_t<
        decltype(k)>; // apply picks its SSE Adam loop by this type, which const hides
    const kernel exempt = without_weight_decay(k);
    const auto& bs = layout_.buckets();
    for (std::size_t bi = 0; bi < bs.size(); ++bi) {
      const bucket_info& b = bs[bi];
      float* master = nullptr;
      P* out = stage == 3 ? params_.data() + b.shard_offset : params_.data() + shard_begin(b);
      if constexpr (mixed) {
        master = master_.data() + b.shard_offset;
      } else {
        master = out;
      }
      float* const state =
          slots() == 0 ? nullptr : state_.data() + b.shard_offset; // plain SGD keeps none
      const std::size_t stride = slot_stride(layout_.shard_elements());
      const decay_run* runs = decay_runs_.data() + decay_run_first_[bi];
      const std::size_t nruns = decay_run_first_[bi + 1] - decay_run_first_[bi];
      // one decay over the whole shard (every shard, when every tensor decays): one plain loop
      if (nruns == 1) {
        const update_ref<kernel, P, P> u{
            runs[0].decay ? k : exempt, master, grad_shard(b), state, out, stride};
        mem_.update(u, b.shard, update_threads_);
      } else if (nruns > 1) {
        const decay_groups<kernel> groups{k, exempt, runs, nruns};
        const update_ref<decay_groups<kernel>, P, P> u{groups, master, grad_shard(b),
                                                       state,  out,    stride};
        mem_.update(u, b.shard, update_threads_);
      }
    }
    finish_step();
    // One all-gather per bucket, queued now and waited for by param(): the next forward starts
    // on the first bucket while the others are still being gathered.
    if constexpr (stage == 1 || stage == 2) queue_gathers();
    return r;
  }

  /// Makes the global gradient norm (clipping, overflow detection) span model-parallel ranks
  /// too: the squared partials are all-reduced once over `group` instead of the shard group.
  /// `group` must hold the shard group of every model-parallel rank, and no two replicas of a
  /// shard: with tensor and pipeline parallelism, the ranks with this rank's replica index
  /// (zero<k>: the whole world; in general the ranks with this rank's replica_rank()). Tensors
  /// added as replicated count only where model_parallel_rank == 0, and tensors marked as tied
  /// copies (param_set::mark_tied_copy) nowhere. Collective over group.
  void set_norm_group(Comm& group, int model_parallel_rank) {
    wait_all();
    if (model_parallel_rank < 0)
      throw error("data_parallel::set_norm_group: model_parallel_rank must be >= 0");
    norm_.emplace(group.split(0, group.rank()));
    mp_rank_ = model_parallel_rank;
    squares_ = mem_.prepare_squares(norm_ranges());
  }

  /// Per-rank bytes allocated, by kind (compare with the ZeRO paper's formulas).
  [[nodiscard]] memory_report memory() const {
    memory_report m;
    m.parameters = params_.size() * sizeof(P);
    m.gradients = grads_.size() * sizeof(P);
    m.optimizer_state = layout_.shard_elements() * slots() * sizeof(float);
    m.slot_gap = state_.size() * sizeof(float) - m.optimizer_state;
    m.master_weights = master_.size() * sizeof(float);
    m.padding_elements = layout_.padding();
    m.transient_peak = transient_peak_.load();
    const auto of = [&](transient_kind k) {
      const auto i = static_cast<std::size_t>(k);
      return memory_report::amount{held_[i].load(), held_peak_[i].load()};
    };
    m.gathered_weights = of(transient_kind::gathered_weights);
    m.gradient_buckets = of(transient_kind::gradient_buckets);
    m.scratch = of(transient_kind::scratch);
    return m;
  }
  /// Starts measuring the short-lived buffers' peaks afresh (from what is held now; a collective
  /// still running may add to them, and is not waited for).
  void reset_peaks() {
    transient_peak_.store(transient_.load());
    for (std::size_t i = 0; i < held_.size(); ++i)
      held_peak_[i].store(held_[i].load());
  }

  // --- whole buckets, for a trainer whose layers use the optimizer's buffers in place -----------
  // The layers' parameter and gradient matrices are views into these spans (layer/matrix.hpp
  // matrix::bind), at each tensor's bucket_offset, so nothing is copied between them.
  /// Bucket b's parameters, full (padded): zero<0..2> the parameter buffer, after the bucket's
  /// all-gather from the last step (valid until the next step); zero<3> gathered now, or by the
  /// prefetch() already started, and valid until release_bucket(b). No prefetch of its own.
  [[nodiscard]] std::span<P> bucket_parameters(std::size_t b) {
    check_bucket(b, "bucket_parameters");
    const bucket_info& bi = layout_.buckets()[b];
    if constexpr (stage < 3) {
      gathers_[b].wait();
      return {params_.data() + bi.offset, bi.padded};
    } else {
      acquire(b);
      return {gathered_[b].data(), bi.padded};
    }
  }
  /// zero<3>: starts gathering bucket b on the progress thread (a no-op if it is gathered or
  /// being gathered, and under zero<0..2>).
  void prefetch(std::size_t b) {
    check_bucket(b, "prefetch");
    if constexpr (stage == 3) start_gather(b);
  }
  /// zero<3>: frees bucket b's gathered parameters (a no-op under zero<0..2>).
  void release_bucket(std::size_t b) {
    check_bucket(b, "release_bucket");
    if constexpr (stage == 3) free_gathered(b);
  }
  /// Bucket b's gradients, full (padded), zero at the start of a step: zero<0>/<1> the gradient
  /// buffer; zero<2>/<3> a bucket allocated at the first call of the step (or after
  /// reduce_bucket(b)) and freed once reduced.
  /// Accumulate into it, then call bucket_ready(b).
  [[nodiscard]] std::span<P> bucket_gradients(std::size_t b) {
    check_bucket(b, "bucket_gradients");
    const bucket_info& bi = layout_.buckets()[b];
    if (submitted_[b])
      throw error("data_parallel::bucket_gradients: bucket " + std::to_string(b) +
                  " is already being reduced this step");
    if constexpr (stage >= 2) {
      auto& s = staging_[b];
      if (s.empty()) alloc_transient(s, bi.padded, lane::main, transient_kind::gradient_buckets);
      return {s.data(), bi.padded};
    } else {
      return {grads_.data() + bi.offset, bi.padded};
    }
  }
  /// Marks every tensor of bucket b ready (grad_ready for each that is not yet).
  void bucket_ready(std::size_t b) {
    check_bucket(b, "bucket_ready");
    const bucket_info& bi = layout_.buckets()[b];
    for (std::size_t t = bi.first_tensor; t < bi.end_tensor; ++t) {
      if (marked_[t] == 0) grad_ready(t);
    }
  }

  // --- access for checkpoints: this rank's shard, in host memory ------------------------------
  // On a device, shard_weights and shard_state are a host copy of the shard, taken at the first
  // call after the last change (step, set_parameters, a load); refresh_parameters_from_shards
  // copies what was written there back to the device.
  /// Waits for every queued collective (what save and load do first); on a device, until the
  /// streams have done all the work queued so far.
  void synchronize() {
    wait_all();
    mem_.synchronize();
  }
  /// The fp32 weights of this rank's shard (master weights, or the float parameters), by bucket.
  [[nodiscard]] std::span<float> shard_weights(const bucket_info& b) {
    if constexpr (on_device) {
      take_host_copy();
      return {host_weights_.data() + b.shard_offset, b.shard};
    } else if constexpr (mixed) {
      return {master_.data() + b.shard_offset, b.shard};
    } else {
      return {params_.data() + (stage == 3 ? b.shard_offset : shard_begin(b)), b.shard};
    }
  }
  /// Slot j of the rule's state for bucket b's shard.
  [[nodiscard]] std::span<float> shard_state(const bucket_info& b, std::size_t j) {
    float* state = state_.data();
    if constexpr (on_device) {
      take_host_copy();
      state = host_state_.data();
    }
    return {state + j * slot_stride(layout_.shard_elements()) + b.shard_offset, b.shard};
  }
  [[nodiscard]] std::size_t slots() const noexcept {
    return static_cast<std::size_t>(rule_.slots());
  }
  /// Restores the counters a checkpoint holds, then the parameters from the shards' weights.
  /// The loss scale only where this optimizer scales the loss: a checkpoint of an fp16 run read
  /// by a float or bf16 one keeps 1, and one without scaling read by an fp16 run keeps its
  /// configured initial scale (the checkpoint's 1 would underflow the gradients).
  void restore_counters(long steps, float scale, int good_steps, bool saved_with_scaling) {
    step_ = steps;
    if (scaling_ && saved_with_scaling) scaler_.restore(scale, good_steps);
  }
  [[nodiscard]] int good_steps() const noexcept { return scaler_.good_steps(); }
  /// After writing shard_weights(): rebuilds the parameters (all-gathered under zero<1>/<2>).
  void refresh_parameters_from_shards() {
    wait_all();
    if constexpr (on_device) {
      take_host_copy(); // (what was written there, if anything)
      if constexpr (mixed) mem_.upload(master_.data(), host_weights_.data(), host_weights_.size());
      mem_.upload(state_.data(), host_state_.data(), host_state_.size());
    }
    for_each_shard([&](const bucket_info& b, std::size_t from) {
      const auto w = shard_weights(b);
      std::vector<P> p(b.shard);
      for (std::size_t i = 0; i < b.shard; ++i)
        p[i] = static_cast<P>(w[i]);
      mem_.upload(stage == 3 ? params_.data() + b.shard_offset : params_.data() + from, p.data(),
                  b.shard);
    });
    if constexpr (stage < 3) queue_gathers();
    drop_gathers();
    drop_host_copy();
  }
  /// Where bucket b's shard starts in the padded flat layout, for this rank.
  [[nodiscard]] std::size_t shard_begin(const bucket_info& b) const noexcept {
    return b.offset + static_cast<std::size_t>(shard_rank_cached()) * b.shard;
  }

private:
  static int shard_color(const Comm& dp, const options& o) {
    if constexpr (stage == 0) {
      return dp.rank();
    } else if constexpr (!Policy::is_hybrid) {
      return 0;
    } else {
      return inner_group(dp, o).first;
    }
  }
  static int replica_color(const Comm& dp, const options& o) {
    if constexpr (stage == 0) {
      return 0;
    } else if constexpr (!Policy::is_hybrid) {
      return dp.rank();
    } else {
      return inner_group(dp, o).second;
    }
  }
  // (which inner group, position in it) of this rank, for hybrid sharding.
  static std::pair<int, int> inner_group(const Comm& dp, const options& o) {
    const int n = dp.size();
    if (o.inner_size > 0) {
      if (n % o.inner_size != 0) {
        throw error("data_parallel", dp.rank(), error::unknown,
                    "hybrid: inner_size " + std::to_string(o.inner_size) +
                        " does not divide the data-parallel size " + std::to_string(n));
      }
      return {dp.rank() / o.inner_size, dp.rank() % o.inner_size};
    }
    const std::vector<int>& node = dp.node_of();
    int mine = 0, pos = 0, first_count = -1;
    std::vector<int> nodes(node.begin(), node.end());
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    for (int nd : nodes) {
      const auto c = static_cast<int>(std::count(node.begin(), node.end(), nd));
      if (first_count < 0) first_count = c;
      if (c != first_count) {
        throw error("data_parallel", dp.rank(), error::unknown,
                    "hybrid: nodes hold different numbers of data-parallel ranks (" +
                        std::to_string(first_count) + " and " + std::to_string(c) +
                        "); set options::inner_size");
      }
    }
    for (int r = 0; r < dp.rank(); ++r)
      pos += node[static_cast<std::size_t>(r)] == node[static_cast<std::size_t>(dp.rank())];
    mine = static_cast<int>(
        std::lower_bound(nodes.begin(), nodes.end(), node[static_cast<std::size_t>(dp.rank())]) -
        nodes.begin());
    return {mine, pos};
  }

  int shard_rank_cached() const noexcept { return shard_.rank(); }

  std::size_t layout_index(std::string_view name) const {
    const auto& ts = layout_.tensors();
    for (std::size_t i = 0; i < ts.size(); ++i) {
      if (ts[i].name == name) return i;
    }
    throw error("data_parallel", dp_rank_, error::unknown,
                "no tensor named '" + std::string(name) + "'");
  }
  void check_full(std::size_t n, std::string_view what) const {
    if (n != layout_.elements()) {
      throw error("data_parallel::" + std::string(what), dp_rank_, error::unknown,
                  "expected the full model of " + std::to_string(layout_.elements()) +
                      " elements, got " + std::to_string(n));
    }
  }

  // f(bucket, where this rank's shard of it starts in the padded layout)
  template <class F>
  void for_each_shard(F&& f) {
    for (const auto& b : layout_.buckets())
      f(b, shard_begin(b));
  }
  P* grad_shard(const bucket_info& b) {
    return stage >= 2 ? grads_.data() + b.shard_offset : grads_.data() + shard_begin(b);
  }

  // What the global norm counts of this rank's shard of the summed gradients: all of it but
  // replicated tensors off model-parallel rank 0 and the second copies of tied tensors. The
  // gradient buffer never moves, so this holds until set_norm_group changes the rank.
  std::vector<detail::norm_range<P>> norm_ranges() {
    std::vector<detail::norm_range<P>> ranges;
    const auto& ts = layout_.tensors();
    for (const auto& b : layout_.buckets()) {
      const P* g = grad_shard(b);
      const std::size_t lo = shard_begin(b), hi = lo + b.shard;
      for (std::size_t t = b.first_tensor; t < b.end_tensor; ++t) {
        if ((mp_rank_ != 0 && ts[t].replicated) || ts[t].tied_copy) continue;
        const std::size_t p = layout_.padded_offset(t);
        const std::size_t from = std::max(lo, p), to = std::min(hi, p + ts[t].count);
        if (from < to) ranges.push_back({g + (from - lo), to - from});
      }
    }
    return ranges;
  }

  // Gathers a shard over S into a bucket-sized span (a copy when S has one rank); in a job.
  void gather_into(std::span<const P> mine, std::span<P> out) {
    if (shard_.size() == 1) {
      mem_.copy(out.data(), mine.data(), mine.size(), lane::side);
    } else {
      mem_.run(shard_, [&](Comm& c) { all_gather(c, mine, out); });
    }
  }

  [[nodiscard]] bool complete(std::size_t bi) const {
    const bucket_info& b = layout_.buckets()[bi];
    return ready_[bi] == b.end_tensor - b.first_tensor;
  }
  // Starts the reductions of the buckets not yet started, last first: every one (all: from
  // `caller`, reduce_gradients or step), or while the next is complete. A bucket reduce_bucket
  // reduced this step is passed over (it is reduced only through reduce_bucket); under `all` one
  // opened or marked since its last reduce_bucket is an error, not a dropped gradient, and
  // hybrid sharding all-reduces the shards reduce_bucket summed across the replicas, once.
  void launch_in_order(bool all, const char* caller = "") {
    if (all) {
      for (std::size_t b = 0; b < rounds_.size(); ++b) {
        if (rounds_[b] > 0 && (!staging_[b].empty() || ready_[b] != 0)) {
          throw error("data_parallel::" + std::string(caller), dp_rank_, error::unknown,
                      "bucket " + std::to_string(b) +
                          " was opened (grad, bucket_gradients) or marked ready after its last "
                          "reduce_bucket this step: call reduce_bucket after the last micro-batch "
                          "too");
        }
      }
    }
    while (unlaunched_ > 0) {
      const std::size_t b = unlaunched_ - 1;
      if (rounds_[b] == 0 && !all && !complete(b)) break;
      --unlaunched_;
      if (rounds_[b] == 0) submit_reduction(b, false);
    }
    if (all && !closed_) {
      closed_ = true;
      if (replica_.size() > 1) {
        for (std::size_t b = rounds_.size(); b-- > 0;) {
          if (rounds_[b] == 0) continue;
          reductions_[b].wait();
          reductions_[b] = queue_->submit([this, &bi = layout_.buckets()[b]] {
            mem_.run(replica_,
                     [&](Comm& c) { all_reduce(c, std::span<P>(grad_shard(bi), bi.shard)); });
          });
        }
      }
    }
  }
  // Bucket bi's reduction, queued. round: reduce_bucket's, whose shard is all-reduced across
  // hybrid replicas at the step's end rather than every micro-batch.
  void submit_reduction(std::size_t bi, bool round) {
    submitted_[bi] = true;
    const bucket_info& b = layout_.buckets()[bi];
    if constexpr (stage == 0) {
      reductions_[bi] = queue_->submit([this, &b] {
        if (replica_.size() > 1) {
          mem_.run(replica_, [&](Comm& c) {
            all_reduce(c, std::span<P>(grads_.data() + b.offset, b.padded));
          });
        }
      });
    } else {
      buffer<P> full;
      if constexpr (stage >= 2) {
        full = std::move(staging_[bi]);
        if (full.empty())
          alloc_transient(full, b.padded, lane::main,
                          transient_kind::gradient_buckets); // no grad(): zeros
      }
      // zero<2>/<3>: a bucket reduce_bucket reduced before this step adds into its shard
      const bool accumulate = rounds_[bi] > 0;
      reductions_[bi] =
          queue_->submit([this, &b, accumulate, round, full = std::move(full)]() mutable {
            const P* in = stage >= 2 ? full.data() : grads_.data() + b.offset;
            buffer<P> tmp;
            alloc_transient(tmp, b.shard, lane::side, transient_kind::scratch);
            const std::span<P> out(tmp.data(), b.shard);
            if (shard_.size() > 1) {
              mem_.run(shard_,
                       [&](Comm& c) { reduce_scatter(c, std::span<const P>(in, b.padded), out); });
            } else {
              mem_.copy(out.data(), in, b.padded, lane::side);
            }
            if (replica_.size() > 1 && !round)
              mem_.run(replica_, [&](Comm& c) { all_reduce(c, out); });
            if (accumulate) {
              mem_.add(grad_shard(b), out.data(), b.shard, lane::side);
            } else {
              mem_.copy(grad_shard(b), out.data(), b.shard, lane::side);
            }
            free_transient(tmp, lane::side, transient_kind::scratch);
            if constexpr (stage >= 2)
              free_transient(
                  full, lane::side,
                  transient_kind::gradient_buckets); // the full-size bucket is gone once reduced
          });
    }
  }

  // zero<1>/<2>: each bucket's all-gather of the shards into params_, queued.
  void queue_gathers() {
    if (shard_.size() == 1) return;
    for (std::size_t bi = 0; bi < layout_.buckets().size(); ++bi) {
      gathers_[bi] = queue_->submit([this, &b = layout_.buckets()[bi]] {
        buffer<P> mine;
        alloc_transient(mine, b.shard, lane::side, transient_kind::scratch);
        mem_.copy(mine.data(), params_.data() + shard_begin(b), b.shard, lane::side);
        mem_.run(shard_, [&](Comm& c) {
          all_gather(c, std::span<const P>(mine.data(), b.shard),
                     std::span<P>(params_.data() + b.offset, b.padded));
        });
        free_transient(mine, lane::side, transient_kind::scratch);
      });
    }
  }

  // On a device: the shard's fp32 weights and state, copied to the host for a checkpoint.
  void take_host_copy() {
    if (host_copy_) return;
    wait_all();
    host_weights_.assign(layout_.shard_elements(), 0.0f);
    host_state_.assign(state_.size(), 0.0f);
    if constexpr (mixed) {
      mem_.download(host_weights_.data(), master_.data(), host_weights_.size());
    } else {
      for_each_shard([&](const bucket_info& b, std::size_t from) {
        mem_.download(host_weights_.data() + b.shard_offset,
                      params_.data() + (stage == 3 ? b.shard_offset : from), b.shard);
      });
    }
    mem_.download(host_state_.data(), state_.data(), host_state_.size());
    host_copy_ = true;
  }
  void drop_host_copy() {
    if (!host_copy_) return;
    std::vector<float>().swap(host_weights_);
    std::vector<float>().swap(host_state_);
    host_copy_ = false;
  }

  void start_gather(std::size_t bi) {
    if (gather_started_[bi] || resident_[bi]) return;
    gather_started_[bi] = true;
    const bucket_info& b = layout_.buckets()[bi];
    alloc_transient(gathered_[bi], b.padded, lane::main, transient_kind::gathered_weights);
    gathers_[bi] = queue_->submit([this, &b, bi] {
      gather_into(std::span<const P>(params_.data() + b.shard_offset, b.shard),
                  std::span<P>(gathered_[bi].data(), b.padded));
    });
  }
  // zero<3>: bucket b's gathered parameters freed (after its gather, if one is running).
  void free_gathered(std::size_t b) {
    if (gather_started_[b]) gathers_[b].wait();
    free_transient(gathered_[b], lane::main, transient_kind::gathered_weights);
    gather_started_[b] = false;
    resident_[b] = false;
  }
  void acquire(std::size_t bi) {
    if (resident_[bi]) return;
    start_gather(bi);
    gathers_[bi].wait();
    resident_[bi] = true;
  }
  void drop_gathers() {
    if constexpr (stage < 3) {
      for (auto& w : gathers_)
        w.wait();
    } else {
      for (std::size_t b = 0; b < gathered_.size(); ++b)
        free_gathered(b);
    }
  }

  // The hyper-parameters, checked before anything collective is started.
  static Rule checked(const Rule& r) {
    if constexpr (requires { r.check(); }) r.check();
    return r;
  }
  static options checked(const options& o) {
    if (!(o.max_grad_norm >= 0.0f))
      throw error("data_parallel: max_grad_norm must be >= 0 (0: no clipping)");
    return o;
  }

  void wait_all() {
    for (auto& w : reductions_)
      w.wait();
    for (auto& w : gathers_)
      w.wait();
  }
  void finish_step() {
    if constexpr (stage < 2) mem_.fill_zero(grads_.data(), grads_.size(), lane::main);
    for (auto& s : staging_)
      free_transient(s, lane::main, transient_kind::gradient_buckets);
    std::fill(ready_.begin(), ready_.end(), 0);
    std::fill(marked_.begin(), marked_.end(), 0);
    std::fill(submitted_.begin(), submitted_.end(), false);
    std::fill(rounds_.begin(), rounds_.end(), 0);
    last_round_ = rounds_.size();
    closed_ = false;
    unlaunched_ = submitted_.size();
    for (auto& w : reductions_)
      w = work_t{};
    drop_gathers();
    backward_ = false;
  }

  // Short-lived buffers, counted for memory(): allocated by either thread.
  enum class transient_kind : std::uint8_t { gathered_weights, gradient_buckets, scratch };
  static void raise(std::atomic<std::size_t>& peak, std::size_t now) {
    auto p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  void alloc_transient(buffer<P>& v, std::size_t n, lane l, transient_kind k) {
    mem_.zeros(v, n, l);
    const auto i = static_cast<std::size_t>(k);
    raise(held_peak_[i], held_[i].fetch_add(n * sizeof(P)) + n * sizeof(P));
    raise(transient_peak_, transient_.fetch_add(n * sizeof(P)) + n * sizeof(P));
  }
  void free_transient(buffer<P>& v, lane l, transient_kind k) {
    held_[static_cast<std::size_t>(k)].fetch_sub(v.size() * sizeof(P));
    transient_.fetch_sub(v.size() * sizeof(P));
    mem_.release(v, l);
  }
  void check_bucket(std::size_t b, const char* what) const {
    if (b >= layout_.buckets().size()) {
      throw error("data_parallel::" + std::string(what), dp_rank_, error::unknown,
                  "no bucket " + std::to_string(b) + " (there are " +
                      std::to_string(layout_.buckets().size()) + ")");
    }
  }

  Rule rule_;
  options opt_;
  int dp_rank_, dp_size_;
  space mem_;            // before the communicators: it may make their streams
  Comm shard_, replica_; // used only by the jobs of queue_
  std::optional<Comm> norm_;
  int mp_rank_ = 0;
  layout layout_;
  loss_scaler scaler_;
  bool scaling_ = false;
  int update_threads_ = 1;
  long step_ = 0;
  bool backward_ = false;
  buffer<P> params_, grads_;
  buffer<float> master_, state_;
  buffer<double> norm_partial_; // the squared norm's partial sum, where the collectives read it
  typename space::template squares<P> squares_; // what of grads_ the norm counts (norm_ranges)
  std::vector<decay_run> decay_runs_; // this rank's shard of every bucket, bucket after bucket
  std::vector<std::size_t>
      decay_run_first_;            // bucket b's runs: [first[b], first[b + 1]) of decay_runs_
  std::vector<std::size_t> ready_; // per bucket: its tensors marked ready this step
  std::vector<char> marked_;       // per tensor: marked ready this step
  std::vector<bool> submitted_;
  std::vector<int> rounds_;    // per bucket: reduce_bucket's reductions this step
  std::size_t last_round_ = 0; // the bucket reduce_bucket reduced last this step (none: size)
  bool closed_ = false;        // reduce_gradients or step began the step's last reductions
  std::size_t unlaunched_ = 0; // buckets [0, unlaunched_) have not started reducing this step
  std::vector<work_t> reductions_;
  std::vector<buffer<P>> staging_, gathered_;
  std::vector<work_t> gathers_;
  std::vector<bool> gather_started_, resident_;
  std::atomic<std::size_t> transient_{0}, transient_peak_{0};
  std::array<std::atomic<std::size_t>, 3> held_{}, held_peak_{}; // by transient_kind
  std::vector<float> host_weights_, host_state_; // take_host_copy's (a device's checkpoints)
  bool host_copy_ = false;
  std::unique_ptr<typename space::queue> queue_; // last: its thread stops before the buffers go
};

/// data_parallel with the rule and communicator types deduced (it is neither copyable nor
/// movable: its queued jobs point into it).
template <sharding_policy Policy, class P = float, update_rule Rule, communicator Comm>
[[nodiscard]] auto make_data_parallel(Comm& dp, const param_set& ps, Rule rule,
                                      data_parallel_options o = {}) {
  return std::make_unique<data_parallel<Policy, Rule, P, Comm>>(dp, ps, rule, o);
}

} // namespace weft::optim
