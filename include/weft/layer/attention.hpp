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
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t) const {
    stats(i, 1) = T{1} / lane_total(lanes, i);
  }
};

template <class T>
struct causal_normalise {
  matrix_view<T> s;
  matrix_view<const T> stats; // (i, 1): inv
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t j) const {
    s(i, j) = j <= causal_last(i, s.cols()) ? s(i, j) * stats(i, 1) : T{};
  }
};

/// Row-wise causal softmax in place, where the policy works.
template <class Exec, class T, class Space>
void causal_softmax(const Exec& exec, matrix_view<T> s, row_scratch<T, Space>& scratch) {
  scratch.reserve(exec, s.rows(), 1, 2); // one sum at a time; results: max, inverse sum
  const auto lanes = scratch.lanes.view();
  const auto stats = scratch.results.view();
  for_each_row_in_stages(
      exec, s.rows(),
      row_stage{row_lanes, lane_maxima<T>{s, lanes, std::numeric_limits<T>::lowest(), true}},
      row_stage{1, lane_maximum<T>{lanes, stats}},
      row_stage{row_lanes, causal_lane_exponentials<T>{s, stats, lanes}},
      row_stage{1, inverse_lane_sum<T>{lanes, stats}},
      row_stage{s.cols(), causal_normalise<T>{s, stats}});
}

// The softmax's backward, in place: dp(i, j) = p(i, j) (dp(i, j) - dot(i)) on the causal part, 0
// above it, with dot(i) = sum_j p(i, j) dp(i, j): 1. (i, l): lanes(i, l) = lane l's part of the
// dot; 2. (i, 0): dot(i), the lanes in order; 3. (i, j): dp.
template <class T>
struct causal_lane_dots {
  matrix_view<const T> p;
  matrix_view<const T> dp;
  matrix_view<T> lanes;
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t l) const {
    T dot{};
    const std::size_t last = causal_last(i, p.cols());
    for (std::size_t j = l; j <= last; j += row_lanes)
      dot += p(i, j) * dp(i, j);
    lanes(i, l) = dot;
  }
};

template <class T>
struct causal_softmax_gradient {
  matrix_view<const T> p;
  matrix_view<T> dp;
  matrix_view<const T> stats; // (i, 0): dot
  WEFT_HOST_DEVICE void operator()(std::size_t i, std::size_t j) const {
    dp(i, j) = j <= causal_last(i, p.cols()) ? p(i, j) * (dp(i, j) - stats(i, 0)) : T{};
  }
};

template <class Exec, class T, class Space>
void causal_softmax_backward(const Exec& exec, matrix_view<const T> p, matrix_view<T> dp,
                             row_scratch<T, Space>& scratch) {
  scratch.reserve(exec, p.rows(), 1, 2); // the forward's shape
  const auto lanes = scratch.lanes.view();
  const auto stats = scratch.results.view();
  for_each_row_in_stages(exec, p.rows(), row_stage{row_lanes, causal_lane_dots<T>{p, dp, lanes}},
                         row_stage{1, lane_sum<T>{lanes, stats}},
                         row_stage{dp.cols(), causal_softmax_gradient<T>{p, dp, stats}});
}

/// The key/value heads one rank of a TP group holds (grouped-query attention): a column split where
/// the group's size divides kv_heads, else (kv_heads divides it) one head, replicated on the
/// `replicas` consecutive ranks whose query heads use it.
struct kv_placement {
  std::size_t first = 0;    // the first kv head held
  std::size_t count = 0;    // how many
  std::size_t replicas = 1; // ranks holding each of them
  bool duplicate = false;   // a replica other than the first
  friend constexpr bool operator==(const kv_placement&, const kv_placement&) = default;
};
[[nodiscard]] constexpr kv_placement place_kv_heads(std::size_t kv_heads, std::size_t ranks,
                                                    std::size_t rank) noexcept {
  if (kv_heads % ranks == 0) return {rank * (kv_heads / ranks), kv_heads / ranks, 1, false};
  const std::size_t replicas = ranks / kv_heads;
  return {rank / replicas, 1, replicas, rank % replicas != 0};
}
static_assert(place_kv_heads(4, 2, 1) == kv_placement{2, 2, 1, false});
static_assert(place_kv_heads(2, 4, 0) == kv_placement{0, 1, 2, false});
static_assert(place_kv_heads(2, 4, 3) == kv_placement{1, 1, 2, true});
static_assert(place_kv_heads(1, 2, 1) == kv_placement{0, 1, 2, true});

