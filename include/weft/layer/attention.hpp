#pragma once
// Causal self-attention split over the heads of a tensor-parallel group (Megatron-style), with
// grouped-query attention and rotary positions for Llama-style models:
//
//   q, k, v = column_parallel(x)        this rank's query heads and the key/value heads they use
//   q, k = rotary(q, k)                 (rope_theta > 0) every head turned by its position
//   ctx_h = softmax(q_h k_g(h)^T / sqrt(d) + causal mask) v_g(h)  for every local query head h,
//                                       no communication
//   y = row_parallel(ctx)               all-reduce (sequence_parallel: reduce-scatter)
//
// Tokens are rows, sequence by sequence: row b * seq + s is position s of sequence b, so a batch of
// `batch` sequences is batch * seq rows (sequence_parallel: the group's ranks hold consecutive
// blocks of those rows). heads must divide by the TP size, and d = hidden / heads.
//
// Two layouts of the input projection, chosen by attention_options::kv_heads:
//   kv_heads = 0 (GPT, multi-head): one fused weight, 3 * hidden x hidden, with head h's query, key
//       and value rows at [3 h d, 3 h d + 3 d), parameters "qkv.*" and "out.*". A column split at
//       head boundaries gives each rank whole heads, and the same full weight at every TP size.
//   kv_heads > 0 (Llama; kv_heads = heads is multi-head in this layout): query head h uses
//       key/value head g(h) = h / (heads / kv_heads); parameters "q.*", "k.*", "v.*", "o.*"
//       (Hugging Face's names), q heads x d rows, k and v kv_heads x d rows each. Rank r holds
//       query heads [r heads/tp, (r + 1) heads/tp) and the key/value heads they use:
//         tp divides kv_heads:  kv heads [r kv/tp, (r + 1) kv/tp)           (a column split)
//         kv_heads divides tp:  kv head r / (tp/kv), the same on tp/kv ranks (replicated, as vLLM
//             and TensorRT-LLM do); each replica's weight and bias gradients are the part from its
//             own query heads, so backward sums this pass's part over the replicas (one all-reduce
//             over the group, each kv head in its own slot, on the group's stream) before adding it
//             to the accumulated gradient. Every replica but the first marks its slices duplicate.
//       anything else is an error naming both numbers.
//
// Rotary position embedding (rotary.hpp, Hugging Face's rotate_half): with pos = row % seq and, for
// i < d/2, angle = pos * theta^(-2i/d), every query and key head turns its pairs
//   (x_i, x_{i+d/2})  ->  (x_i cos - x_{i+d/2} sin,  x_{i+d/2} cos + x_i sin)
// after the projection and before the scores; backward turns dq and dk back (the transpose).
//
// Tensor ids (init.hpp; two per layer): tensor_id draws the input projection, tensor_id + 1 the
// output projection. In the grouped layout q, k and v are the row blocks of one
// (heads + 2 kv_heads) d x hidden tensor drawn as tensor_id: q rows [0, heads d), k rows
// [heads d, (heads + kv_heads) d), v the rest; so every TP size draws the same model.
//
// The attention core keeps the softmax probabilities (batch x local heads x seq x seq) for its
// backward unless told not to (keep_probabilities(false): selective recompute, recompute.hpp),
// in which case backward recomputes them from the kept (rotated) q, k and v. In the grouped layout
// the core reads each query head's key and value from a copy laid out as the fused one (q, k, v of
// each query head side by side, Megatron's repeat of the kv heads): its batched GEMMs then step
// over the heads by one stride; the copy is scratch, made again in backward from the kept
// projection, and backward sums the query heads' dk and dv into their kv head in a fixed order.
//
// With a device GEMM policy (cublas on the communicator's stream) all of it lives in device memory:
// the softmax and its backward are row stages (exec.hpp: a thread per row and lane, the lanes
// summed in a fixed order, the host's terms in the host's order) over all of one sequence's heads
// at once, and each of the core's products is one strided batched cuBLAS GEMM over those heads
// (gemm.hpp, gemm_strided_batched): launches per sequence, not per head. The rotation, the kv copy
// and its sum are element functors (exec.hpp).
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/detail/causal_softmax.hpp>
#include <weft/layer/detail/grouped_kv.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/gemm.hpp>
#include <weft/layer/init.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>
#include <weft/layer/rotary.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

