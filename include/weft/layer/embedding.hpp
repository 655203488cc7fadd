#pragma once
// The vocabulary-parallel embedding: the vocab x hidden table split by rows (split_range of the
// vocabulary over the TP group). Each rank looks up the ids in its own range and writes zeros for
// the rest; the sum over the group (an all-reduce, or under sequence_parallel a reduce-scatter to
// the rank's tokens) then holds every token's row. backward scatters dy (sequence_parallel:
// all-gathered first) into the gradient rows of the ids in the local range.
//
//   weft::layer::vocab_parallel_embedding<float, Comm> emb(tp, 50257, 1024, seed, /*tensor id*/ 0);
//   emb.forward(ids, y);     // ids: every token; y: tokens x hidden (SP: tokens / tp rows)
//
// Exec says where the table and y live (exec.hpp): the host by default; with a device policy
// (cublas on the communicator's stream) both are device memory, the ids (always a host span,
// checked there) are copied to the device on the stream without the host waiting for it
// (layer/cuda/token_ids.cuh), and the lookup is one thread per element. The gradient on a device
// groups the tokens by id (CUB's stable radix sort of the ids with their token indices), then
// one thread per (id, column) adds that id's rows in token order (no atomics: the same sums, in
// the same order, as the host's token loop, whatever ids repeat).
#include <weft/core/config.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/init.hpp>
#include <weft/layer/linear.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

namespace detail {

/// part(t, c) = the table's row of token t's id where this rank holds it, else 0.
template <class T>
struct embedding_lookup {
  const std::int32_t* ids;
  matrix_view<const T> w;
  matrix_view<T> part;
  std::size_t begin;
  WEFT_HOST_DEVICE void operator()(std::size_t t, std::size_t c) const {
    const auto id = static_cast<std::size_t>(ids[t]);
    part(t, c) = id >= begin && id - begin < w.rows() ? w(id - begin, c) : T{};
  }
};

/// Column c of the table's gradient: dw(id_t, c) += g(t, c) for the local ids, tokens in order.
/// Called as (0, c).
template <class T>
struct embedding_grad_column {
  const std::int32_t* ids;
  std::size_t tokens;
  matrix_view<const T> g;
  matrix_view<T> dw;
  std::size_t begin;
  WEFT_HOST_DEVICE void operator()(std::size_t, std::size_t c) const {
    for (std::size_t t = 0; t < tokens; ++t)
      step(t, c);
  }
  WEFT_HOST_DEVICE void step(std::size_t t, std::size_t c) const {
    const auto id = static_cast<std::size_t>(ids[t]);
    if (id >= begin && id - begin < dw.rows()) dw(id - begin, c) += g(t, c);
  }
};

/// The ids and token indices of a device layer, sorted by id: detail::token_ids<device_space>
/// (<weft/layer/cuda/token_ids.cuh>, which the device policy's header includes); nothing on the
/// host, where the ids stay in the layer's vector.
template <class Space>
class token_ids;
template <>
class token_ids<host_space> {
public:
  void release() noexcept {} // nothing is held beside the layer's vector
};

/// The gradient of a run of equal ids, from the tokens sorted by id, stably (sorted_ids, and
/// positions: each one's token index). Called as (k, c) for every k < tokens: a k that starts a
/// run (the first, or a new id) adds, for column c, the run's rows of g in token order to dw's
/// row of that id where this rank holds it; any other k does nothing. The same additions in the
/// same order as embedding_grad_column's, so the same bits; runs write disjoint rows.
template <class T>
struct embedding_grad_run {
  const std::int32_t* sorted_ids;
  const std::int32_t* positions;
  std::size_t tokens;
  matrix_view<const T> g;
  matrix_view<T> dw;
  std::size_t begin;
  WEFT_HOST_DEVICE void operator()(std::size_t k, std::size_t c) const {
    const std::int32_t id = sorted_ids[k];
    if (k != 0 && sorted_ids[k - 1] == id) return;
    const auto row = static_cast<std::size_t>(id);
    if (row < begin || row - begin >= dw.rows()) return;
    T s = dw(row - begin, c);
    for (std::size_t j = k; j < tokens && sorted_ids[j] == id; ++j)
      s += g(static_cast<std::size_t>(positions[j]), c);
    dw(row - begin, c) = s;
  }
};

} // namespace detail

template <class T, communicator Comm, class SP = no_sequence_parallel, class Exec = host_policy>
class vocab_parallel_embedding {
public:
  using space = space_of<Exec>;

  vocab_parallel_embedding(Comm& tp, std::size_t vocab, std::size_t hidden, std::uint64_t seed,
                           std::uint64_t tensor_id, double init_std = 0.02, Exec exec = {})
      : tp_(&tp),
        vocab_(vocab),
        hidden_(hidden),
        range_(split_range(vocab, tp.size(), tp.rank())),
        exec_(std::move(exec)) {
    if (vocab == 0 || hidden == 0)
      throw error("vocab_parallel_embedding: vocab and hidden must be positive");
    detail::check_stream("vocab_parallel_embedding", exec_, tp);
    detail::resize(exec_, w_, range_.size(), hidden);
    detail::resize(exec_, dw_, range_.size(), hidden);
    detail::init_weight(exec_, w_, hidden, range_.begin, 0, seed, tensor_id, init_std);
  }