// The grouped layout's projection (q | k | v: local query heads, then local kv heads' keys, then
// their values, d columns each) copied to the fused one the core reads (q, k, v of each local query
// head side by side, 3 d columns a head), each query head with its kv head's k and v.
template <class T>
struct expand_kv_heads {
  matrix_view<const T> proj;
  matrix_view<T> heads;
  std::size_t d, local_heads, local_kv;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    const std::size_t h = c / (3 * d), which = c % (3 * d) / d, e = c % d;
    const std::size_t kv = h / (local_heads / local_kv);
    heads(r, c) =
        proj(r, which == 0 ? h * d + e : (local_heads + (which - 1) * local_kv + kv) * d + e);
  }
};

// The way back for gradients: dq copied, each kv head's dk and dv the sum of its query heads' (in
// head order).
template <class T>
struct collapse_kv_heads {
  matrix_view<const T> heads;
  matrix_view<T> proj;
  std::size_t d, local_heads, local_kv;
  WEFT_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    const std::size_t e = c % d;
    if (c < local_heads * d) {
      proj(r, c) = heads(r, 3 * (c / d) * d + e);
      return;
    }
    const std::size_t rest = c - local_heads * d, which = 1 + rest / (local_kv * d),
                      kv = rest % (local_kv * d) / d;
    const std::size_t per_kv = local_heads / local_kv;
    T sum{};
    for (std::size_t h = kv * per_kv; h < (kv + 1) * per_kv; ++h)
      sum += heads(r, (3 * h + which) * d + e);
    proj(r, c) = sum;
  }
};

/// dst = a host matrix, in the policy's memory.
template <class Gemm, class T, class Space>
void upload(const Gemm& g, const matrix<T>& host, matrix<T, Space>& dst) {
  if constexpr (on_device<Gemm>) {
    dst.copy_from(host.view(), g.stream());
  } else {
    assign(g, dst, host.view());
  }
}

// The grouped layout's input projection: this rank's q, k and v rows in one weight (one GEMM, one
// input copy kept, one reduction of dx, as the fused layout has), exposed as the parameters "q.*",
// "k.*" and "v.*". Column-parallel: sequence_parallel gathers the input rows first and reduce-
// scatters dx.
template <class T, communicator Comm, class Gemm, class SP>
class grouped_qkv_projection : public linear_state<T, Gemm> {
  static_assert(gemm_for<Gemm, T>,
                "weft: parallel_attention: Gemm must be a GEMM policy for T (gemm.hpp)");
  using state = linear_state<T, Gemm>;
  using state::b_, state::db_, state::db_lanes_, state::dw_, state::forwarded_, state::gemm_,
      state::w_, state::x_;
  using space = typename state::space;

public:
  grouped_qkv_projection(Comm& tp, std::size_t hidden, std::size_t heads, std::size_t kv_heads,
                         std::size_t d, std::uint64_t seed, std::uint64_t tensor_id, bool bias,
                         double init_std, Gemm gemm)
      : state(std::move(gemm), rows_of(tp, heads, kv_heads, d), hidden, bias,
              rows_of(tp, heads, kv_heads, d)),
        tp_(&tp),
        hidden_(hidden),
        heads_(heads),
        kv_heads_(kv_heads),
        d_(d),
        q_(split_range(heads * d, tp.size(), tp.rank())),
        kv_(place_kv_heads(kv_heads, static_cast<std::size_t>(tp.size()),
                           static_cast<std::size_t>(tp.rank()))),
        bias_(bias) {
    this->check_stream("parallel_attention", tp);
    // The rows of the stacked full tensor [q; k; v] that this rank holds, drawn where they sit
    // there.
    matrix<T> w(w_.rows(), hidden);
    const std::size_t kv_rows = kv_.count * d;
    init_normal(w.view().rows_from(0, q_.size()), hidden, q_.begin, 0, seed, tensor_id, init_std);
    init_normal(w.view().rows_from(q_.size(), kv_rows), hidden, (heads + kv_.first) * d, 0, seed,
                tensor_id, init_std);
    init_normal(w.view().rows_from(q_.size() + kv_rows, kv_rows), hidden,
                (heads + kv_heads + kv_.first) * d, 0, seed, tensor_id, init_std);
    upload(gemm_, w, w_);
  }

