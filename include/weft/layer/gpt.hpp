#pragma once
// The GPT-2 / Megatron GPT model over a tensor-parallel group, as a weft model (model.hpp):
//
//   token embedding (vocab-parallel) + learned position embedding (replicated over TP)
//     -> `layers` pre-LayerNorm transformer blocks (attention and tanh-GELU MLP, with biases)
//     -> final LayerNorm -> output layer (column-parallel, no bias; tied to the token table or not)
//     -> vocab-parallel cross entropy
//
//   weft::layer::gpt<float, weft::local::communicator> model(
//       tp, {.vocab = 1000, .hidden = 256, .heads = 8, .seq = 64, .layers = 4}, seed);
//   double loss = model.forward(ids, targets);   // ids, targets: batch * seq tokens, sequence
//                                                // after sequence
//   model.backward();                             // gradients accumulate until zero_grad()
//
// weft::strategy<..., weft::layer::gpt_model> trains the same model over TP x PP x DP.
// Initialisation as GPT-2 and Megatron: every weight N(0, init_std^2), the two projections that
// end a residual branch (attention output, MLP fc2) N(0, init_std^2 / (2 layers)); biases 0,
// norms 1 and 0. Weight decay: the linears' matrices and, unless decay_embeddings is false, the
// two embedding tables; never biases or norms. Tensor ids (init.hpp): token table 0, block l
// 1 + 4 l .. 4 + 4 l, output layer 1 + 4 layers (the token table's when tied), positions
// 2 + 4 layers: one seed makes the same model at every TP size.
//
// With a device GEMM policy (cublas on the communicator's stream) every layer runs in device
// memory on that stream; ids and targets stay host spans, and forward waits for the loss.
#include <weft/comm/communicator.hpp>
#include <weft/layer/block.hpp>
#include <weft/layer/cblas.hpp>
#include <weft/layer/embedding.hpp>
#include <weft/layer/layer_norm.hpp>
#include <weft/layer/lm_head.hpp>
#include <weft/layer/model.hpp>
#include <weft/layer/policy.hpp>
#include <weft/layer/position_embedding.hpp>
#include <weft/layer/recompute.hpp>
#include <weft/layer/weights.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weft::layer {

struct gpt_config {
  std::size_t vocab = 0;
  std::size_t hidden = 0;
  std::size_t heads = 0;
  std::size_t ffn = 0; // 0: 4 * hidden
  std::size_t seq = 0; // also the number of learned positions
  std::size_t layers = 0;
  bool tie_embeddings = false; // the output layer is the token table
  double init_std = 0.02;
  double norm_eps = 1e-5;
  bool decay_embeddings = true; // Megatron's default; nanoGPT exempts them
  std::int32_t ignore_index = -100;
};
using gpt_shape = gpt_config;

namespace detail {

[[nodiscard]] inline double residual_init_std(double init_std, std::size_t layers) {
  return init_std / std::sqrt(2.0 * static_cast<double>(layers));
}

} // namespace detail

/// Token and position embeddings, summed: "wte." and "wpe." parameters.
template <class T, communicator Comm, class Gemm, class SP>
class gpt_embedding {
public:
  static constexpr std::uint64_t token_tensor_id = 0;

  gpt_embedding(Comm& tp, const gpt_config& c, std::uint64_t seed, Gemm gemm = {})
      : tp_(&tp),
        decay_(c.decay_embeddings),
        tokens_(tp, c.vocab, c.hidden, seed, token_tensor_id, c.init_std, gemm),
        positions_(c.seq, c.hidden, seed, 2 + 4 * static_cast<std::uint64_t>(c.layers), c.init_std,
                   gemm) {}

  void forward(std::span<const std::int32_t> ids, matrix_view<T> y) {
    tokens_.forward(ids, y);
    positions_.forward(y, SP::enabled ? y.rows() * static_cast<std::size_t>(tp_->rank()) : 0);
  }
  void backward(matrix_view<const T> dy) {
    positions_.backward(dy);
    tokens_.backward(dy);
  }

