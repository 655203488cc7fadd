#pragma once
// A layer's parameters as the optimizer and the tests see them: the rank's shard of each weight
// and its gradient, as host views of the same shape, with what a data-parallel or sequence-
// parallel reduction needs to know about it.
//
//   for (auto& p : mlp.parameters()) sgd_step(p.value, p.grad, lr);
//   weft::layer::reduce_sequence_parallel_grads(tp, std::span(params));  // under sequence_parallel
//
// A replicated parameter (LayerNorm's gamma and beta, the row-parallel bias) is the same on every
// TP rank. Under sequence parallelism each rank sees only its own tokens, so such a parameter's
// gradient is a partial sum over the rank's rows (sequence_partial) and must be summed over the
// TP group before the optimizer step; reduce_sequence_parallel_grads does that in one all-reduce.
#include <weft/comm/all_reduce.hpp>
#include <weft/comm/communicator.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/matrix.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace weft::layer {

/// Where a parameter's value or gradient lives in its layer: the matrix that owns it (type-erased)
/// and the parameter's offset in it, so that a trainer can put the matrix into its own flat
/// buffers (matrix::bind) and the layer computes there, with nothing copied. Empty where the
/// memory cannot be moved (a matrix type without bind).
struct storage_home {
  void* owner = nullptr;
  void (*bind)(void* owner, void* data) = nullptr;
  const void* base =
      nullptr; // the matrix's elements when the home was made (the view's start - offset)
  std::size_t offset = 0;   // elements from the matrix's start
  std::size_t elements = 0; // the whole matrix's
  [[nodiscard]] explicit operator bool() const noexcept { return owner != nullptr; }
};

/// The home of a parameter at element `offset` of matrix m.
template <class M>
[[nodiscard]] storage_home home_of(M& m, std::size_t offset = 0) {
  using V = typename M::value_type;
  if constexpr (requires(V * p) { m.bind(p); }) {
    return {&m, [](void* o, void* d) { static_cast<M*>(o)->bind(static_cast<V*>(d)); }, m.data(),
            offset, m.size()};
  } else {
    return {};
  }
}

template <class T>
struct parameter {
  std::string name;
  matrix_view<T> value;
  matrix_view<T> grad;
  bool replicated = false; // the same on every TP rank
  bool sequence_partial =
      false; // grad is a partial sum over this rank's rows (sequence parallelism)
  // Where the shard sits in the full (unsplit) tensor: rows [row0, row0 + value.rows()) and
  // columns [col0, col0 + value.cols()) of a full_rows x full_cols matrix. For checkpoints that
  // reshard, and for comparing a split model with the unsplit one.
  std::size_t row0 = 0;
  std::size_t col0 = 0;
  std::size_t full_rows = 0;
  std::size_t full_cols = 0;
  // Whether weight decay applies: the matrices of linears and, as the model chooses, embedding
  // tables; not biases or norm weights (Megatron's and nanoGPT's default parameter groups).
  bool decay = true;
  // Another rank of the TP group holds the same slice and counts it (a key/value head replicated
  // over the ranks whose query heads use it): a norm over the group leaves this copy out.
  bool duplicate = false;
  // The matrices value and grad live in (storage_home): for a trainer that moves them.
  storage_home value_home = {};
  storage_home grad_home = {};
};

/// Sums over the TP group the gradients of the parameters marked sequence_partial, packed into one
/// all-reduce, in the policy's memory (exec.hpp: device views for a device policy). Every rank of
/// `tp` must pass the same parameters in the same order. No call when none is marked.
/// `buf` is the packing buffer, kept by the caller between steps (on a device, so that no step
/// allocates and frees device memory: cudaMalloc and cudaFree synchronize).
template <class Exec, class T, communicator Comm>
void reduce_sequence_parallel_grads(const Exec& exec, Comm& tp, std::span<parameter<T>> ps,
                                    matrix<T, space_of<Exec>>& buf) {
  std::size_t n = 0;
  for (const auto& p : ps) {
    if (p.sequence_partial) n += p.grad.size();
  }
  if (n == 0 || tp.size() == 1) return;
  detail::resize(exec, buf, 1, n);
  const auto packed = [&](const parameter<T>& p, std::size_t at) {
    return matrix_view<T>(buf.data() + at, p.grad.rows(), p.grad.cols());
  };
  std::size_t at = 0;
  for (const auto& p : ps) {
    if (!p.sequence_partial) continue;
    detail::copy_view(exec, matrix_view<const T>(p.grad), packed(p, at));
    at += p.grad.size();
  }
  all_reduce(tp, detail::flat_of(buf));
  at = 0;
  for (const auto& p : ps) {
    if (!p.sequence_partial) continue;
    detail::copy_view(exec, matrix_view<const T>(packed(p, at)), p.grad);
    at += p.grad.size();
  }
}

template <class T, communicator Comm>
void reduce_sequence_parallel_grads(Comm& tp, std::span<parameter<T>> ps) {
  matrix<T> buf;
  reduce_sequence_parallel_grads(host_policy{}, tp, ps, buf);
}

template <class T, communicator Comm>
void reduce_sequence_parallel_grads(Comm& tp, std::vector<parameter<T>>& ps) {
  reduce_sequence_parallel_grads(tp, std::span<parameter<T>>(ps));
}

} // namespace weft::layer