  [[nodiscard]] std::size_t out_local() const noexcept { return w_.rows(); }
  [[nodiscard]] const kv_placement& kv() const noexcept { return kv_; }

  /// x: tokens x hidden (sequence_parallel: this rank's rows); y: tokens x out_local(), q | k | v.
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    static constexpr std::string_view who = "parallel_attention: q, k, v projection forward";
    if (x.cols() != hidden_)
      ::weft::detail::shape_error(who, "x", x.rows(), x.cols(), x.rows(), hidden_);
    const std::size_t tokens =
        SP::enabled ? x.rows() * static_cast<std::size_t>(tp_->size()) : x.rows();
    expect_shape(who, "y", y, tokens, out_local());
    forwarded_ = false;
    if constexpr (SP::enabled) {
      gather_rows(gemm_, *tp_, x, x_, staging_);
    } else {
      assign(gemm_, x_, x);
    }
    forwarded_ = true;
    gemm_(trans::n, trans::t, T{1}, cview(x_), cview(w_), T{0}, y);
    if (bias_) add_row_vector(gemm_, y, b_);
  }

  /// dy: like y. dx: like x, summed over the group (sequence_parallel: reduce-scattered). Weight
  /// and bias gradients accumulate; a replicated kv head's get this pass's sum over its replicas.
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    static constexpr std::string_view who = "parallel_attention: q, k, v projection backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t tokens = x_.rows();
    expect_shape(who, "dy", dy, tokens, out_local());
    expect_shape(who, "dx", dx,
                 SP::enabled ? tokens / static_cast<std::size_t>(tp_->size()) : tokens, hidden_);
    if (kv_.replicas == 1) {
      gemm_(trans::t, trans::n, T{1}, dy, cview(x_), T{1}, dw_.view());
      if (bias_) accumulate_column_sums(gemm_, dy, db_, db_lanes_);
    } else {
      const std::size_t q = q_.size();
      gemm_(trans::t, trans::n, T{1}, dy.cols_from(0, q), cview(x_), T{1},
            dw_.view().rows_from(0, q));
      if (bias_) column_sums_into(dy.cols_from(0, q), db_.view().cols_from(0, q));
      sum_over_replicas(dy.cols_from(q, dy.cols() - q));
    }
    resize(gemm_, dx_, tokens, hidden_);
    gemm_(trans::n, trans::n, T{1}, dy, cview(w_), T{0}, dx_.view());
    if constexpr (SP::enabled) {
      reduce_scatter_rows(gemm_, *tp_, dx_, dx, staging_);
    } else {
      all_reduce_into(gemm_, *tp_, dx_, dx);
    }
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    const std::size_t q = q_.size(), kv_rows = kv_.count * d_, kv0 = kv_.first * d_;
    const auto weight = [&](const char* name, std::size_t at, std::size_t rows, std::size_t row0,
                            std::size_t full, bool duplicate) {
      return parameter<T>{.name = name,
                          .value = w_.view().rows_from(at, rows),
                          .grad = dw_.view().rows_from(at, rows),
                          .replicated = false,
                          .sequence_partial = false,
                          .row0 = row0,
                          .col0 = 0,
                          .full_rows = full,
                          .full_cols = hidden_,
                          .decay = true,
                          .duplicate = duplicate,
                          .value_home = home_of(w_, at * hidden_),
                          .grad_home = home_of(dw_, at * hidden_)};
    };
    const auto bias = [&](const char* name, std::size_t at, std::size_t cols, std::size_t col0,
                          std::size_t full, bool duplicate) {
      return parameter<T>{.name = name,
                          .value = b_.view().cols_from(at, cols),
                          .grad = db_.view().cols_from(at, cols),
                          .replicated = false,
                          .sequence_partial = false,
                          .row0 = 0,
                          .col0 = col0,
                          .full_rows = 1,
                          .full_cols = full,
                          .decay = false,
                          .duplicate = duplicate,
                          .value_home = home_of(b_, at),
                          .grad_home = home_of(db_, at)};
    };
    std::vector<parameter<T>> ps;
    ps.push_back(weight("q.weight", 0, q, q_.begin, heads_ * d_, false));
    if (bias_) ps.push_back(bias("q.bias", 0, q, q_.begin, heads_ * d_, false));
    ps.push_back(weight("k.weight", q, kv_rows, kv0, kv_heads_ * d_, kv_.duplicate));
    if (bias_) ps.push_back(bias("k.bias", q, kv_rows, kv0, kv_heads_ * d_, kv_.duplicate));
    ps.push_back(weight("v.weight", q + kv_rows, kv_rows, kv0, kv_heads_ * d_, kv_.duplicate));
    if (bias_)
      ps.push_back(bias("v.bias", q + kv_rows, kv_rows, kv0, kv_heads_ * d_, kv_.duplicate));
    return ps;
  }