  [[nodiscard]] std::vector<parameter<T>> parameters() {
    std::vector<parameter<T>> ps;
    append_parameters(ps, "wte.", tokens_.parameters());
    append_parameters(ps, "wpe.", positions_.parameters());
    for (auto& p : ps)
      p.decay = decay_;
    return ps;
  }
  void zero_grad() {
    tokens_.zero_grad();
    positions_.zero_grad();
  }
  [[nodiscard]] parameter<T> tied_weight() { return tokens_.parameters()[0]; }

  struct activations {
    typename vocab_parallel_embedding<T, Comm, SP, Gemm>::activations tokens;
    typename position_embedding<T, SP, Gemm>::activations positions;
    [[nodiscard]] std::size_t bytes() const noexcept { return tokens.bytes() + positions.bytes(); }
  };
  [[nodiscard]] activations stash() { return {tokens_.stash(), positions_.stash()}; }
  void restore(activations a) {
    tokens_.restore(std::move(a.tokens));
    positions_.restore(std::move(a.positions));
  }

private:
  Comm* tp_;
  bool decay_;
  vocab_parallel_embedding<T, Comm, SP, Gemm> tokens_;
  position_embedding<T, SP, Gemm> positions_;
};

/// Block `layer` of a GPT: tensor ids 1 + 4 layer .. 4 + 4 layer.
template <class T, communicator Comm, class Gemm, class SP, class Recompute>
class gpt_block : public transformer_block<T, Comm, Gemm, SP, Recompute> {
public:
  gpt_block(Comm& tp, const gpt_config& c, std::size_t layer, std::uint64_t seed, Gemm gemm = {})
      : transformer_block<T, Comm, Gemm, SP, Recompute>(
            tp, block_shape{c.hidden, c.heads, c.ffn, c.seq}, seed,
            1 + transformer_block<T, Comm, Gemm, SP, Recompute>::tensor_ids * layer,
            block_options{.init_std = c.init_std,
                          .out_init_std = detail::residual_init_std(c.init_std, c.layers),
                          .norm_eps = c.norm_eps},
            gemm) {}
};

/// Final LayerNorm, output layer, loss.
template <class T, communicator Comm, class Gemm, class SP>
class gpt_head : public lm_head<T, Comm, Gemm, SP, layer_norm<T, SP, Gemm>> {
public:
  gpt_head(Comm& tp, const gpt_config& c, std::uint64_t seed, Gemm gemm = {})
      : lm_head<T, Comm, Gemm, SP, layer_norm<T, SP, Gemm>>(
            tp,
            {.hidden = c.hidden,
             .vocab = c.vocab,
             .tensor_id = c.tie_embeddings ? gpt_embedding<T, Comm, Gemm, SP>::token_tensor_id
                                           : 1 + 4 * c.layers,
             .init_std = c.init_std,
             .norm_eps = c.norm_eps,
             .ignore_index = c.ignore_index,
             .output_decay = !c.tie_embeddings || c.decay_embeddings},
            seed, gemm) {}
};

namespace detail {

/// "block12.attention.qkv.weight" -> {12, "attention.qkv.weight"}; not a block: {-1, name}.
[[nodiscard]] inline std::pair<long, std::string> split_block_name(const std::string& name) {
  constexpr std::string_view prefix = "block";
  if (name.rfind(prefix, 0) != 0) return {-1, name};
  const std::size_t dot = name.find('.');
  if (dot == std::string::npos || dot == prefix.size()) return {-1, name};
  long l = 0;
  for (std::size_t i = prefix.size(); i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return {-1, name};
    l = 10 * l + (name[i] - '0');
  }
  return {l, name.substr(dot + 1)};
}

/// A double as text that reads back to the same double.
[[nodiscard]] inline std::string exact(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

[[noreturn]] inline void unknown_parameter(const char* model, const std::string& name) {
  throw error(std::string(model) + ": no stored name for a parameter named '" + name + "'");
}

} // namespace detail

/// The GPT model family (model.hpp).
struct gpt_model {
  using config = gpt_config;
  template <class T, communicator Comm, class Gemm, class SP, class Recompute>
  struct parts {
    using embedding = gpt_embedding<T, Comm, Gemm, SP>;
    using block = gpt_block<T, Comm, Gemm, SP, Recompute>;
    using head = gpt_head<T, Comm, Gemm, SP>;
  };
  static constexpr bool tied(const config& c) noexcept { return c.tie_embeddings; }

