#pragma once
// Grouped-query attention's key/value heads on a tensor-parallel group (weft/layer/attention.hpp):
// which kv heads a rank holds, their expansion to the query heads and back, and the grouped
// layout's one-GEMM q/k/v projection.
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

namespace weft::layer::detail {

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

} // namespace weft::layer::detail
