#pragma once
// What a model is to weft: an embedding stage, a stack of `layers` blocks and a head stage (final
// norm, output layer, loss), each split over a tensor-parallel group. weft::strategy cuts the
// blocks into pipeline stages and trains any model of this shape; layer::sequential runs one
// whole on a single TP group (the one-rank model the strategy is checked against).
//
//   struct my_model {
//     using config = my_config;   // an aggregate with vocab, hidden, seq and layers
//                                 // (and anything else)
//     template <class T, weft::communicator Comm, class Gemm, class SP, class Recompute>
//     struct parts {
//       using embedding = ...;    // embedding(tp, config, seed, gemm)
//       using block = ...;        // block(tp, config, layer, seed, gemm)
//       using head = ...;         // head(tp, config, seed, gemm)
//     };
//   };
//
// Every stage has parameters() (layer::parameter: this rank's slice, its place in the full tensor,
// whether it is replicated over TP, decays, ...), zero_grad(), and stash()/restore() of what its
// backward needs from its forward, so that a pipeline keeps one set per microbatch in flight:
//
//   embedding  forward(ids, y)           ids: a microbatch's tokens;
//                                        y: rows x hidden (SP: this rank's rows)
//              backward(dy)
//   block      forward(x, y), backward(dy, dx)                         rows x hidden each
//   head       double forward(x, targets, divisor), backward(dx)     the counted tokens' loss
//                                                                    over divisor
//
// A model whose embedding table and output layer are one matrix says so with a static
// tied(config); its embedding and head then both have tied_weight() (the strategy sums the two
// gradients, across pipeline stages if need be). Rows are tokens, sequence after sequence.
#include <weft/comm/communicator.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>
#include <weft/layer/recompute.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::layer {

namespace detail {

/// Whether a stash (a layer's activations) says how many bytes it holds.
template <class A>
inline constexpr bool counts_bytes = requires(const A& a) {
  { a.bytes() } -> std::convertible_to<std::size_t>;
};
/// The bytes a stash holds (0 where it does not say).
template <class A>
[[nodiscard]] std::size_t bytes_of(const A& a) noexcept {
  if constexpr (counts_bytes<A>) {
    return a.bytes();
  } else {
    return 0;
  }
}

} // namespace detail