  /// Hugging Face's GPT2LMHeadModel names (weights.hpp). Its Conv1D layers (c_attn, c_proj,
  /// c_fc) hold in x out, so weft's out x in matrices are stored transposed, and c_attn's outputs
  /// are [q of every head | k | v] where weft's QKV is [q | k | v] head after head. The tied
  /// output layer is the token table (lm_head.weight is not written).
  static stored_tensor stored(const config& c, const std::string& name) {
    const std::string t = "transformer.";
    if (name == "embedding.wte.weight") return {t + "wte.weight"};
    if (name == "embedding.wpe.weight") return {t + "wpe.weight"};
    if (name == "head.norm.gamma") return {t + "ln_f.weight"};
    if (name == "head.norm.beta") return {t + "ln_f.bias"};
    if (name == "head.output.weight") {
      return c.tie_embeddings ? stored_tensor{t + "wte.weight", false, {}, false}
                              : stored_tensor{"lm_head.weight"};
    }
    const auto [l, part] = detail::split_block_name(name);
    if (l < 0) detail::unknown_parameter("gpt_model", name);
    const std::string h = t + "h." + std::to_string(l) + ".";
    const std::size_t d = c.hidden / c.heads, hidden = c.hidden;
    const auto qkv = [d, hidden](std::size_t r) {
      return (r % (3 * d)) / d * hidden + r / (3 * d) * d + r % d;
    };
    if (part == "ln1.gamma") return {h + "ln_1.weight"};
    if (part == "ln1.beta") return {h + "ln_1.bias"};
    if (part == "ln2.gamma") return {h + "ln_2.weight"};
    if (part == "ln2.beta") return {h + "ln_2.bias"};
    if (part == "attention.qkv.weight") return {h + "attn.c_attn.weight", true, qkv};
    if (part == "attention.qkv.bias") return {h + "attn.c_attn.bias", false, qkv};
    if (part == "attention.out.weight") return {h + "attn.c_proj.weight", true};
    if (part == "attention.out.bias") return {h + "attn.c_proj.bias"};
    if (part == "mlp.fc1.weight") return {h + "mlp.c_fc.weight", true};
    if (part == "mlp.fc1.bias") return {h + "mlp.c_fc.bias"};
    if (part == "mlp.fc2.weight") return {h + "mlp.c_proj.weight", true};
    if (part == "mlp.fc2.bias") return {h + "mlp.c_proj.bias"};
    detail::unknown_parameter("gpt_model", name);
  }

  /// What decides how the tensors read: the head count orders the fused QKV (weights.hpp).
  static std::map<std::string, std::string> describe(const config& c) {
    return {{"model", "gpt"},
            {"heads", std::to_string(c.heads)},
            {"norm_eps", detail::exact(c.norm_eps)},
            {"tie_embeddings", c.tie_embeddings ? "true" : "false"}};
  }
  /// Hugging Face's GPT-2 files may carry each block's causal mask (attn.bias, attn.masked_bias).
  static bool buffer(std::string_view name) {
    const auto ends = [&](std::string_view tail) {
      return name.size() >= tail.size() && name.substr(name.size() - tail.size()) == tail;
    };
    return ends(".attn.bias") || ends(".attn.masked_bias");
  }
};

template <class T, communicator Comm, class Gemm = cblas, class SP = no_sequence_parallel,
          recompute::policy Recompute = recompute::none>
using gpt = sequential<gpt_model, T, Comm, Gemm, SP, Recompute>;

} // namespace weft::layer
