#pragma once
// A GPT-style language model over a tensor-parallel group, built from the layers: the model the
// layer tests, the benchmark and the 3D strategy train.
//
//   vocab-parallel embedding -> `layers` transformer blocks -> final LayerNorm
//     -> LM head (column-parallel, no bias, vocabulary split like the embedding) -> vocab-parallel cross entropy
//
//   weft::layer::gpt<float, weft::local::communicator> model(tp, {.vocab = 1000, .hidden = 256, .heads = 8,
//                                                                 .seq = 64, .layers = 4}, seed);
//   double loss = model.forward(ids, targets);   // ids, targets: batch * seq tokens, sequence after sequence
//   model.backward();                             // gradients accumulate until zero_grad()
//
// The loss is the mean over the tokens. Under sequence parallelism backward ends with the one
// all-reduce of the replicated parameters' partial gradients (reduce_sequence_parallel_grads), of
// its own contribution only: gradients accumulated over several backwards are summed once.
// Tensor ids: embedding 0, blocks from 1 (4 each), LM head after them; one seed makes the same
// model at every TP size.
//
// With a device GEMM policy (cublas on the communicator's stream) every layer runs in device
// memory on that stream; ids and targets stay host spans, and forward waits for the loss.
#include <weft/comm/communicator.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/block.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/cross_entropy.hpp>
#include <weft/layer/embedding.hpp>
#include <weft/layer/layer_norm.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>
#include <weft/layer/recompute.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace weft::layer {

struct gpt_shape {
  std::size_t vocab = 0;
  std::size_t hidden = 0;
  std::size_t heads = 0;
  std::size_t ffn = 0;  // 0: 4 * hidden
  std::size_t seq = 0;
  std::size_t layers = 0;
};

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel,
          recompute::policy Recompute = recompute::none>
class gpt {
public:
  using block_type = transformer_block<T, Comm, Gemm, SP, Recompute>;
  using space = space_of<Gemm>;

  gpt(Comm& tp, gpt_shape shape, std::uint64_t seed, Gemm gemm = {})
      : tp_(&tp), shape_(shape), gemm_(gemm), embedding_(tp, shape.vocab, shape.hidden, seed, 0, 0.02, gemm),
        final_norm_(shape.hidden, 1e-5, gemm),
        head_(tp, shape.hidden, shape.vocab, seed, 1 + block_type::tensor_ids * shape.layers, {.bias = false}, gemm),
        loss_(tp, shape.vocab, gemm) {
    if (shape.layers == 0) throw error("gpt: a model needs at least one layer");
    blocks_.reserve(shape.layers);
    for (std::size_t l = 0; l < shape.layers; ++l) {
      blocks_.emplace_back(tp, block_shape{shape.hidden, shape.heads, shape.ffn, shape.seq}, seed,
                           1 + block_type::tensor_ids * l, gemm);
    }
  }

  [[nodiscard]] const gpt_shape& shape() const noexcept { return shape_; }

  /// The mean loss over the tokens of `ids` (batch * seq of them) predicting `targets`.
  double forward(std::span<const std::int32_t> ids, std::span<const std::int32_t> targets) {
    if (ids.size() != targets.size() || ids.empty() || ids.size() % shape_.seq != 0) {
      throw error("gpt::forward: " + std::to_string(ids.size()) + " ids and " + std::to_string(targets.size()) +
                  " targets; both must be the same whole number of sequences of " + std::to_string(shape_.seq));
    }
    const std::size_t tokens = ids.size();
    const std::size_t rows = SP::enabled ? detail::check_sequence_split("gpt::forward", tokens, tp_->size()) : tokens;
    acts_.resize(shape_.layers + 1);
    detail::resize(gemm_, acts_[0], rows, shape_.hidden);
    embedding_.forward(ids, acts_[0].view());
    for (std::size_t l = 0; l < shape_.layers; ++l) {
      detail::resize(gemm_, acts_[l + 1], rows, shape_.hidden);
      blocks_[l].forward(detail::cview(acts_[l].view()), acts_[l + 1].view());
    }
    detail::resize(gemm_, normed_, rows, shape_.hidden);
    final_norm_.forward(detail::cview(acts_.back().view()), normed_.view());
    detail::resize(gemm_, logits_, tokens, head_.out_local());
    head_.forward(detail::cview(normed_.view()), logits_.view());
    // The blocks keep what their backward needs. On a device the buffers stay for the next step:
    // cudaFree and cudaMalloc synchronize the device (and can stall NCCL peers driven by other threads).
    if constexpr (!on_device<Gemm>) {
      for (auto& a : acts_) a = {};
    }
    return loss_.forward(detail::cview(logits_.view()), targets);
  }