private:
  static std::size_t rows_of(const Comm& tp, std::size_t heads, std::size_t kv_heads,
                             std::size_t d) {
    const auto p = static_cast<std::size_t>(tp.size());
    return (heads / p +
            2 * place_kv_heads(kv_heads, p, static_cast<std::size_t>(tp.rank())).count) *
           d;
  }

  // out(0, c) = the column sums of dy (sum_rows_by_lanes, as the linear layers' bias gradient).
  void column_sums_into(matrix_view<const T> dy, matrix_view<T> out) {
    reshape(gemm_, db_lanes_, row_lanes, dy.cols());
    sum_rows_by_lanes(gemm_, dy.rows(), dy.cols(), column_sums<T>{dy, out, db_lanes_.view()});
  }

  // A replicated kv head's weight (and bias) gradient from this pass, dkv: tokens x 2 d (its k, v
  // columns), summed over its replicas and added to the accumulated one. Each kv head has a slot
  // of a buffer over all of them, zero on the ranks that do not hold it, and one all-reduce over
  // the TP group sums every slot at once, on the group's own stream (a communicator split off it
  // would run on a stream of its own on a device, unordered with this one's GEMMs). Only this
  // pass's part is reduced: the accumulated gradient already holds the earlier passes' sums.
  void sum_over_replicas(matrix_view<const T> dkv) {
    const std::size_t rows = dkv.cols(), slot = rows * hidden_ + (bias_ ? rows : 0);
    resize(gemm_, replica_sums_, kv_heads_, slot); // zero-filled
    T* const mine = replica_sums_.view().rows_from(kv_.first, 1).data();
    const matrix_view<T> w(mine, rows, hidden_);
    gemm_(trans::t, trans::n, T{1}, dkv, cview(x_), T{0}, w);
    const matrix_view<T> b(bias_ ? mine + rows * hidden_ : nullptr, bias_ ? 1 : 0, rows);
    if (bias_) column_sums_into(dkv, b);
    all_reduce(*tp_, flat_of(replica_sums_));
    const std::size_t q = q_.size();
    for_each_element(gemm_, rows, hidden_, add_element<T>{dw_.view().rows_from(q, rows), cview(w)});
    if (bias_)
      for_each_element(gemm_, 1, rows, add_element<T>{db_.view().cols_from(q, rows), cview(b)});
  }

  Comm* tp_;
  std::size_t hidden_, heads_, kv_heads_, d_;
  range q_; // this rank's rows of the full q
  kv_placement kv_;
  bool bias_;
  matrix<T, space> dx_;           // dx before its reduction
  matrix<T, space> replica_sums_; // kv_heads x (2 d x hidden + 2 d): one slot a kv head
  matrix<T, space> staging_;
};

} // namespace detail

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
