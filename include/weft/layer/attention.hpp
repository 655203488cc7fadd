#pragma once
// Causal self-attention split over the heads of a tensor-parallel group (Megatron-style):
//
//   qkv = column_parallel(x)            this rank's heads: [q | k | v] of each, head after head
//   ctx_h = softmax(q_h k_h^T / sqrt(d) + causal mask) v_h        for every local head h, no communication
//   y = row_parallel(ctx)               all-reduce (sequence_parallel: reduce-scatter)
//
// Tokens are rows, sequence by sequence: row b * seq + s is position s of sequence b, so a batch of
// `batch` sequences is batch * seq rows (sequence_parallel: the group's ranks hold consecutive
// blocks of those rows). The full QKV weight is 3 * hidden x hidden, with head h's query, key and
// value rows at [3 h d, 3 h d + 3 d): a column split at head boundaries then gives each rank whole
// heads, and the same full weight at every TP size. heads must divide by the TP size.
//
// The attention core keeps the softmax probabilities (batch x local heads x seq x seq) for its
// backward unless told not to (keep_probabilities(false): selective recompute, recompute.hpp),
// in which case backward recomputes them from the kept q, k and v.
//
// With a device GEMM policy (cublas on the communicator's stream) all of it lives in device memory:
// the softmax and its backward are row stages (exec.hpp: a thread per row and lane, the lanes summed in
// a fixed order, the host's terms in the host's order) over all of one sequence's heads at once, and
// each of the core's products is one strided batched cuBLAS GEMM over those heads (gemm.hpp,
// gemm_strided_batched): launches per sequence, not per head.
#include <weft/comm/communicator.hpp>
#include <weft/core/config.hpp>
#include <weft/core/error.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/gemm.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace weft::layer {

namespace detail {

// The causal softmax of the scores s, in place: s is a stack of seq x seq blocks (exec.hpp,
// causal_last), row i's causal part is j <= last = causal_last(i, seq) and the rest is masked to 0.
// In stages (exec.hpp, for_each_row_in_stages) with a row_scratch of one way and two results:
//   1. (i, l): lanes(i, l) = the largest s(i, j) of lane l's causal columns (lowest if it has none)
//   2. (i, 0): top(i) = the largest of the lanes
//   3. (i, l): s(i, j) = exp(s(i, j) - top) on lane l's causal columns; lanes(i, l) = their sum
//   4. (i, 0): inv(i) = 1 / the sum of the lanes, in order
//   5. (i, j): s(i, j) *= inv on the causal part, 0 above it
template <class T>
struct causal_lane_exponentials {
  matrix_view<T> s;
  matrix_view<const T> stats;
  matrix_view<T> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t l) const {
    const T top = stats(i, 0);
    T sum{};
    const std::size_t last = causal_last(i, s.cols());
    for (std::size_t j = l; j <= last; j += row_lanes) {
      s(i, j) = std::exp(s(i, j) - top);
      sum += s(i, j);
    }
    lanes(i, l) = sum;
  }
};

/// stats(i, 1) = 1 / the sum of the lanes, in order.
template <class T>
struct inverse_lane_sum {
  matrix_view<const T> lanes;
  matrix_view<T> stats;
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t) const { stats(i, 1) = T{1} / lane_total(lanes, i); }
};

template <class T>
struct causal_normalise {
  matrix_view<T> s;
  matrix_view<const T> stats;  // (i, 1): inv
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t j) const {
    s(i, j) = j <= causal_last(i, s.cols()) ? s(i, j) * stats(i, 1) : T{};
  }
};

/// Row-wise causal softmax in place, where the policy works.
template <class Exec, class T, class Space>
void causal_softmax(const Exec& exec, matrix_view<T> s, row_scratch<T, Space>& scratch) {
  scratch.reserve(exec, s.rows(), 1, 2);  // one sum at a time; results: max, inverse sum
  const auto lanes = scratch.lanes.view();
  const auto stats = scratch.results.view();
  for_each_row_in_stages(exec, s.rows(),
                         row_stage{row_lanes, lane_maxima<T>{s, lanes, std::numeric_limits<T>::lowest(), true}},
                         row_stage{1, lane_maximum<T>{lanes, stats}},
                         row_stage{row_lanes, causal_lane_exponentials<T>{s, stats, lanes}},
                         row_stage{1, inverse_lane_sum<T>{lanes, stats}},
                         row_stage{s.cols(), causal_normalise<T>{s, stats}});
}