  /// Gradients of the last forward's loss, accumulated into every parameter's grad.
  void backward() {
    if constexpr (SP::enabled) {
      if (reduced_since_zero_grad_) set_aside_reduced_grads();
    }
    const std::size_t rows = normed_.rows();
    detail::resize(gemm_, dlogits_, logits_.rows(), logits_.cols());
    loss_.backward(dlogits_.view());
    detail::resize(gemm_, d_a_, rows, shape_.hidden);
    detail::resize(gemm_, d_b_, rows, shape_.hidden);
    head_.backward(detail::cview(dlogits_.view()), d_a_.view());
    final_norm_.backward(detail::cview(d_a_.view()), d_b_.view());
    for (std::size_t l = shape_.layers; l-- > 0;) {
      blocks_[l].backward(detail::cview(d_b_.view()), d_a_.view());
      std::swap(d_a_, d_b_);
    }
    embedding_.backward(detail::cview(d_b_.view()));
    if constexpr (SP::enabled) {
      auto ps = parameters();
      reduce_sequence_parallel_grads(gemm_, *tp_, std::span<parameter<T>>(ps), sp_grads_);
      if (reduced_since_zero_grad_) add_back_reduced_grads(ps);
      reduced_since_zero_grad_ = true;
    }
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    append(ps, "embedding.", embedding_.parameters());
    for (std::size_t l = 0; l < shape_.layers; ++l) {
      append(ps, "block" + std::to_string(l) + ".", blocks_[l].parameters());
    }
    append(ps, "final_norm.", final_norm_.parameters());
    append(ps, "head.", head_.parameters());
    return ps;
  }
  void zero_grad() {
    reduced_since_zero_grad_ = false;
    embedding_.zero_grad();
    for (auto& b : blocks_) b.zero_grad();
    final_norm_.zero_grad();
    head_.zero_grad();
  }

  /// The logits of the last forward: tokens x this rank's vocabulary columns (in Gemm's memory).
  [[nodiscard]] matrix_view<const T> logits() const noexcept { return logits_.view(); }
  block_type& block(std::size_t l) { return blocks_.at(l); }

private:
  static void append(std::vector<parameter<T>>& to, const std::string& prefix, std::vector<parameter<T>> ps) {
    for (auto& p : ps) {
      p.name = prefix + p.name;
      to.push_back(std::move(p));
    }
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
      detail::for_each_element(gemm_, p.grad.rows(), p.grad.cols(), detail::zero_element<T>{p.grad});
      at += p.grad.size();
    }
  }
  void add_back_reduced_grads(const std::vector<parameter<T>>& ps) {
    std::size_t at = 0;
    for (const auto& p : ps) {
      if (!p.sequence_partial) continue;
      const matrix_view<const T> kept(sp_kept_.data() + at, p.grad.rows(), p.grad.cols());
      detail::for_each_element(gemm_, p.grad.rows(), p.grad.cols(), detail::add_element<T>{p.grad, kept});
      at += p.grad.size();
    }
  }

  Comm* tp_;
  gpt_shape shape_;
  Gemm gemm_;
  vocab_parallel_embedding<T, Comm, SP, Gemm> embedding_;
  std::vector<block_type> blocks_;
  layer_norm<T, SP, Gemm> final_norm_;
  column_parallel_linear<T, Comm, Gemm, SP> head_;
  vocab_parallel_cross_entropy<T, Comm, Gemm> loss_;
  std::vector<matrix<T, space>> acts_;
  matrix<T, space> normed_, logits_, dlogits_, d_a_, d_b_;
  matrix<T, space> sp_grads_;  // sequence_parallel: the replicated parameters' gradients, packed
  matrix<T, space> sp_kept_;   // ... and what earlier backwards reduced, set aside
  bool reduced_since_zero_grad_ = false;
};

} // namespace weft::layer
