#pragma once
// A pre-norm transformer block over a tensor-parallel group:
//
//   h = x + attention(norm_1(x))
//   y = h + mlp(norm_2(h))
//
// basic_transformer_block takes the norm and the MLP as types (GPT: LayerNorm and the GELU MLP,
// transformer_block; Llama: RMSNorm and SwiGLU, llama.hpp); the attention's options say whether
// keys and values are grouped, whether projections have biases and whether q and k rotate.
//
// Communication per block, forward and backward (tp > 1; with `full` recompute the backward runs
// the forward's again first):
//   no_sequence_parallel: forward 2 all-reduces (attention out, MLP out), backward 2 (their inputs)
//   sequence_parallel:    forward 2 all-gathers + 2 reduce-scatters, backward the same;
//                         the LayerNorm and bias gradients are partial
//                         (reduce_sequence_parallel_grads)
//
// With a device GEMM policy (cublas on the communicator's stream) the whole block, its layer
// norms and residual adds included, runs in device memory on that stream (exec.hpp).
#include <weft/comm/communicator.hpp>
#include <weft/layer/attention.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/exec.hpp>
#include <weft/layer/layer_norm.hpp>
#include <weft/layer/linear.hpp>
#include <weft/layer/matrix.hpp>
#include <weft/layer/mlp.hpp>
#include <weft/layer/parameter.hpp>
#include <weft/layer/policy.hpp>
#include <weft/layer/recompute.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace weft::layer {

struct block_shape {
  std::size_t hidden = 0;
  std::size_t heads = 0;
  std::size_t ffn = 0; // 0: 4 * hidden
  std::size_t seq = 0;
};

/// Initialisation and norms: the projections into the block N(0, init_std^2), the two that end a
/// residual branch (attention output, the MLP's last) N(0, out_init_std^2); the norms' epsilon.
/// The attention's grouped keys and values, biases and rotary positions (attention.hpp); the MLP's
/// first tensor id is the block's plus mlp_tensor_offset (the attention's come first).
struct block_options {
  double init_std = 0.02;
  double out_init_std = 0.02;
  double norm_eps = 1e-5;
  std::size_t kv_heads = 0; // 0: as many as heads
  bool attention_bias = true;
  double rope_theta = 0; // 0: no rotary embedding
  std::uint64_t mlp_tensor_offset = 2;
};

/// The block with its norm and MLP as types: Norm(hidden, eps, gemm) as layer_norm or rms_norm,
/// Mlp(tp, hidden, ffn, seed, tensor_id, {.init_std, .out_init_std}, gemm) as parallel_mlp or
/// parallel_swiglu_mlp.
template <class T, communicator Comm, class Gemm, class SP, recompute::policy Recompute, class Norm,
          class Mlp>
class basic_transformer_block {
public:
  using space = space_of<Gemm>;
  using norm_type = Norm;
  using mlp_type = Mlp;
  using attention_type = parallel_attention<T, Comm, Gemm, SP>;

  basic_transformer_block(Comm& tp, block_shape shape, std::uint64_t seed, std::uint64_t tensor_id,
                          block_options opt, Gemm gemm = {})
      : hidden_(shape.hidden),
        gemm_(gemm),
        ln1_(shape.hidden, opt.norm_eps, gemm),
        attn_(tp, shape.hidden, shape.heads, shape.seq, seed, tensor_id,
              attention_options{.kv_heads = opt.kv_heads,
                                .bias = opt.attention_bias,
                                .rope_theta = opt.rope_theta,
                                .init_std = opt.init_std,
                                .out_init_std = opt.out_init_std},
              gemm),
        ln2_(shape.hidden, opt.norm_eps, gemm),
        mlp_(tp, shape.hidden, shape.ffn == 0 ? 4 * shape.hidden : shape.ffn, seed,
             tensor_id + opt.mlp_tensor_offset,
             {.init_std = opt.init_std, .out_init_std = opt.out_init_std}, gemm) {
    attn_.keep_probabilities(!std::is_same_v<Recompute, recompute::selective>);
  }

  /// x, y: tokens x hidden (sequence_parallel: this rank's rows).
  void forward(matrix_view<const T> x, matrix_view<T> y) {
    expect_shape("transformer_block::forward", "y", y, x.rows(), hidden_);
    if (x.cols() != hidden_) expect_shape("transformer_block::forward", "x", x, x.rows(), hidden_);
    if constexpr (std::is_same_v<Recompute, recompute::full>) {
      detail::assign(gemm_, input_, x);
      run_forward(detail::cview(input_.view()), y);
      drop_activations();
    } else {
      run_forward(x, y);
    }
  }