// The softmax's backward, in place: dp(i, j) = p(i, j) (dp(i, j) - dot(i)) on the causal part, 0
// above it, with dot(i) = sum_j p(i, j) dp(i, j): 1. (i, l): lanes(i, l) = lane l's part of the dot;
// 2. (i, 0): dot(i), the lanes in order; 3. (i, j): dp.
template <class T>
struct causal_lane_dots {
  matrix_view<const T> p;
  matrix_view<const T> dp;
  matrix_view<T> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t l) const {
    T dot{};
    const std::size_t last = causal_last(i, p.cols());
    for (std::size_t j = l; j <= last; j += row_lanes) dot += p(i, j) * dp(i, j);
    lanes(i, l) = dot;
  }
};

template <class T>
struct causal_softmax_gradient {
  matrix_view<const T> p;
  matrix_view<T> dp;
  matrix_view<const T> stats;  // (i, 0): dot
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t j) const {
    dp(i, j) = j <= causal_last(i, p.cols()) ? p(i, j) * (dp(i, j) - stats(i, 0)) : T{};
  }
};

template <class Exec, class T, class Space>
void causal_softmax_backward(const Exec& exec, matrix_view<const T> p, matrix_view<T> dp, row_scratch<T, Space>& scratch) {
  scratch.reserve(exec, p.rows(), 1, 2);  // the forward's shape
  const auto lanes = scratch.lanes.view();
  const auto stats = scratch.results.view();
  for_each_row_in_stages(exec, p.rows(), row_stage{row_lanes, causal_lane_dots<T>{p, dp, lanes}},
                         row_stage{1, lane_sum<T>{lanes, stats}},
                         row_stage{dp.cols(), causal_softmax_gradient<T>{p, dp, stats}});
}

} // namespace detail

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel>
class parallel_attention {
public:
  using qkv_layer = column_parallel_linear<T, Comm, Gemm, SP>;
  using out_layer = row_parallel_linear<T, Comm, Gemm, SP>;
  using space = space_of<Gemm>;  // where q, k, v, the probabilities and the context live

  /// Tensor ids tensor_id (QKV) and tensor_id + 1 (output projection).
  parallel_attention(Comm& tp, std::size_t hidden, std::size_t heads, std::size_t seq, std::uint64_t seed,
                     std::uint64_t tensor_id, Gemm gemm = {})
      : hidden_(hidden), heads_(heads), seq_(seq), head_dim_(checked_head_dim(tp, hidden, heads, seq)),
        local_heads_(heads / static_cast<std::size_t>(tp.size())), gemm_(gemm),
        qkv_(tp, hidden, 3 * hidden, seed, tensor_id, {}, gemm), out_(tp, hidden, hidden, seed, tensor_id + 1, {}, gemm) {}

  [[nodiscard]] std::size_t local_heads() const noexcept { return local_heads_; }
  [[nodiscard]] std::size_t head_dim() const noexcept { return head_dim_; }
  [[nodiscard]] std::size_t sequence() const noexcept { return seq_; }
  qkv_layer& qkv() noexcept { return qkv_; }
  out_layer& out() noexcept { return out_; }

  /// Selective recompute keeps no probabilities and recomputes them in backward.
  void keep_probabilities(bool keep) noexcept { keep_probs_ = keep; }