namespace detail {

template <class C>
concept model_config = requires(const C& c) {
  { c.vocab } -> std::convertible_to<std::size_t>;
  { c.hidden } -> std::convertible_to<std::size_t>;
  { c.seq } -> std::convertible_to<std::size_t>;
  { c.layers } -> std::convertible_to<std::size_t>;
};

template <class P, class T>
concept has_parameters = requires(P& p) {
  { p.parameters() } -> std::same_as<std::vector<parameter<T>>>;
  p.zero_grad();
  p.restore(p.stash());
};

template <class E, class T, class Comm, class Gemm, class Config>
concept embedding_stage = std::constructible_from<E, Comm&, const Config&, std::uint64_t, Gemm> &&
    has_parameters<E, T> &&
    requires(E& e, std::span<const std::int32_t> ids, matrix_view<T> y, matrix_view<const T> dy) {
  e.forward(ids, y);
  e.backward(dy);
};

template <class B, class T, class Comm, class Gemm, class Config>
concept block_stage =
    std::constructible_from<B, Comm&, const Config&, std::size_t, std::uint64_t, Gemm> &&
    has_parameters<B, T> && requires(B& b, matrix_view<const T> x, matrix_view<T> y) {
  b.forward(x, y);
  b.backward(x, y);
};

template <class H, class T, class Comm, class Gemm, class Config>
concept head_stage = std::constructible_from<H, Comm&, const Config&, std::uint64_t, Gemm> &&
    requires(H& h, matrix_view<const T> x, std::span<const std::int32_t> targets,
             matrix_view<T> dx) {
  { h.forward(x, targets, 1.0) } -> std::convertible_to<double>;
  h.backward(dx);
  { h.parameters() } -> std::same_as<std::vector<parameter<T>>>;
  h.zero_grad();
  { h.ignore_index() } -> std::convertible_to<std::int32_t>;
};

template <class M, class T, class Comm, class Gemm, class SP, class Recompute>
concept has_parts = requires {
  typename M::template parts<T, Comm, Gemm, SP, Recompute>::embedding;
  typename M::template parts<T, Comm, Gemm, SP, Recompute>::block;
  typename M::template parts<T, Comm, Gemm, SP, Recompute>::head;
};

// Which requirement M misses first (0: none), so that one static_assert names it.
template <class M, class T, class Comm, class Gemm, class SP, class Recompute>
constexpr int model_defect() {
  if constexpr (!requires { typename M::config; }) {
    return 1;
  } else if constexpr (!model_config<typename M::config>) {
    return 2;
  } else if constexpr (!has_parts<M, T, Comm, Gemm, SP, Recompute>) {
    return 3;
  } else {
    using P = typename M::template parts<T, Comm, Gemm, SP, Recompute>;
    using C = typename M::config;
    if constexpr (!embedding_stage<typename P::embedding, T, Comm, Gemm, C>) {
      return 4;
    } else if constexpr (!block_stage<typename P::block, T, Comm, Gemm, C>) {
      return 5;
    } else if constexpr (!head_stage<typename P::head, T, Comm, Gemm, C>) {
      return 6;
    } else {
      return 0;
    }
  }
}

/// Instantiated where a model is used: the one static_assert of what M lacks.
template <class M, class T, class Comm, class Gemm, class SP, class Recompute>
struct model_check {
  static constexpr int defect = model_defect<M, T, Comm, Gemm, SP, Recompute>();
  static_assert(defect != 1,
                "weft: a model names its configuration: using config = ... (weft/layer/model.hpp)");
  static_assert(defect != 2,
                "weft: a model's config has vocab, hidden, seq and layers (weft/layer/model.hpp)");
  static_assert(
      defect != 3,
      "weft: a model has template <class T, communicator Comm, class Gemm, class SP, class "
      "Recompute> struct parts with the types embedding, block and head (weft/layer/model.hpp)");
  static_assert(defect != 4,
                "weft: a model's embedding is made as embedding(tp, config, seed, gemm) and has "
                "forward(ids, y), backward(dy), parameters(), zero_grad(), stash() and restore()");
  static_assert(
      defect != 5,
      "weft: a model's block is made as block(tp, config, layer, seed, gemm) and has "
      "forward(x, y), backward(dy, dx), parameters(), zero_grad(), stash() and restore()");
  static_assert(
      defect != 6,
      "weft: a model's head is made as head(tp, config, seed, gemm) and has double "
      "forward(x, targets, divisor), backward(dx), parameters(), zero_grad() and ignore_index()");
  static constexpr bool value = defect == 0;
};

// The model's config, or an empty stand-in for a type that has none (its model_check says why).
template <class M>
struct config_of {
  struct none {};
  using type = none;
};
template <class M>
requires requires { typename M::config; }
struct config_of<M> {
  using type = typename M::config;
};

} // namespace detail

/// A model weft can train with these element, communicator, GEMM, sequence-parallel and
/// recompute types (see the header comment).
template <class M, class T, class Comm, class Gemm, class SP, class Recompute>
concept model = detail::model_defect<M, T, Comm, Gemm, SP, Recompute>()
== 0;

/// Whether the model's embedding table and output layer are one matrix.
template <class M>
[[nodiscard]] constexpr bool tied(const typename M::config& c) {
  if constexpr (requires {
                  { M::tied(c) } -> std::convertible_to<bool>;
                }) {
    return M::tied(c);
  } else {
    return false;
  }
}

/// Checks a configuration's sizes, naming the first that is zero.
template <detail::model_config C>
void check_model_config(const C& c, const std::string& who) {
  if (c.vocab == 0 || c.hidden == 0 || c.seq == 0 || c.layers == 0) {
    throw error(who + ": the model needs a positive vocab, hidden, seq and layers (got vocab " +
                std::to_string(c.vocab) + ", hidden " + std::to_string(c.hidden) + ", seq " +
                std::to_string(c.seq) + ", layers " + std::to_string(c.layers) + ")");
  }
}

/// Prefixes every parameter's name and appends it to `to`.
template <class T>
void append_parameters(std::vector<parameter<T>>& to, const std::string& prefix,
                       std::vector<parameter<T>> from) {
  for (auto& p : from) {
    p.name = prefix + p.name;
    to.push_back(std::move(p));
  }
}