/// What parallel_attention is besides GPT's multi-head attention (Llama: grouped-query attention,
/// no biases, rotary positions, scaled residual projection).
struct attention_options {
  std::size_t kv_heads =
      0; // 0: multi-head in the fused "qkv" layout; else key/value heads, "q", "k", "v" layout
  bool bias = true;       // of every projection
  double rope_theta = 0;  // 0: no rotary position embedding
  double init_std = 0.02; // of q, k and v
  double out_init_std =
      0.02; // of the output projection: models scale residual projections by 1/sqrt(2 layers)
};

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel>
class parallel_attention {
public:
  using qkv_layer = column_parallel_linear<T, Comm, Gemm, SP>;
  using grouped_layer = detail::grouped_qkv_projection<T, Comm, Gemm, SP>;
  using out_layer = row_parallel_linear<T, Comm, Gemm, SP>;
  using space = space_of<Gemm>; // where q, k, v, the probabilities and the context live

  /// GPT's attention: multi-head, fused "qkv" layout, biases, init std 0.02. Tensor ids tensor_id
  /// (QKV) and tensor_id + 1 (output projection).
  parallel_attention(Comm& tp, std::size_t hidden, std::size_t heads, std::size_t seq,
                     std::uint64_t seed, std::uint64_t tensor_id, Gemm gemm = {})
      : parallel_attention(tp, hidden, heads, seq, seed, tensor_id, attention_options{}, gemm) {}

  /// As the options say (see the top of this file for the layouts). Tensor ids tensor_id (the input
  /// projection: fused QKV, or q, k, v stacked) and tensor_id + 1 (output projection).
  parallel_attention(Comm& tp, std::size_t hidden, std::size_t heads, std::size_t seq,
                     std::uint64_t seed, std::uint64_t tensor_id, attention_options opt,
                     Gemm gemm = {})
      : hidden_(hidden),
        heads_(heads),
        seq_(seq),
        head_dim_(checked_head_dim(tp, hidden, heads, seq, opt)),
        kv_heads_(opt.kv_heads == 0 ? heads : opt.kv_heads),
        local_heads_(heads / static_cast<std::size_t>(tp.size())),
        local_kv_heads_(detail::place_kv_heads(kv_heads_, static_cast<std::size_t>(tp.size()),
                                               static_cast<std::size_t>(tp.rank()))
                            .count),
        opt_(opt),
        gemm_(gemm),
        out_(tp, hidden, hidden, seed, tensor_id + 1,
             {.bias = opt.bias, .init_std = opt.out_init_std}, gemm) {
    if (fused()) {
      const typename qkv_layer::options qkv_opt{
          .bias = opt.bias, .gather_output = false, .init_std = opt.init_std};
      qkv_.emplace(tp, hidden, 3 * hidden, seed, tensor_id, qkv_opt, gemm);
    } else {
      grouped_.emplace(tp, hidden, heads, kv_heads_, head_dim_, seed, tensor_id, opt.bias,
                       opt.init_std, gemm);
    }
    if (rotary())
      detail::upload(gemm_, rotary_table<T>(seq, head_dim_, opt.rope_theta), rope_table_);
  }