  /// x, y: tokens x hidden (sequence_parallel: this rank's rows).
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    // Every shape is checked before the projections keep anything for backward.
    static constexpr std::string_view who = "parallel_attention::forward";
    if (x.cols() != qkv_.in_features()) {
      ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), qkv_.in_features());
    }
    expect_shape(who, "y", y, x.rows(), out_.out_features());
    const std::size_t tokens = SP::enabled ? x.rows() * static_cast<std::size_t>(qkv_.comm().size()) : x.rows();
    if (tokens % seq_ != 0) {
      throw error("parallel_attention::forward: " + std::to_string(tokens) + " tokens are not whole sequences of " +
                  std::to_string(seq_));
    }
    batch_ = tokens / seq_;
    detail::resize(gemm_, qkv_out_, tokens, qkv_.out_local());
    qkv_.forward(x, qkv_out_.view());
    detail::resize(gemm_, ctx_, tokens, local_heads_ * head_dim_);
    detail::resize(gemm_, probs_, (keep_probs_ ? blocks() : group_) * seq_, seq_);
    for (std::size_t k0 = 0; k0 < blocks(); k0 += group_) {
      scores(k0, probabilities(k0, keep_probs_));
      detail::causal_softmax(gemm_, probabilities_of_group(k0, keep_probs_), softmax_scratch_);
      // ctx_k = P_k V_k
      batched({square(), qkv_stride(), head_dim_}, trans::n, trans::n, T{1}, probabilities(k0, keep_probs_),
              part(qkv_out_, k0, 2), ctx_of(ctx_, k0));
    }
    kept_probs_ = keep_probs_;
    out_.forward(detail::cview(ctx_.view()), y);
  }

  /// dy: like y; dx: like x.
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    const std::size_t tokens = batch_ * seq_;
    detail::resize(gemm_, dctx_, tokens, local_heads_ * head_dim_);
    out_.backward(dy, dctx_.view());
    detail::resize(gemm_, dqkv_, tokens, qkv_.out_local());
    detail::reshape(gemm_, dp_, group_ * seq_, seq_);  // every element written (dP) before it is read
    if (!kept_probs_) detail::reshape(gemm_, probs_, group_ * seq_, seq_);
    // With P the probabilities and dO the context's gradient:
    //   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),  dQ = scale dS K,  dK = scale dS^T Q.
    for (std::size_t k0 = 0; k0 < blocks(); k0 += group_) {
      if (!kept_probs_) {  // selective recompute: the group's probabilities again
        scores(k0, probabilities(k0, false));
        detail::causal_softmax(gemm_, probabilities_of_group(k0, false), softmax_scratch_);
      }
      const auto p = probabilities(k0, kept_probs_);
      const auto d_out = ctx_of(dctx_, k0);
      const auto ds = dp_.view().rows_from(0, seq_);  // dP, then dS, of the group's first block
      batched({square(), head_dim_, qkv_stride()}, trans::t, trans::n, T{1}, p, d_out, part(dqkv_, k0, 2));
      batched({head_dim_, qkv_stride(), square()}, trans::n, trans::t, T{1}, d_out, part(qkv_out_, k0, 2), ds);
      detail::causal_softmax_backward(gemm_, detail::cview(probabilities_of_group(k0, kept_probs_)), dp_.view(),
                                      softmax_scratch_);
      batched({square(), qkv_stride(), qkv_stride()}, trans::n, trans::n, scale(), ds, part(qkv_out_, k0, 1),
              part(dqkv_, k0, 0));
      batched({square(), qkv_stride(), qkv_stride()}, trans::t, trans::n, scale(), ds, part(qkv_out_, k0, 0),
              part(dqkv_, k0, 1));
    }
    qkv_.backward(detail::cview(dqkv_.view()), dx);
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    auto ps = prefixed("qkv.", qkv_.parameters());
    for (auto& p : prefixed("out.", out_.parameters())) ps.push_back(std::move(p));
    return ps;
  }
  void zero_grad() {
    qkv_.zero_grad();
    out_.zero_grad();
  }

  /// Bytes kept from forward for backward: q, k, v, the context, the probabilities unless
  /// selective recompute dropped them, and the two linear layers' input copies. release() frees
  /// them all; backward then needs a new forward (full recompute).
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return (qkv_out_.size() + ctx_.size() + (kept_probs_ ? probs_.size() : 0)) * sizeof(T) + qkv_.saved_bytes() +
           out_.saved_bytes();
  }
  void release() {
    qkv_.release();
    out_.release();
    qkv_out_ = {};
    ctx_ = {};
    probs_ = {};
    softmax_scratch_.release();
  }

  /// What backward needs from forward, moved out and back (see linear.hpp).
  struct activations {
    typename qkv_layer::activations qkv;
    typename out_layer::activations out;
    matrix<T, space> qkv_out, ctx, probs;
    std::size_t batch = 0;
    bool kept_probs = true;
  };
  [[nodiscard]] activations stash() {
    // Probabilities not kept are the layer's scratch, not the micro-batch's: they stay.
    return {qkv_.stash(),
            out_.stash(),
            std::exchange(qkv_out_, {}),
            std::exchange(ctx_, {}),
            kept_probs_ ? std::exchange(probs_, {}) : matrix<T, space>{},
            batch_,
            kept_probs_};
  }
  void restore(activations a) {
    qkv_.restore(std::move(a.qkv));
    out_.restore(std::move(a.out));
    qkv_out_ = std::move(a.qkv_out);
    ctx_ = std::move(a.ctx);
    if (a.kept_probs) probs_ = std::move(a.probs);
    batch_ = a.batch;
    kept_probs_ = a.kept_probs;
  }