/// A whole model on one tensor-parallel group: every block in order, no pipeline.
///
///   weft::layer::sequential<weft::layer::gpt_model, float, Comm> model(tp, config, seed);
///   double loss = model.forward(ids, targets);   // batch * seq tokens; the mean over the counted
///                                                // targets
///   model.backward();                             // gradients accumulate until zero_grad()
///
/// Parameter names: "embedding.", "block<l>.", "head." before the stages' own. A tied model
/// keeps one matrix in both stages: the head's copy starts as the table and both take the sum
/// of the two gradients in backward. Under sequence parallelism backward ends with the one
/// all-reduce of the replicated parameters' partial gradients, of its own contribution only.
template <class Model, class T, communicator Comm, class Gemm, class SP = no_sequence_parallel,
          class Recompute = recompute::none>
class sequential {
  static_assert(detail::model_check<Model, T, Comm, Gemm, SP, Recompute>::value);

public:
  using config_type = typename Model::config;
  using parts = typename Model::template parts<T, Comm, Gemm, SP, Recompute>;
  using embedding_type = typename parts::embedding;
  using block_type = typename parts::block;
  using head_type = typename parts::head;
  using space = space_of<Gemm>;

  sequential(Comm& tp, config_type config, std::uint64_t seed, Gemm gemm = {})
      : tp_(&tp),
        config_((check_model_config(config, "sequential"), std::move(config))),
        gemm_(gemm),
        embedding_(tp, config_, seed, gemm),
        head_(tp, config_, seed, gemm) {
    blocks_.reserve(config_.layers);
    for (std::size_t l = 0; l < config_.layers; ++l)
      blocks_.emplace_back(tp, config_, l, seed, gemm);
    if (tied<Model>(config_)) copy_tied_weight();
  }

  [[nodiscard]] const config_type& config() const noexcept { return config_; }
  [[nodiscard]] const config_type& shape() const noexcept { return config_; }

  /// The counted targets' summed loss over `divisor` (0: their number, the mean) for `ids`
  /// (batch * seq tokens) predicting `targets`.
  double forward(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets,
                 double divisor = 0) {
    if (ids.size() != targets.size() || ids.empty() || ids.size() % config_.seq != 0) {
      throw error("sequential::forward: " + std::to_string(ids.size()) + " ids and " +
                  std::to_string(targets.size()) +
                  " targets; both must be the same whole number of sequences of " +
                  std::to_string(config_.seq));
    }
    const std::size_t tokens = ids.size();
    const std::size_t rows =
        SP::enabled ? detail::check_sequence_split("sequential::forward", tokens, tp_->size())
                    : tokens;
    acts_.resize(config_.layers + 1);
    detail::resize(gemm_, acts_[0], rows, config_.hidden);
    embedding_.forward(ids, acts_[0].view());
    for (std::size_t l = 0; l < config_.layers; ++l) {
      detail::resize(gemm_, acts_[l + 1], rows, config_.hidden);
      blocks_[l].forward(detail::cview(acts_[l].view()), acts_[l + 1].view());
    }
    const double loss = head_.forward(detail::cview(acts_.back().view()), targets, divisor);
    rows_ = rows;
    // The stages keep what their backward needs. On a device the buffers stay for the next step:
    // cudaFree and cudaMalloc synchronize the device (and can stall NCCL peers driven by other
    // threads).
    if constexpr (!on_device<Gemm>) {
      for (auto& a : acts_)
        a = {};
    }
    return loss;
  }