  /// dy: like y; dx: like x.
  void backward(matrix_view<const T> dy, matrix_view<T> dx) {
    expect_shape("transformer_block::backward", "dx", dx, dy.rows(), hidden_);
    if constexpr (std::is_same_v<Recompute, recompute::full>) {
      detail::resize(gemm_, scratch_, input_.rows(), hidden_);
      run_forward(detail::cview(input_.view()), scratch_.view());
    }
    const std::size_t rows = dy.rows();
    detail::resize(gemm_, t1_, rows, hidden_);
    detail::resize(gemm_, t2_, rows, hidden_);
    mlp_.backward(dy, t1_.view());                        // d(mlp input)
    ln2_.backward(detail::cview(t1_.view()), t2_.view()); // through the second norm
    residual(t2_.view(), dy);                             // dh: the residual adds dy
    attn_.backward(detail::cview(t2_.view()), t1_.view());
    ln1_.backward(detail::cview(t1_.view()), dx);
    residual(dx, detail::cview(t2_.view()));
    if constexpr (std::is_same_v<Recompute, recompute::full>) {
      // What the recompute rebuilt is this backward's alone: kept, every block of a stage would
      // hold a whole microbatch's activations until its next forward.
      drop_activations();
      input_ = {};
    }
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    append(ps, "ln1.", ln1_.parameters());
    append(ps, "attention.", attn_.parameters());
    append(ps, "ln2.", ln2_.parameters());
    append(ps, "mlp.", mlp_.parameters());
    return ps;
  }
  void zero_grad() {
    ln1_.zero_grad();
    attn_.zero_grad();
    ln2_.zero_grad();
    mlp_.zero_grad();
  }

  /// Bytes held between forward and backward: with `full` recompute only the block's input.
  [[nodiscard]] std::size_t saved_bytes() const noexcept {
    return (input_.size() + a_.size() + h_.size()) * sizeof(T) + ln1_.saved_bytes() +
           attn_.saved_bytes() + ln2_.saved_bytes() + mlp_.saved_bytes();
  }

  /// What backward needs from forward, moved out and back (see linear.hpp): a pipeline stage
  /// keeps one per microbatch in flight, so the recompute policy holds per microbatch too.
  struct activations {
    typename norm_type::activations ln1;
    typename attention_type::activations attn;
    typename norm_type::activations ln2;
    typename mlp_type::activations mlp;
    matrix<T, space> input;
    /// Bytes held (what an allocation account counts as this microbatch's activations).
    [[nodiscard]] std::size_t bytes() const noexcept {
      return ln1.bytes() + attn.bytes() + ln2.bytes() + mlp.bytes() + input.size() * sizeof(T);
    }
  };
  [[nodiscard]] activations stash() {
    return {ln1_.stash(), attn_.stash(), ln2_.stash(), mlp_.stash(), std::exchange(input_, {})};
  }
  void restore(activations a) {
    ln1_.restore(std::move(a.ln1));
    attn_.restore(std::move(a.attn));
    ln2_.restore(std::move(a.ln2));
    mlp_.restore(std::move(a.mlp));
    input_ = std::move(a.input);
  }

  attention_type& attention() noexcept { return attn_; }
  mlp_type& mlp() noexcept { return mlp_; }

private:
  static void append(std::vector<parameter<T>>& to, const char* prefix,
                     std::vector<parameter<T>> ps) {
    for (auto& p : ps) {
      p.name = prefix + p.name;
      to.push_back(std::move(p));
    }
  }

  void residual(matrix_view<T> y, matrix_view<const T> x) {
    detail::for_each_element(gemm_, y.rows(), y.cols(), detail::add_element<T>{y, x});
  }

  void run_forward(matrix_view<const T> x, matrix_view<T> y) {
    const std::size_t rows = x.rows();
    detail::resize(gemm_, a_, rows, hidden_);
    detail::resize(gemm_, h_, rows, hidden_);
    ln1_.forward(x, a_.view());
    attn_.forward(detail::cview(a_.view()), h_.view());
    residual(h_.view(), x);
    ln2_.forward(detail::cview(h_.view()), a_.view());
    mlp_.forward(detail::cview(a_.view()), y);
    residual(y, detail::cview(h_.view()));
  }

  // Full recompute: nothing but the input survives the forward; the forward that backward runs
  // first rebuilds the rest.
  void drop_activations() {
    ln1_.release();
    attn_.release();
    ln2_.release();
    mlp_.release();
    a_ = {};
    h_ = {};
  }

  std::size_t hidden_;
  Gemm gemm_;
  norm_type ln1_;
  attention_type attn_;
  norm_type ln2_;
  mlp_type mlp_;
  matrix<T, space> input_; // full recompute: the block's input
  matrix<T, space> a_, h_; // forward scratch: normed input, the residual stream after attention
  matrix<T, space> t1_, t2_, scratch_;
};

/// The GPT block: LayerNorms and the GELU MLP. Tensor ids tensor_id .. tensor_id + 3 (attention
/// QKV and output, MLP in and out).
template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel,
          recompute::policy Recompute = recompute::none>
class transformer_block
    : public basic_transformer_block<T, Comm, Gemm, SP, Recompute, layer_norm<T, SP, Gemm>,
                                     parallel_mlp<T, Comm, Gemm, SP>> {
  using base = basic_transformer_block<T, Comm, Gemm, SP, Recompute, layer_norm<T, SP, Gemm>,
                                       parallel_mlp<T, Comm, Gemm, SP>>;

public:
  static constexpr std::uint64_t tensor_ids = 4;

  transformer_block(Comm& tp, block_shape shape, std::uint64_t seed, std::uint64_t tensor_id,
                    Gemm gemm = {})
      : base(tp, shape, seed, tensor_id, block_options{}, gemm) {}
  transformer_block(Comm& tp, block_shape shape, std::uint64_t seed, std::uint64_t tensor_id,
                    block_options opt, Gemm gemm = {})
      : base(tp, shape, seed, tensor_id, opt, gemm) {}
};

} // namespace weft::layer