private:
  static std::size_t checked_head_dim(const Comm& tp, std::size_t hidden, std::size_t heads, std::size_t seq) {
    if (heads == 0 || hidden % heads != 0) {
      throw error("parallel_attention: hidden " + std::to_string(hidden) + " does not divide into " +
                  std::to_string(heads) + " heads");
    }
    if (heads % static_cast<std::size_t>(tp.size()) != 0) {
      throw error("parallel_attention: " + std::to_string(heads) + " heads do not divide over a tensor-parallel group of " +
                  std::to_string(tp.size()));
    }
    if (seq == 0) throw error("parallel_attention: the sequence length must be positive");
    return hidden / heads;
  }

  static std::vector<parameter<T>> prefixed(const char* prefix, std::vector<parameter<T>> ps) {
    for (auto& p : ps) p.name = prefix + p.name;
    return ps;
  }

  // The (sequence, head) blocks, k = b * local_heads + h. The core takes `group_` of them at once
  // (a strided batch of GEMMs, a softmax over their stacked rows): with a policy that runs each
  // element-wise stage as a kernel (each_element: a device), one sequence's heads, so that its
  // launches do not grow with the heads; on the host one block (its scores stay in cache between
  // the GEMMs and the softmax). The same products and sums either way.
  static constexpr bool stages_as_kernels = detail::element_policy<Gemm, detail::causal_normalise<T>>;
  // A group's scratch (dP, and the probabilities when not kept) is group x seq x seq: as many of a
  // sequence's heads as keep it within 2^24 elements (64 MiB of float), at least one.
  static std::size_t group_size(std::size_t heads, std::size_t seq) {
    if (!stages_as_kernels) return 1;
    const std::size_t budget = std::size_t{1} << 24, square = seq * seq;
    std::size_t g = heads;
    while (g > 1 && (heads % g != 0 || g * square > budget)) --g;
    return g;
  }
  [[nodiscard]] std::size_t blocks() const noexcept { return batch_ * local_heads_; }

  // Views of block k: q, k, v (seq x d) in the QKV output, its context columns.
  matrix_view<T> part(matrix<T, space>& m, std::size_t k, std::size_t which) {
    return m.view().rows_from(k / local_heads_ * seq_, seq_).cols_from((3 * (k % local_heads_) + which) * head_dim_, head_dim_);
  }
  matrix_view<T> ctx_of(matrix<T, space>& m, std::size_t k) {
    return m.view().rows_from(k / local_heads_ * seq_, seq_).cols_from(k % local_heads_ * head_dim_, head_dim_);
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
  void batched(gemm_strides s, trans ta, trans tb, T alpha, matrix_view<T> a, matrix_view<T> b, matrix_view<T> c) {
    gemm_strided_batched(gemm_, group_, s, ta, tb, alpha, detail::cview(a), detail::cview(b), T{0}, c);
  }

  // The scaled scores Q K^T of the group from block k0, into p and the blocks below it (the softmax
  // makes them probabilities).
  void scores(std::size_t k0, matrix_view<T> p) {
    batched({qkv_stride(), qkv_stride(), square()}, trans::n, trans::t, scale(), part(qkv_out_, k0, 0),
            part(qkv_out_, k0, 1), p);
  }

  std::size_t hidden_;
  std::size_t heads_;
  std::size_t seq_;
  std::size_t head_dim_;
  std::size_t local_heads_;
  std::size_t group_ = group_size(local_heads_, seq_);  // blocks the core takes at once
  Gemm gemm_;
  qkv_layer qkv_;
  out_layer out_;
  bool keep_probs_ = true;
  bool kept_probs_ = true;
  std::size_t batch_ = 0;
  matrix<T, space> qkv_out_, ctx_, probs_;  // kept between forward and backward
  matrix<T, space> dctx_, dqkv_, dp_;       // backward's scratch
  detail::row_scratch<T, space> softmax_scratch_;
};

} // namespace weft::layer