  [[nodiscard]] std::size_t local_heads() const noexcept { return local_heads_; }
  [[nodiscard]] std::size_t local_kv_heads() const noexcept { return local_kv_heads_; }
  [[nodiscard]] std::size_t kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return head_dim_; }
  [[nodiscard]] std::size_t sequence() const noexcept { return seq_; }
  [[nodiscard]] const attention_options& config() const noexcept { return opt_; }
  /// The fused "qkv" layout (kv_heads = 0), else q, k and v.
  [[nodiscard]] bool fused() const noexcept { return opt_.kv_heads == 0; }
  /// The fused layout's QKV projection (an error in the grouped layout).
  qkv_layer& qkv() {
    if (!qkv_)
      throw error(
          "parallel_attention::qkv: the grouped (q, k, v) layout has no fused QKV projection");
    return *qkv_;
  }
  out_layer& out() noexcept { return out_; }

  /// Selective recompute keeps no probabilities and recomputes them in backward.
  void keep_probabilities(bool keep) noexcept { keep_probs_ = keep; }

  /// x, y: tokens x hidden (sequence_parallel: this rank's rows).
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    // Every shape is checked before the projections keep anything for backward.
    static constexpr std::string_view who = "parallel_attention::forward";
    if (x.cols() != hidden_)
      ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), hidden_);
    expect_shape(who, "y", y, x.rows(), out_.out_features());
    const std::size_t tokens =
        SP::enabled ? x.rows() * static_cast<std::size_t>(out_.comm().size()) : x.rows();
    if (tokens % seq_ != 0) {
      throw error("parallel_attention::forward: " + std::to_string(tokens) +
                  " tokens are not whole sequences of " + std::to_string(seq_));
    }
    batch_ = tokens / seq_;
    expanded_ = false;
    detail::resize(gemm_, proj_, tokens, projection_width());
    if (fused()) {
      qkv_->forward(x, proj_.view());
    } else {
      grouped_->forward(x, proj_.view());
    }
    rotate(proj_.view(), rotation::forward);
    if (!fused()) expand();
    detail::resize(gemm_, ctx_, tokens, local_heads_ * head_dim_);
    detail::resize(gemm_, probs_, (keep_probs_ ? blocks() : group_) * seq_, seq_);
    for (std::size_t k0 = 0; k0 < blocks(); k0 += group_) {
      scores(k0, probabilities(k0, keep_probs_));
      detail::causal_softmax(gemm_, probabilities_of_group(k0, keep_probs_), softmax_scratch_);
      // ctx_k = P_k V_k
      batched({square(), qkv_stride(), head_dim_}, trans::n, trans::n, T{1},
              probabilities(k0, keep_probs_), part(core_input(), k0, 2), ctx_of(ctx_, k0));
    }
    kept_probs_ = keep_probs_;
    out_.forward(detail::cview(ctx_.view()), y);
  }

  /// dy: like y; dx: like x.
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    const std::size_t tokens = batch_ * seq_;
    detail::resize(gemm_, dctx_, tokens, local_heads_ * head_dim_);
    out_.backward(dy, dctx_.view());
    if (!fused() && !expanded_) expand(); // another micro-batch's copy (stash, restore) or none
    detail::resize(gemm_, dqkv_, tokens, 3 * local_heads_ * head_dim_);
    detail::reshape(gemm_, dp_, group_ * seq_,
                    seq_); // every element written (dP) before it is read
    if (!kept_probs_) detail::reshape(gemm_, probs_, group_ * seq_, seq_);
    // With P the probabilities and dO the context's gradient:
    //   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),
    //   dQ = scale dS K,  dK = scale dS^T Q.
    for (std::size_t k0 = 0; k0 < blocks(); k0 += group_) {
      if (!kept_probs_) { // selective recompute: the group's probabilities again
        scores(k0, probabilities(k0, false));
        detail::causal_softmax(gemm_, probabilities_of_group(k0, false), softmax_scratch_);
      }
      const auto p = probabilities(k0, kept_probs_);
      const auto d_out = ctx_of(dctx_, k0);
      const auto ds = dp_.view().rows_from(0, seq_); // dP, then dS, of the group's first block
      batched({square(), head_dim_, qkv_stride()}, trans::t, trans::n, T{1}, p, d_out,
              part(dqkv_, k0, 2));
      batched({head_dim_, qkv_stride(), square()}, trans::n, trans::t, T{1}, d_out,
              part(core_input(), k0, 2), ds);
      detail::causal_softmax_backward(gemm_, detail::cview(probabilities_of_group(k0, kept_probs_)),
                                      dp_.view(), softmax_scratch_);
      batched({square(), qkv_stride(), qkv_stride()}, trans::n, trans::n, scale(), ds,
              part(core_input(), k0, 1), part(dqkv_, k0, 0));
      batched({square(), qkv_stride(), qkv_stride()}, trans::t, trans::n, scale(), ds,
              part(core_input(), k0, 0), part(dqkv_, k0, 1));
    }
    if (fused()) {
      rotate(dqkv_.view(), rotation::inverse);
      qkv_->backward(detail::cview(dqkv_.view()), dx);
      return;
    }
    detail::reshape(gemm_, dproj_, tokens, projection_width()); // every element written
    detail::for_each_element(
        gemm_, tokens, projection_width(),
        detail::collapse_kv_heads<T>{detail::cview(dqkv_.view()), dproj_.view(), head_dim_,
                                     local_heads_, local_kv_heads_});
    rotate(dproj_.view(), rotation::inverse);
    grouped_->backward(detail::cview(dproj_.view()), dx);
  }

  /// Fused layout: "qkv.weight", "qkv.bias", "out.weight", "out.bias"; grouped: "q.weight",
  /// "q.bias", "k.weight", "k.bias", "v.weight", "v.bias", "o.weight", "o.bias" (biases with
  /// options.bias).
  [[nodiscard]] std::vector<parameter<T>> parameters() {
    auto ps = fused() ? prefixed("qkv.", qkv_->parameters()) : grouped_->parameters();
    for (auto& p : prefixed(fused() ? "out." : "o.", out_.parameters()))
      ps.push_back(std::move(p));
    return ps;
  }
  void zero_grad() {
    input_state().zero_grad();
    out_.zero_grad();
  }

  /// Bytes kept from forward for backward: the (rotated) projection q, k, v, the probabilities
  /// unless selective recompute dropped them, and the two projections' input copies (the output
  /// projection's is the context). release() frees them all; backward then needs a new forward
  /// (full recompute). The grouped layout's per-query-head copy of k and v and the context the
  /// forward writes are scratch.
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return (proj_.size() + (kept_probs_ ? probs_.size() : 0)) * sizeof(T) +
           input_state().saved_bytes() + out_.saved_bytes();
  }
  void release() {
    input_state().release();
    out_.release();
    proj_ = {};
    qkv_heads_ = {};
    expanded_ = false;
    ctx_ = {};
    probs_ = {};
    softmax_scratch_.release();
  }

  /// What backward needs from forward, moved out and back (see linear.hpp).
  struct activations {
    typename detail::linear_state<T, Gemm>::activations
        qkv; // the input projection's, either layout
    typename out_layer::activations out;
    matrix<T, space> qkv_out, probs;
    std::size_t batch = 0;
    bool kept_probs = true;
    [[nodiscard]] std::size_t bytes() const noexcept {
      return qkv.bytes() + out.bytes() + (qkv_out.size() + probs.size()) * sizeof(T);
    }
  };
  [[nodiscard]] activations stash() {
    // Probabilities not kept, the grouped layout's copy of k and v and the context (which the
    // output projection's stash holds a copy of) are the layer's scratch, not the micro-batch's:
    // they stay.
    expanded_ = false;
    return {input_state().stash(),
            out_.stash(),
            std::exchange(proj_, {}),
            kept_probs_ ? std::exchange(probs_, {}) : matrix<T, space>{},
            batch_,
            kept_probs_};
  }
  void restore(activations a) {
    input_state().restore(std::move(a.qkv));
    out_.restore(std::move(a.out));
    proj_ = std::move(a.qkv_out);
    expanded_ = false;
    if (a.kept_probs) probs_ = std::move(a.probs);
    batch_ = a.batch;
    kept_probs_ = a.kept_probs;
  }