  [[nodiscard]] range vocab_range() const noexcept { return range_; }
  [[nodiscard]] std::size_t vocab() const noexcept { return vocab_; }
  [[nodiscard]] std::size_t hidden() const noexcept { return hidden_; }

  /// ids: every token's id, in [0, vocab). y: tokens x hidden (sequence_parallel: tokens / tp
  /// rows).
  void forward(std::span<const std::int32_t> ids, matrix_view<T> y) {
    static constexpr std::string_view who = "vocab_parallel_embedding::forward";
    const std::size_t tokens = ids.size();
    const std::size_t rows_out =
        SP::enabled ? detail::check_sequence_split(who, tokens, tp_->size()) : tokens;
    expect_shape(who, "y", y, rows_out, hidden_);
    for (std::size_t t = 0; t < tokens; ++t) {
      if (ids[t] < 0 || static_cast<std::size_t>(ids[t]) >= vocab_) {
        throw error(std::string(who) + ": token " + std::to_string(t) + " has id " +
                    std::to_string(ids[t]) + ", outside the vocabulary [0, " +
                    std::to_string(vocab_) + ")");
      }
    }
    ids_.assign(ids.begin(), ids.end());
    const std::int32_t* id_data = ids_.data();
    if constexpr (on_device<Exec>) {
      device_ids_.upload(ids_, exec_.stream());
      id_data = device_ids_.data();
    }
    detail::resize(exec_, part_, tokens, hidden_);
    detail::for_each_element(
        exec_, tokens, hidden_,
        detail::embedding_lookup<T>{id_data, w_.view(), part_.view(), range_.begin});
    if constexpr (SP::enabled) {
      detail::reduce_scatter_rows(exec_, *tp_, part_, y, staging_);
    } else {
      detail::all_reduce_into(exec_, *tp_, part_, y);
    }
    forwarded_ = true;
  }

  /// dy: like y. The table's gradient rows += dy rows of the tokens with local ids.
  void backward(matrix_view<const T> dy) {
    static constexpr std::string_view who = "vocab_parallel_embedding::backward";
    if (!forwarded_) throw error(std::string(who) + ": called before forward");
    const std::size_t tokens = ids_.size();
    expect_shape(who, "dy", dy,
                 SP::enabled ? tokens / static_cast<std::size_t>(tp_->size()) : tokens, hidden_);
    matrix_view<const T> g = dy;
    if constexpr (SP::enabled) {
      detail::gather_rows(exec_, *tp_, dy, dy_, staging_);
      g = detail::cview(dy_);
    }
    if constexpr (on_device<Exec>) {
      if (device_ids_.size() != tokens) { // restored from a stash: the ids are on the host only
        device_ids_.upload(ids_, exec_.stream());
      }
      device_ids_.group(vocab_, exec_.stream());
      detail::for_each_element(
          exec_, tokens, hidden_,
          detail::embedding_grad_run<T>{device_ids_.sorted_ids(), device_ids_.positions(), tokens,
                                        g, dw_.view(), range_.begin});
    } else { // token by token, for the cache; the same sums in the same order
      const detail::embedding_grad_column<T> grad{ids_.data(), tokens, g, dw_.view(), range_.begin};
      if constexpr (detail::element_policy<Exec, detail::embedding_grad_column<T>>) {
        detail::for_each_element(exec_, 1, hidden_, grad);
      } else {
        for (std::size_t t = 0; t < tokens; ++t)
          for (std::size_t c = 0; c < hidden_; ++c)
            grad.step(t, c);
      }
    }
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    return {{"weight", w_.view(), dw_.view(), false, false, range_.begin, 0, vocab_, hidden_, true,
             false, home_of(w_), home_of(dw_)}};
  }
  void zero_grad() { detail::zero(exec_, dw_); }

  /// What backward needs from forward (the ids), moved out and back (see linear.hpp).
  struct activations {
    weft::detail::tallied_vector<std::int32_t> ids;
    bool forwarded = false;
    [[nodiscard]] std::size_t bytes() const noexcept { return ids.size() * sizeof(std::int32_t); }
  };
  [[nodiscard]] activations stash() {
    device_ids_.release();
    return {std::exchange(ids_, {}), std::exchange(forwarded_, false)};
  }
  void restore(activations a) {
    device_ids_.release(); // backward copies the restored ids again
    ids_ = std::move(a.ids);
    forwarded_ = a.forwarded;
  }

  /// This rank's rows of the table: vocab_range().size() x hidden, in Exec's memory.
  [[nodiscard]] matrix_view<T> weight() noexcept { return w_.view(); }

private:
  Comm* tp_;
  std::size_t vocab_;
  std::size_t hidden_;
  range range_;
  Exec exec_;
  matrix<T, space> w_, dw_;
  weft::detail::tallied_vector<std::int32_t> ids_; // kept for backward (a stash carries them)
  detail::token_ids<space> device_ids_;            // a device policy's copy of ids_, grouped by id
  matrix<T, space> part_; // this rank's lookups, zeros elsewhere, before the reduction
  matrix<T, space> dy_;   // sequence_parallel: the gathered dy
  matrix<T, space> staging_;
  bool forwarded_ = false;
};

} // namespace weft::layer