  /// Gradients of the last forward's loss, accumulated into every parameter's grad.
  void backward() {
    if constexpr (SP::enabled) {
      if (reduced_since_zero_grad_) set_aside_reduced_grads();
    }
    if (tied<Model>(
            config_)) { // the head's copy holds the sum so far, which the table's carries too
      const auto h = head_.tied_weight();
      detail::for_each_element(gemm_, h.grad.rows(), h.grad.cols(),
                               detail::zero_element<T>{h.grad});
    }
    detail::resize(gemm_, d_a_, rows_, config_.hidden);
    detail::resize(gemm_, d_b_, rows_, config_.hidden);
    head_.backward(d_b_.view());
    for (std::size_t l = config_.layers; l-- > 0;) {
      blocks_[l].backward(detail::cview(d_b_.view()), d_a_.view());
      std::swap(d_a_, d_b_);
    }
    embedding_.backward(detail::cview(d_b_.view()));
    if (tied<Model>(config_)) sum_tied_grads();
    if constexpr (SP::enabled) {
      auto ps = parameters();
      reduce_sequence_parallel_grads(gemm_, *tp_, std::span<parameter<T>>(ps), sp_grads_);
      if (reduced_since_zero_grad_) add_back_reduced_grads(ps);
      reduced_since_zero_grad_ = true;
    }
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    append_parameters(ps, "embedding.", embedding_.parameters());
    for (std::size_t l = 0; l < config_.layers; ++l) {
      append_parameters(ps, "block" + std::to_string(l) + ".", blocks_[l].parameters());
    }
    append_parameters(ps, "head.", head_.parameters());
    return ps;
  }
  void zero_grad() {
    reduced_since_zero_grad_ = false;
    embedding_.zero_grad();
    for (auto& b : blocks_)
      b.zero_grad();
    head_.zero_grad();
  }

  /// The logits of the last forward: tokens x this rank's vocabulary columns (in Gemm's memory).
  [[nodiscard]] matrix_view<const T> logits() const noexcept { return head_.logits(); }
  block_type& block(std::size_t l) { return blocks_.at(l); }
  embedding_type& embedding() noexcept { return embedding_; }
  head_type& head() noexcept { return head_; }

private:
  void copy_tied_weight() {
    const auto e = embedding_.tied_weight();
    const auto h = head_.tied_weight();
    detail::copy_view(gemm_, matrix_view<const T>(e.value), h.value);
  }
  // Both copies take the sum of the two gradients: the table's holds the earlier backwards' sum
  // and its own part of this one, the head's (zeroed before it) its part of this one.
  void sum_tied_grads() {
    const auto e = embedding_.tied_weight();
    const auto h = head_.tied_weight();
    detail::for_each_element(gemm_, e.grad.rows(), e.grad.cols(),
                             detail::add_element<T>{e.grad, matrix_view<const T>(h.grad)});
    detail::copy_view(gemm_, matrix_view<const T>(e.grad), h.grad);
  }

  // Sequence parallelism: what earlier backwards accumulated (since zero_grad) into the
  // replicated parameters' gradients is summed over the TP group already. A backward sets it
  // aside, reduces only its own partial sums, and adds it back: reducing the whole gradient would
  // count the earlier backwards tp times.
  void set_aside_reduced_grads() {
    auto ps = parameters();
    std::size_t n = 0;
    for (const auto& p : ps) {
      if (p.sequence_partial) n += p.grad.size();
    }
    detail::resize(gemm_, sp_kept_, 1, n);
    std::size_t at = 0;
    for (const auto& p : ps) {
      if (!p.sequence_partial) continue;
      const matrix_view<T> kept(sp_kept_.data() + at, p.grad.rows(), p.grad.cols());
      detail::copy_view(gemm_, matrix_view<const T>(p.grad), kept);
      detail::for_each_element(gemm_, p.grad.rows(), p.grad.cols(),
                               detail::zero_element<T>{p.grad});
      at += p.grad.size();
    }
  }
  void add_back_reduced_grads(const std::vector<parameter<T>>& ps) {
    std::size_t at = 0;
    for (const auto& p : ps) {
      if (!p.sequence_partial) continue;
      const matrix_view<const T> kept(sp_kept_.data() + at, p.grad.rows(), p.grad.cols());
      detail::for_each_element(gemm_, p.grad.rows(), p.grad.cols(),
                               detail::add_element<T>{p.grad, kept});
      at += p.grad.size();
    }
  }

  Comm* tp_;
  config_type config_;
  Gemm gemm_;
  embedding_type embedding_;
  std::vector<block_type> blocks_;
  head_type head_;
  std::vector<matrix<T, space>> acts_;
  std::size_t rows_ = 0;
  matrix<T, space> d_a_, d_b_;
  matrix<T, space> sp_grads_; // sequence_parallel: the replicated parameters' gradients, packed
  matrix<T, space> sp_kept_;  // ... and what earlier backwards reduced, set aside
  bool reduced_since_zero_grad_ = false;
};

} // namespace weft::layer