private:
  static std::size_t checked_head_dim(const Comm& tp, std::size_t hidden, std::size_t heads,
                                      std::size_t seq, const attention_options& opt) {
    if (heads == 0 || hidden % heads != 0) {
      throw error("parallel_attention: hidden " + std::to_string(hidden) +
                  " does not divide into " + std::to_string(heads) + " heads");
    }
    const std::size_t kv = opt.kv_heads == 0 ? heads : opt.kv_heads;
    if (heads % kv != 0) {
      throw error("parallel_attention: " + std::to_string(heads) +
                  " query heads do not divide into groups over " + std::to_string(kv) +
                  " key/value heads");
    }
    const auto p = static_cast<std::size_t>(tp.size());
    if (heads % p != 0) {
      throw error("parallel_attention: " + std::to_string(heads) +
                  " heads do not divide over a tensor-parallel group of " +
                  std::to_string(tp.size()));
    }
    if (kv % p != 0 && p % kv != 0) {
      throw error("parallel_attention: " + std::to_string(kv) +
                  " key/value heads and a tensor-parallel group of " + std::to_string(p) +
                  ": neither divides the other (split the kv heads over the ranks, or replicate " +
                  "each on tp / kv_heads ranks)");
    }
    if (seq == 0) throw error("parallel_attention: the sequence length must be positive");
    if (opt.rope_theta != 0 && (hidden / heads) % 2 != 0) {
      throw error(
          "parallel_attention: rotary position embedding pairs the halves of a head, and head " +
          std::string("dimension ") + std::to_string(hidden / heads) + " (hidden " +
          std::to_string(hidden) + " / " + std::to_string(heads) + " heads) is odd");
    }
    return hidden / heads;
  }

  static std::vector<parameter<T>> prefixed(const char* prefix, std::vector<parameter<T>> ps) {
    for (auto& p : ps)
      p.name = prefix + p.name;
    return ps;
  }

  [[nodiscard]] bool rotary() const noexcept { return opt_.rope_theta != 0; }
  [[nodiscard]] detail::linear_state<T, Gemm>& input_state() {
    if (fused()) return *qkv_;
    return *grouped_;
  }
  [[nodiscard]] const detail::linear_state<T, Gemm>& input_state() const {
    if (fused()) return *qkv_;
    return *grouped_;
  }
  // The input projection's columns: fused 3 d a local head; grouped d a local query head, 2 d a
  // local kv head.
  [[nodiscard]] std::size_t projection_width() const noexcept {
    return (fused() ? 3 * local_heads_ : local_heads_ + 2 * local_kv_heads_) * head_dim_;
  }
  // What the core reads: q, k, v of each local query head side by side.
  matrix<T, space>& core_input() noexcept { return fused() ? proj_ : qkv_heads_; }

  // The grouped layout's projection copied to the core's layout (scratch, every element written).
  void expand() {
    const std::size_t tokens = proj_.rows();
    detail::reshape(gemm_, qkv_heads_, tokens, 3 * local_heads_ * head_dim_);
    detail::for_each_element(
        gemm_, tokens, qkv_heads_.cols(),
        detail::expand_kv_heads<T>{detail::cview(proj_.view()), qkv_heads_.view(), head_dim_,
                                   local_heads_, local_kv_heads_});
    expanded_ = true;
  }

  // The rotary embedding of the q and k heads of a projection (or its gradient's, backward).
  void rotate(matrix_view<T> m, rotation dir) {
    if (!rotary()) return;
    const auto table = detail::cview(rope_table_.view());
    if (fused()) { // q and k of head h at 3 h d and 3 h d + d
      detail::rotate_heads(gemm_, m, table,
                           {.first = 0, .heads = local_heads_, .stride = 3 * head_dim_}, dir);
      detail::rotate_heads(gemm_, m, table,
                           {.first = head_dim_, .heads = local_heads_, .stride = 3 * head_dim_},
                           dir);
    } else { // the q heads, then the k heads, d columns each
      detail::rotate_heads(
          gemm_, m, table,
          {.first = 0, .heads = local_heads_ + local_kv_heads_, .stride = head_dim_}, dir);
    }
  }

  // The (sequence, head) blocks, k = b * local_heads + h. The core takes `group_` of them at once
  // (a strided batch of GEMMs, a softmax over their stacked rows): with a policy that runs each
  // element-wise stage as a kernel (each_element: a device), one sequence's heads, so that its
  // launches do not grow with the heads; on the host one block (its scores stay in cache between
  // the GEMMs and the softmax). The same products and sums either way.
  static constexpr bool stages_as_kernels =
      detail::element_policy<Gemm, detail::causal_normalise<T>>;
  // A group's scratch (dP, and the probabilities when not kept) is group x seq x seq: as many of a
  // sequence's heads as keep it within 2^24 elements (64 MiB of float), at least one.
  static std::size_t group_size(std::size_t heads, std::size_t seq) {
    if (!stages_as_kernels) return 1;
    const std::size_t budget = std::size_t{1} << 24, square = seq * seq;
    std::size_t g = heads;
    while (g > 1 && (heads % g != 0 || g * square > budget))
      --g;
    return g;
  }
  [[nodiscard]] std::size_t blocks() const noexcept { return batch_ * local_heads_; }

  // Views of block k: q, k, v (seq x d) in the core's input (or its gradient), its context columns.
  matrix_view<T> part(matrix<T, space>& m, std::size_t k, std::size_t which) {
    return m.view()
        .rows_from(k / local_heads_ * seq_, seq_)
        .cols_from((3 * (k % local_heads_) + which) * head_dim_, head_dim_);
  }
  matrix_view<T> ctx_of(matrix<T, space>& m, std::size_t k) {
    return m.view()
        .rows_from(k / local_heads_ * seq_, seq_)
        .cols_from(k % local_heads_ * head_dim_, head_dim_);
  }
  // Block k's probabilities: kept, every block has its own; otherwise the group's are reused.
  matrix_view<T> probabilities(std::size_t k, bool kept) {
    return probs_.view().rows_from((kept ? k : k % group_) * seq_, seq_);
  }
  matrix_view<T> probabilities_of_group(std::size_t k0, bool kept) {
    return probs_.view().rows_from((kept ? k0 : 0) * seq_, group_ * seq_);
  }

  [[nodiscard]] T scale() const { return T{1} / std::sqrt(static_cast<T>(head_dim_)); }

  // A group's GEMMs, one per block from the views of its first: block k + 1's q, k, v sit 3 d
  // columns right of block k's (the same sequence's rows), its context d columns, its
  // probabilities and dP a seq x seq block further down.
  [[nodiscard]] std::size_t qkv_stride() const noexcept { return 3 * head_dim_; }
  [[nodiscard]] std::size_t square() const noexcept { return seq_ * seq_; }
  void batched(gemm_strides s, trans ta, trans tb, T alpha, matrix_view<T> a, matrix_view<T> b,
               matrix_view<T> c) {
    gemm_strided_batched(gemm_, group_, s, ta, tb, alpha, detail::cview(a), detail::cview(b), T{0},
                         c);
  }

  // The scaled scores Q K^T of the group from block k0, into p and the blocks below it (the softmax
  // makes them probabilities).
  void scores(std::size_t k0, matrix_view<T> p) {
    batched({qkv_stride(), qkv_stride(), square()}, trans::n, trans::t, scale(),
            part(core_input(), k0, 0), part(core_input(), k0, 1), p);
  }

  std::size_t hidden_;
  std::size_t heads_;
  std::size_t seq_;
  std::size_t head_dim_;
  std::size_t kv_heads_;
  std::size_t local_heads_;
  std::size_t local_kv_heads_;
  attention_options opt_;
  std::size_t group_ = group_size(local_heads_, seq_); // blocks the core takes at once
  Gemm gemm_;
  std::optional<qkv_layer> qkv_;         // the fused layout's input projection
  std::optional<grouped_layer> grouped_; // the grouped layout's
  out_layer out_;
  matrix<T, space> rope_table_; // rotary: seq x d, cos | sin (rotary.hpp)
  bool keep_probs_ = true;
  bool kept_probs_ = true;
  bool expanded_ = false; // qkv_heads_ holds the kept projection's copy
  std::size_t batch_ = 0;
  matrix<T, space> proj_, ctx_, probs_;       // kept between forward and backward
  matrix<T, space> qkv_heads_;                // grouped: proj_ in the core's layout (scratch)
  matrix<T, space> dctx_, dqkv_, dproj_, dp_; // backward's scratch
  detail::row_scratch<T, space> softmax_scratch_;
};

} // namespace weft::layer
