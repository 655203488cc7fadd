#pragma once
// The tensor-parallel MLP of a transformer block: column-parallel (hidden -> ffn, output left
// split) -> GELU on the rank's ffn columns -> row-parallel (ffn -> hidden). The GELU needs no
// communication because each rank holds whole columns of the intermediate activation, so the
// block costs one all-reduce forward and one backward (sequence_parallel: an all-gather and a
// reduce-scatter each way).
//
//   weft::layer::parallel_mlp<float, Comm> mlp(tp, 1024, 4096, seed, /*tensor ids*/ 10);  // 10, 11
//   mlp.forward(x, y);      // x, y: tokens x hidden (sequence_parallel: this rank's rows)
//   mlp.backward(dy, dx);
//
// With a device GEMM policy (cublas on the communicator's stream) everything lives in device
// memory and runs on that stream: the views passed in and out are device views.
#include <weft/layer/activation.hpp>
#include <weft/layer/linear.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace weft::layer {

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel>
class parallel_mlp {
public:
  using column_type = column_parallel_linear<T, Comm, Gemm, SP>;
  using row_type = row_parallel_linear<T, Comm, Gemm, SP>;
  using space = space_of<Gemm>; // where the weights and activations live

  /// Initialisation: fc1's weight N(0, init_std^2), fc2's N(0, out_init_std^2) (a model scales
  /// a residual branch's output projection down with its depth); biases 0.
  struct options {
    double init_std = 0.02;
    double out_init_std = 0.02;
  };

  parallel_mlp(Comm& tp, std::size_t hidden, std::size_t ffn, std::uint64_t seed,
               std::uint64_t tensor_id, Gemm gemm = {})
      : parallel_mlp(tp, hidden, ffn, seed, tensor_id, options{}, gemm) {}
  parallel_mlp(Comm& tp, std::size_t hidden, std::size_t ffn, std::uint64_t seed,
               std::uint64_t tensor_id, options opt, Gemm gemm = {})
      : tp_(&tp),
        hidden_(hidden),
        gemm_(gemm),
        fc1_(tp, hidden, ffn, seed, tensor_id, {.init_std = opt.init_std}, gemm),
        fc2_(tp, ffn, hidden, seed, tensor_id + 1, {.init_std = opt.out_init_std}, gemm) {}

  void forward(matrix_view<const T> x, matrix_view<T> y) {
    if (x.cols() != hidden_)
      ::weft::detail::shape_error("parallel_mlp::forward", "x", x.rows(), x.cols(), x.rows(),
                                  hidden_);
    expect_shape("parallel_mlp::forward", "y", y, x.rows(), hidden_); // before fc1 keeps anything
    const std::size_t tokens =
        SP::enabled ? x.rows() * static_cast<std::size_t>(tp_->size()) : x.rows();
    detail::resize(gemm_, h_, tokens, fc1_.out_local());
    detail::resize(gemm_, a_, tokens, fc1_.out_local());
    fc1_.forward(x, h_.view());
    gelu_forward<Gemm, T>(gemm_, h_.view(), a_.view());
    fc2_.forward(a_.view(), y);
  }

  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    detail::resize(gemm_, da_, h_.rows(), h_.cols());
    fc2_.backward(dy, da_.view());
    gelu_backward<Gemm, T>(gemm_, h_.view(), da_.view(), da_.view());
    fc1_.backward(da_.view(), dx);
  }

  /// fc1.weight, fc1.bias, fc2.weight, fc2.bias.
  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    for (auto& p : fc1_.parameters()) {
      p.name = "fc1." + p.name;
      ps.push_back(std::move(p));
    }
    for (auto& p : fc2_.parameters()) {
      p.name = "fc2." + p.name;
      ps.push_back(std::move(p));
    }
    return ps;
  }
  void zero_grad() {
    fc1_.zero_grad();
    fc2_.zero_grad();
  }

  /// Bytes held from forward for backward (both layers' inputs, fc1's output, scratch); release()
  /// frees them.
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return fc1_.saved_bytes() + fc2_.saved_bytes() +
           (h_.size() + a_.size() + da_.size()) * sizeof(T);
  }
  void release() {
    fc1_.release();
    fc2_.release();
    h_ = {};
    a_ = {};
    da_ = {};
  }

  /// What backward needs from forward, moved out and back (see linear.hpp).
  struct activations {
    typename column_type::activations fc1;
    typename row_type::activations fc2;
    matrix<T, space> h;
    [[nodiscard]] std::size_t bytes() const noexcept {
      return fc1.bytes() + fc2.bytes() + h.size() * sizeof(T);
    }
  };
  [[nodiscard]] activations stash() { return {fc1_.stash(), fc2_.stash(), std::exchange(h_, {})}; }
  void restore(activations a) {
    fc1_.restore(std::move(a.fc1));
    fc2_.restore(std::move(a.fc2));
    h_ = std::move(a.h);
  }

  [[nodiscard]] column_type& fc1() noexcept { return fc1_; }
  [[nodiscard]] row_type& fc2() noexcept { return fc2_; }

private:
  Comm* tp_;
  std::size_t hidden_;
  Gemm gemm_;
  column_type fc1_;
  row_type fc2_;
  matrix<T, space> h_, a_,
      da_; // fc1's output (kept for GELU's backward), GELU's output, its gradient
};

} // namespace weft::layer
